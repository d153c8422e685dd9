"""Containment: who a job runs as and what it may use (`containment.py`), enforced through
Linux control groups (`cgroups.py`).
"""
