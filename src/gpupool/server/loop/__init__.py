"""The live driver: a loop thread that feeds the core what happened and carries out what it
decided.

Contract. `driver.LiveService` owns two threads' worth of work. The loop thread runs
`step()` once a cycle (sooner when woken): under the one lock (`LoopState.lock`, an
RLock) it runs named stages, each guarded by `_stage`, so an error costs that stage one
cycle and never the loop: reap (`observe.Observer`), sample, progress, services
(`services.Services`), ingest, probe and cloud (`nodes.Nodes`), disk (`gate.LaunchGate`),
cycle (the core, its commands carried out by `carry_out.CarryOut` and `launch.Launcher`),
purge and history. The API thread calls `operations.Operations` (cancel, hold, drain,
services, the learned policy), which take the same lock, and `views.Views`, which take
it with a timeout or not at all. Crash recovery (`recovery.Recovery`) runs once, in the
constructor. The parts are composed, not inherited: the driver builds each with the
shared `state.LoopState` and only the ports it uses (all injected through its
constructor), and no part uses another's private names. `config.py` holds `LiveConfig`
and the fleet it describes (`FleetMap`).

To add a step: write it as a method of the part whose concern it is (or a new part in
its own module, built and wired in `LiveService.__init__`), keep what only it uses to
itself and put what other parts read in `LoopState`, then call it from `step()` through
`self._stage("name", part.method, now)` at its place in the order.
"""
