"""Where jobs run: local processes under a shim (`local.py`, `shim.py`), the nodes of a Ray
cluster (`ray.py` talks to the nodes' launchers, `ray_launcher.py` is the launcher,
`ray_runs.py` keeps each attempt's runs and judges their ends), NVIDIA MPS for shared
cards (`mps.py`); `files.py` is the run directory both local and Ray executors lay out.
The contract every executor keeps is `gpupool.ports.executor.base.Executor`; to add one,
implement it there, judge ends with `classify`, and prove it conforms with a
`TYPE_CHECKING` assignment to `Executor`.
"""
