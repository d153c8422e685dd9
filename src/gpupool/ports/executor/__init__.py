"""The executor port: what runs the jobs the core placed, and tells how each attempt ended.

`base.py` is the contract (`Executor`, with what each call may block on, what it returns
and how errors come back) and the values that cross it (`LaunchSpec`, `Handle`, `Exit`,
`Gang`, `JobUser`, `Limits`, the outcomes and `classify`); `stops.py` is the bookkeeping
every implementation shares (finding a watched attempt, recording a stop request);
`fake.py` is `FakeExecutor`, for tests. Real executors live with the server
(`gpupool.server.executors`: local processes, Ray) and the simulator's `SimulatedFleet`
implements the same protocol over its world. To add an executor: implement every member
of `Executor`, judge ends with `classify`, and keep a `TYPE_CHECKING` assignment to
`Executor` beside it so mypy proves it conforms.
"""
