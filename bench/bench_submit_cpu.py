"""CPU per POST /v1/jobs in process (ASGI transport: no sockets, no client on the other
core): the API and store path alone, one submission at a time on SQLite. Runs this tree or,
with PYTHONPATH at an older checkout's src/, one from before the folder layout (its module
names). Prints one JSON line. `python bench/bench_submit_cpu.py [N]` (default 2,000)."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

try:
    from gpupool.ports.clock.fake import ManualClock
    from gpupool.ports.executor.fake import FakeExecutor
    from gpupool.ports.telemetry.fake import FakeTelemetry
    from gpupool.server.api.app import create_app
    from gpupool.server.loop.config import LiveConfig
    from gpupool.server.loop.driver import LiveService
    from gpupool.server.store import Store, database_url

    SIDE = "layout"
except ImportError:  # a tree from before the folder layout
    from gpupool.service.api import create_app  # type: ignore[no-redef]
    from gpupool.service.clock import ManualClock  # type: ignore[no-redef]
    from gpupool.service.executor import FakeExecutor  # type: ignore[no-redef]
    from gpupool.service.live import LiveConfig, LiveService  # type: ignore[no-redef]
    from gpupool.service.store import Store, database_url  # type: ignore[no-redef]
    from gpupool.service.telemetry import FakeTelemetry  # type: ignore[no-redef]

    SIDE = "before"

WARMUP = 200
BODY = {"command": ["python", "train.py"], "team": "nlp"}


async def measure(n: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(database_url(None, Path(tmp) / "db"))
        store.migrate()
        config = LiveConfig(state_dir=Path(tmp) / "state", sample_s=0.0, host="h")
        service = LiveService(
            config, store, FakeExecutor(), FakeTelemetry("2xA100-80GB"), ManualClock(1000.0)
        )
        app = create_app(service, store, auth=False)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gpupool") as client:
            for _ in range(WARMUP):
                await client.post("/v1/jobs", json=BODY)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(n):
                answer = await client.post("/v1/jobs", json=BODY)
                assert answer.status_code == 201, answer.text
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "side": SIDE,
        "n": n,
        "cpu_us_per_submit": round(cpu / n * 1e6, 1),
        "wall_us_per_submit": round(wall / n * 1e6, 1),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("n", nargs="?", type=int, default=2_000, help="submissions to time")
    print(json.dumps(asyncio.run(measure(ap.parse_args().n))))
