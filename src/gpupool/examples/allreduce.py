"""A data-parallel job across nodes in plain Python: a socket all-reduce per step.

    python -m gpupool.examples.allreduce --steps N [--step-s S] [--every K] [--dim D]

One process per node (a gang member), with torchrun's variables: MASTER_ADDR and
MASTER_PORT (where rank 0 listens), WORLD_SIZE, RANK. Every member connects to rank 0,
which sums the members' vectors each step and sends the sum back (a star all-reduce, the
shape torch.distributed's gloo backend would take on loopback). Step s reduces a fixed
vector of D elements, member r contributing the elements i with i % WORLD_SIZE == r, so
the reduced vector, and the result, do not depend on how many members there are: a job
resumed on another number of nodes still ends with ``expected_result(N, D)``.

Rank 0 keeps the state (all members hold the same reduced values) and writes it to
$GPUPOOL_CHECKPOINT_DIR every K steps and when SIGTERM arrives; started with
GPUPOOL_RESUME=1 it reads it back and tells the others where to start. A member whose peer
vanishes (closed socket, or nothing within --timeout-s) saves what is consistent (rank 0)
and exits 3, so a broken gang never hangs. Each member first prints
``member rank=R world=W node=NODE ...``; rank 0's last line is
``result=<sum> steps=<N> world=<W> resumed_from=<step>``. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

CHECKPOINT_NAME = "allreduce.json"
PEER_LOST = 3
"""Exit status of a member whose peer vanished mid-step."""


def element(step: int, i: int) -> int:
    """Element i of step `step`'s vector: deterministic, small, never all zero."""
    return (step + 1) * (i + 1) % 97 + 1


def step_value(step: int, reduced: list[int]) -> int:
    """What a step adds to the result: a weighted checksum of the reduced vector, so a
    missing or doubled element (a member counted twice or not at all) changes it."""
    return sum((i + 1) * v for i, v in enumerate(reduced)) * (step + 1)


def expected_result(steps: int, dim: int = 64) -> int:
    """The result of a run of `steps` steps, whatever the number of members or restarts."""
    return sum(step_value(s, [element(s, i) for i in range(dim)]) for s in range(steps))


@dataclass(frozen=True)
class State:
    """What rank 0 saves: the next step and the result so far."""

    steps: int
    dim: int
    step: int
    total: int


def checkpoint_dir() -> Path:
    return Path(os.environ.get("GPUPOOL_CHECKPOINT_DIR") or "checkpoint")


def save(state: State) -> None:
    """Temp file, fsync, rename: a SIGKILL mid-write leaves the previous one whole."""
    directory = checkpoint_dir()
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{CHECKPOINT_NAME}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state.__dict__, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / CHECKPOINT_NAME)


def load() -> State | None:
    try:
        raw = json.loads((checkpoint_dir() / CHECKPOINT_NAME).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return State(int(raw["steps"]), int(raw["dim"]), int(raw["step"]), int(raw["total"]))


class PeerLost(Exception):
    """A member's socket closed or stayed silent past the timeout."""


def send(sock: socket.socket, payload: object) -> None:
    data = json.dumps(payload).encode()
    try:
        sock.sendall(struct.pack("!I", len(data)) + data)
    except OSError as err:
        raise PeerLost(f"send failed: {err}") from err


def recv(sock: socket.socket) -> object:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            try:
                chunk = sock.recv(n - len(buf))
            except TimeoutError as err:
                raise PeerLost("no answer within the timeout") from err
            except OSError as err:
                raise PeerLost(f"receive failed: {err}") from err
            if not chunk:
                raise PeerLost("the peer closed its connection")
            buf += chunk
        return buf

    (size,) = struct.unpack("!I", exactly(4))
    return json.loads(exactly(size))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m gpupool.examples.allreduce",
        description="A socket all-reduce across the members of a gang (gpupool example).",
    )
    p.add_argument("--steps", type=int, required=True, help="how many steps (N >= 0)")
    p.add_argument("--step-s", type=float, default=0.0, help="seconds of work per step")
    p.add_argument("--every", type=int, default=10, help="rank 0 checkpoints every K steps")
    p.add_argument("--dim", type=int, default=64, help="elements of the reduced vector")
    p.add_argument("--timeout-s", type=float, default=30.0, help="how long to wait for a peer")
    args = p.parse_args(argv)
    if args.steps < 0 or args.step_s < 0 or args.every < 1 or args.dim < 1:
        p.error("need --steps >= 0, --step-s >= 0, --every >= 1 and --dim >= 1")
    return args


def _connect(addr: str, port: int, timeout_s: float) -> socket.socket:
    """Rank k > 0: rank 0 may not listen yet; retry until the timeout."""
    until = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=timeout_s)
            sock.settimeout(timeout_s)
            return sock
        except OSError:
            if time.monotonic() >= until:
                raise PeerLost(f"rank 0 at {addr}:{port} did not answer") from None
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "0") or 0)
    stopping = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_sigterm)
    print(
        f"member rank={rank} world={world} node={os.environ.get('GPUPOOL_NODE', '?')} "
        f"local_world={os.environ.get('LOCAL_WORLD_SIZE', '?')} "
        f"visible={os.environ.get('CUDA_VISIBLE_DEVICES', '')} pid={os.getpid()} "
        f"master={addr}:{port}",
        flush=True,
    )
    if rank == 0:
        return _lead(args, world, port, lambda: stopping)
    return _follow(args, rank, world, addr, port, lambda: stopping)


def _lead(args: argparse.Namespace, world: int, port: int, stopping: Callable[[], bool]) -> int:
    """Rank 0: accept the others, decide where to start, reduce each step, checkpoint."""
    state = State(args.steps, args.dim, 0, 0)
    if os.environ.get("GPUPOOL_RESUME") == "1":
        saved = load()
        if saved is not None and (saved.steps, saved.dim) == (args.steps, args.dim):
            state = saved
    resumed_from = state.step
    peers: dict[int, socket.socket] = {}
    if world > 1:
        server = socket.create_server(("", port))
        server.settimeout(args.timeout_s)
        try:
            while len(peers) < world - 1:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    print(f"gang: only {len(peers) + 1} of {world} members came", flush=True)
                    return PEER_LOST
                conn.settimeout(args.timeout_s)
                hello = recv(conn)
                assert isinstance(hello, dict)
                peers[int(hello["rank"])] = conn
        except PeerLost as err:
            print(f"gang: a member left while joining: {err}", flush=True)
            return PEER_LOST
        finally:
            server.close()
    try:
        for conn in peers.values():
            send(conn, {"start": state.step})
        while state.step < args.steps:
            if stopping():
                save(state)
                print(f"SIGTERM: checkpoint saved at step={state.step}", flush=True)
                _tell(peers, {"stop": True})
                return 0
            s = state.step
            reduced = [element(s, i) if i % world == 0 else 0 for i in range(args.dim)]
            for _, conn in sorted(peers.items()):
                part = recv(conn)
                assert isinstance(part, list)
                reduced = [a + int(b) for a, b in zip(reduced, part, strict=True)]
            for conn in peers.values():
                send(conn, {"reduced": reduced})
            time.sleep(args.step_s)
            state = State(state.steps, state.dim, s + 1, state.total + step_value(s, reduced))
            if state.step % args.every == 0:
                save(state)
                print(f"step={state.step} checkpoint", flush=True)
    except PeerLost as err:
        save(state)  # consistent up to the last whole step
        if stopping():
            print(f"SIGTERM: checkpoint saved at step={state.step} ({err})", flush=True)
            return 0
        print(f"gang: a member vanished at step={state.step}: {err}", flush=True)
        return PEER_LOST
    save(state)
    _tell(peers, {"stop": True})
    print(
        f"result={state.total} steps={args.steps} world={world} resumed_from={resumed_from}",
        flush=True,
    )
    return 0


def _tell(peers: dict[int, socket.socket], message: object) -> None:
    for conn in peers.values():
        with contextlib.suppress(PeerLost):
            send(conn, message)
        conn.close()


def _follow(
    args: argparse.Namespace,
    rank: int,
    world: int,
    addr: str,
    port: int,
    stopping: Callable[[], bool],
) -> int:
    """Rank k > 0: send this member's part of each step's vector, take the sum back."""
    try:
        sock = _connect(addr, port, args.timeout_s)
        send(sock, {"rank": rank})
        start = recv(sock)
        assert isinstance(start, dict)
        step = int(start["start"])
        while step < args.steps:
            if stopping():
                print(f"SIGTERM: rank {rank} leaves at step={step}", flush=True)
                return 0
            part = [element(step, i) if i % world == rank else 0 for i in range(args.dim)]
            send(sock, part)
            answer = recv(sock)
            assert isinstance(answer, dict)
            if answer.get("stop"):
                print(f"rank {rank}: rank 0 stopped the gang at step={step}", flush=True)
                return 0
            step += 1
        final = recv(sock)  # rank 0 says the run is over
        print(f"done rank={rank} steps={step} {json.dumps(final)}", flush=True)
        return 0
    except PeerLost as err:
        if stopping():
            print(f"SIGTERM: rank {rank} leaves ({err})", flush=True)
            return 0
        print(f"gang: rank 0 vanished: {err}", flush=True)
        return PEER_LOST


if __name__ == "__main__":
    sys.exit(main())
