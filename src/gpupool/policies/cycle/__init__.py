"""Cycle policies: once per scheduling cycle, look at the whole queue and return a plan
(`Start`, `Preempt`, `Claim`: `policies/contract.py`) that the core validates before it
applies it.

* fifo            strict submit order; the head blocks the queue (`fifo.py`).
* backfill        fifo with EASY backfill around the blocked head (`backfill.py`, `easy.py`).
* priority-quota  online first, then guarantees, then fair-share borrowing, with preemption
                  and EASY backfill (`priority_quota.py`).
* las, gittins, learned  priority-quota's rules with another order inside each priority
                  class (`ordered.py`).

Add one: a module with a `CyclePolicy` subclass whose `plan(view)` returns commands, a
`register("cycle", NAME)` call, and an import in `policies/__init__.py`.
"""
