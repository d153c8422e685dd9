"""gpupool's command line: every command, with parsing, acting and printing kept apart.

`main.py` parses; `verbs.py` names the module that builds and runs each command (loaded only
when that command runs, so `--help` stays fast). The commands that talk to a server are
assembled by `remote.py` from `jobs.py`, `nodes.py`, `tokens.py`, `learn.py` and
`services.py`; they read their flags with `parse.py` (values) and `flags.py` (shared
flags), print with `output.emit()` (--json or text) and `render.py` (tables and blocks).
`simulate`, `plan`, `report`, `loadgen` and `serve` each have their own module. To add a
command: its parser and run function in one module, its name, module and help line in
`verbs.py`; no module here is imported by the server or the simulator.
"""
