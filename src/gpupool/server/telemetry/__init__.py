"""What the live server measures: GPUs through NVML (`nvml.py`) or Ray (`ray.py`), the
monitoring rule over their samples (`monitor.py`), the services' replicas
(`replica_load.py`), the history it keeps (`history.py`), and the Prometheus exposition
under the DCGM exporter's names (`prometheus.py`). The contract of a GPU source is
`gpupool.ports.telemetry.base.Telemetry` (the fake fleet is `gpupool.ports.telemetry.fake`);
to add a source, implement it there. No module here imports the live driver: what the
history and /metrics read of it are Protocols of their own (`LiveSource`,
`MetricsSource`) that `LiveService` and its `Views` satisfy.
"""
