"""Trace replay and fill experiments: jobs from public traces, through the core's policies.

Contract: run.py replays a trace under a queue policy (FIFO, SJF, SRTF; the ordered ones,
backfill, las, gittins and learned, in ordered.py) and returns a ReplayResult (common.py)
with its decision log and metrics (metrics.py); fill.py places tasks that never leave (the
FGD paper's method). To add a queue policy, register it in gpupool.policies; a policy that
needs its own loop gets a module here that imports common.py, never run.py.
"""
