"""Placement policies: where a job goes inside its pool, by scoring nodes.

Each module registers one policy by name (`policies/registry.py`); `base.py` holds the
shared shape of a node-scoring policy. Add one: a module with a `ScoringPolicy` subclass and
a `register(...)` call, imported from `policies/__init__.py`.
"""
