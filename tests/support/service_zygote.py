"""A scheduler process that can be killed and restarted many times a second.

Importing gpupool's service takes seconds; a crash test that restarts the scheduler 20
times would spend them all starting. This process imports once, then on each `start`
line on stdin forks a child that runs the real LiveService (the database at DB_URL, the
local executor with cgroups and team users when root, a fake fleet of 2 GPUs) from
scratch, recovery included, and prints the child's pid. The test kills that child with
SIGKILL, as a crash would. `quit` ends it.

With RAY_ADDRESS, the child joins that Ray cluster instead (ray.init after the fork: a
connection is never shared) and runs the LiveService of `gpupool serve --ray`: the fleet
is the cluster's gpupool nodes, the Ray executor contains jobs on them (when ISOLATION is
on), the telemetry is each node's.

Usage: python tests/support/service_zygote.py STATE_DIR DB_URL ISOLATION(on|off) [RAY_ADDRESS]
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from pathlib import Path

from gpupool.ports.clock.base import SystemClock
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.executors.local import LocalExecutor
from gpupool.server.isolation.containment import Isolation, IsolationConfig, sqlite_file
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import Store


def serve(state: Path, url: str, isolation_on: bool, ray_address: str = "") -> None:
    """The child: recover, then run cycles until killed."""
    store = Store(url)
    store.migrate()
    isolation = Isolation(IsolationConfig(enabled=isolation_on))
    isolation.secure_state(state, state / "jobs", sqlite_file(url))
    # Lost attempts may pile up on one job when kills keep landing in its launch window
    # on a slow host; what the test counts is double runs, not the lost-retry limit.
    config = LiveConfig(
        state_dir=state,
        scheduling=dataclasses.replace(LIVE_DEFAULTS, cycle_s=0.05),
        lost_retries=1000,
    )
    if ray_address:
        live = _ray_live(config, store, isolation, ray_address)
    else:
        live = LiveService(
            config,
            store,
            LocalExecutor(isolation=isolation),
            FakeTelemetry("2xA100-80GB"),
            SystemClock(),
        )
    while True:
        live.step()
        time.sleep(0.02)


def _ray_live(config: LiveConfig, store: Store, isolation: Isolation, address: str) -> LiveService:
    import ray
    from gpupool.server.executors.ray import RayExecutor
    from gpupool.server.executors.ray_launcher import AgentSettings
    from gpupool.server.loop.driver import ray_service

    ray.init(address=address, namespace="gpupool-zygote", log_to_driver=False)
    agent = AgentSettings(contain=isolation.enabled)
    executor = RayExecutor(
        namespace="gpupool-zygote",
        agent=agent,
        isolation=isolation if isolation.enabled else None,
    )
    return ray_service(config, store, SystemClock(), executor=executor)


def main() -> None:
    state, url, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    ray_address = sys.argv[4] if len(sys.argv) > 4 else ""
    if ray_address:
        import ray  # noqa: F401 - imported once here, joined after each fork
    first = Store(url)
    first.migrate()
    first.close()  # no connection may be shared with the children
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            return
        pid = os.fork()
        if pid == 0:
            try:
                serve(state, url, mode == "on", ray_address)
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
            os._exit(1)
        print(pid, flush=True)
        while True:  # reap what the test killed
            try:
                done, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if done == 0:
                break


if __name__ == "__main__":
    main()
