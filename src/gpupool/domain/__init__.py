"""The scheduling domain: frozen values with units in their names, the job lifecycle as one
transition table, the cluster state with its free-capacity indexes, quotas and the engine
that validates and applies a placement. Everything else builds on these; they import only
`gpupool.errors`.
"""
