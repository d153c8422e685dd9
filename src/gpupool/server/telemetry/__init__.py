"""What the live server measures: GPUs through NVML (`nvml.py`) or Ray (`ray.py`), the
services' replicas (`replica_load.py`), the history it keeps (`history.py`), and the
Prometheus exposition (`prometheus.py`).
"""
