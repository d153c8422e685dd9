"""The node agent: what starts, contains, watches, signals and finds a job's processes on
one machine. `gpupool serve` uses it in process for its own machine (LocalExecutor); on
Ray each node's warm launcher uses the same code (`start_attempt`, `AttemptProcesses`), so
a job is started and contained one way everywhere. `join` makes a machine a node of a
Ray cluster (`gpupool node join`)."""
