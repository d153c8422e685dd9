"""Module names of the layout before 0.2, kept for one release so that what users run keeps
working: `python -m gpupool.service.cloud_node` in sites files. New code imports
`gpupool.server`; this package is removed in the next release.
"""
