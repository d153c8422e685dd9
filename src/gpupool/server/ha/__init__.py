"""High availability: one controller per database (`lease.py`) and a standby that waits for
it (`standby.py`).
"""
