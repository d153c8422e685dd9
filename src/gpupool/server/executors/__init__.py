"""Where jobs run: local processes under a shim (`local.py`), the nodes of a Ray cluster
(`ray.py`, `ray_launcher.py`), NVIDIA MPS for shared cards (`mps.py`). The contract is
`gpupool.ports.executor`.
"""
