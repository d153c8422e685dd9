"""The telemetry port: what the drivers know about their GPUs and how they cap them.

`base.py` is the contract (`Telemetry`: a fixed inventory, samples in which problems are
readings, commands that fail softly) and the values that cross it (`GpuInfo`, `GpuSample`,
`ApplyResult`, `lost_sample`); `fake.py` is `FakeTelemetry`, a fleet named on the command
line. NVML and Ray readers live with the server (`gpupool.server.telemetry`); the
simulator's `SimulatedFleet` implements the same protocol over its world. To add a
source: implement every member of `Telemetry`, report an unreadable GPU with
`lost_sample` rather than an exception, and return an `ApplyResult` for every command.
"""
