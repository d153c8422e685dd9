"""The logs of runs on nodes that keep them in their own node directory (joined with
`gpupool node join`): the scheduler copies what each node has beyond its own copy, about
every second while the run goes on and once more when it ends, so `gpupool logs` reads one
file across attempts and nodes, and a node that dies takes at most its last second of
output with it. What was copied is noted beside the copy, so a restarted scheduler neither
loses nor repeats a byte."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpupool.server.executors.files import STDERR_LOG, STDOUT_LOG, write_json
from gpupool.server.executors.ray_runs import RayRun, streamed_file, streams

LOGS = (STDOUT_LOG, STDERR_LOG)


def offsets(raw: Any) -> dict[str, int]:
    """Log sizes as a node or a note gave them ({} when missing or malformed)."""
    if not isinstance(raw, dict):
        return {}
    return {str(k): int(v) for k, v in raw.items() if isinstance(v, int)}


def _append(path: Path, data: bytes) -> bool:
    """Append all of `data` to `path`, or (the server's disk is full or failing) nothing:
    a partial write is cut back, so the copy never holds half a chunk."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab", buffering=0) as f:
            start = f.tell()
            left = memoryview(data)
            try:
                while left:
                    wrote = f.write(left) or 0
                    if wrote <= 0:
                        raise OSError("no progress writing the log copy")
                    left = left[wrote:]
            except OSError:
                with contextlib.suppress(OSError):
                    f.truncate(start)
                return False
    except OSError:
        return False
    return True


class RunLogs:
    """Copies runs' logs from their nodes' launchers (`read_logs`), over `ray_api`."""

    STREAM_S = 1.0
    """The logs of running jobs on joined nodes are copied at most this often."""

    def __init__(self, ray_api: Any, timeout_s: float) -> None:
        self._ray = ray_api
        self._timeout = timeout_s
        self._at = 0.0

    def due(self) -> bool:
        """Time for the next copy of the running runs' logs (and it is now taken)."""
        now = time.monotonic()
        if now - self._at < self.STREAM_S:
            return False
        self._at = now
        return True

    def save(self, run: RayRun, attempt: int) -> None:
        with contextlib.suppress(OSError):
            run.log_dir.mkdir(parents=True, exist_ok=True)
            write_json(streamed_file(run, attempt), run.streamed)

    def copy(self, runs: Sequence[tuple[RayRun, int]], limit: int = 1 << 20) -> None:
        """Copy what each (run, attempt)'s node has of its logs beyond what was copied:
        one call per node, all in flight at once; a node that does not answer is asked
        again next time."""
        by_node: dict[str, list[tuple[RayRun, int]]] = {}
        for run, attempt in runs:
            if streams(run) and not run.vanished:
                by_node.setdefault(run.node, []).append((run, attempt))
        asks = {}
        for node, items in by_node.items():
            reqs = [(r.node_log_dir, n, r.streamed.get(n, 0)) for r, _ in items for n in LOGS]
            with contextlib.suppress(Exception):
                asks[node] = items[0][0].launcher.read_logs.remote(reqs, limit)
        deadline = time.monotonic() + self._timeout
        for node, ref in asks.items():
            try:
                chunks = self._ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01))
            except Exception:
                continue
            pairs = [(run, a, name) for run, a in by_node[node] for name in LOGS]
            grown: dict[int, tuple[RayRun, int]] = {}
            for (run, attempt, name), data in zip(pairs, chunks, strict=True):
                if not data or not _append(run.log_dir / name, data):
                    continue  # nothing new, or no room here: copied again next time
                run.streamed[name] = run.streamed.get(name, 0) + len(data)
                grown[id(run)] = (run, attempt)
            for run, attempt in grown.values():
                self.save(run, attempt)

    TAIL_LIMIT = 64 << 20

    def finish(self, run: RayRun, attempt: int, ended: Mapping[str, Any] | None) -> None:
        """Before the attempt is released, copy what the scheduler's copy lacks of the
        run's logs from its node: beyond what was copied while it ran (a joined node), or
        (a node on the server's path) what the sizes its poll reported say is missing,
        nothing on a shared filesystem, where they match; a gang member's go to
        ``rank-<k>/``."""
        if streams(run):
            if not run.vanished:
                self.copy([(run, attempt)], self.TAIL_LIMIT)
            streamed_file(run, attempt).unlink(missing_ok=True)
            return
        sizes = ended.get("log_sizes") if ended is not None else None
        for name in LOGS:
            local = run.log_dir / name
            have = local.stat().st_size if local.is_file() else 0
            if isinstance(sizes, dict) and int(sizes.get(name, 0)) <= have:
                continue
            try:
                data: bytes = self._ray.get(
                    run.launcher.read_log.remote(str(run.log_dir), name, have, self.TAIL_LIMIT),
                    timeout=self._timeout,
                )
            except Exception:  # the node went: what was copied is what there is
                return
            if data:
                _append(local, data)
