"""gpupool's command line: `main.py` parses, `verbs.py` names the module that builds and runs
each command (loaded only when that command runs, so `--help` stays fast).
"""
