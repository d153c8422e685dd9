"""Linux control groups for jobs: every process of a job in one group, limited and killable.

A process group is not enough to track a job: a child that calls setsid() leaves it and
outlives the job, holding its GPUs. A cgroup cannot be left by an unprivileged process,
so "the job's processes" are the members of its cgroup, and the job has ended only when
the group is empty. Two real implementations behind one interface: cgroup v2 (one
unified hierarchy, cgroup.kill) where one with controllers is mounted, else cgroup v1
(one hierarchy per controller: pids, memory, cpu, devices, freezer; freeze then SIGKILL).
`FakeCgroups` keeps membership in memory for tests that cannot be root.

Group names are relative paths ("gpupool/job-12-a1-3f9c"); the same name is used in
every v1 hierarchy.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpupool.ports.executor.base import Limits

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("pids", "memory", "cpu", "devices", "freezer")
V2_CONTROLLERS = ("cpu", "memory", "pids")


@dataclass(frozen=True)
class DeviceRule:
    """One line of a devices.allow list: `c 195:0 rwm`; minor None is any minor."""

    kind: str
    major: int
    minor: int | None
    access: str = "rwm"

    def line(self) -> str:
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.kind} {self.major}:{minor} {self.access}"


BASE_DEVICES: tuple[DeviceRule, ...] = (
    DeviceRule("c", 1, 3),  # /dev/null
    DeviceRule("c", 1, 5),  # /dev/zero
    DeviceRule("c", 1, 7),  # /dev/full
    DeviceRule("c", 1, 8),  # /dev/random
    DeviceRule("c", 1, 9),  # /dev/urandom
    DeviceRule("c", 5, 0),  # /dev/tty
    DeviceRule("c", 5, 1),  # /dev/console
    DeviceRule("c", 5, 2),  # /dev/ptmx
    DeviceRule("c", 136, None),  # /dev/pts/*
)
"""What every job may open: the devices any program expects to exist."""

NVIDIA_SHARED = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""NVIDIA devices every CUDA process needs besides its own /dev/nvidiaN."""


def _char_rule(path: Path) -> DeviceRule | None:
    try:
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return DeviceRule("c", os.major(st.st_rdev), os.minor(st.st_rdev))


def gpu_device_rules(
    gpu_indices: Sequence[int],
    dev_dir: Path = Path("/dev"),
    base: Sequence[DeviceRule] = BASE_DEVICES,
) -> tuple[DeviceRule, ...] | None:
    """The devices a job on `gpu_indices` may open: `base`, the job's own /dev/nvidiaN and
    the shared NVIDIA control devices. None where `dev_dir` has no /dev/nvidia[0-9]* (no
    NVIDIA driver): then nothing is restricted, as there is nothing to protect."""
    gpus = [p for p in dev_dir.glob("nvidia[0-9]*") if p.name[len("nvidia") :].isdigit()]
    if not gpus:
        return None
    rules = list(base)
    for index in sorted(set(gpu_indices)):
        rule = _char_rule(dev_dir / f"nvidia{index}")
        if rule is not None:
            rules.append(rule)
    for name in NVIDIA_SHARED:
        rule = _char_rule(dev_dir / name)
        if rule is not None:
            rules.append(rule)
    return tuple(rules)


class Cgroups(Protocol):
    """What the executor needs from a cgroup hierarchy (names relative to its root)."""

    version: str

    def create(self, name: str, limits: Limits, devices: Sequence[DeviceRule] | None) -> None: ...

    def add(self, name: str, pid: int) -> None: ...

    def pids(self, name: str) -> list[int]: ...

    def signal(self, name: str, sig: int) -> None: ...

    def kill(self, name: str) -> None: ...

    def remove(self, name: str) -> bool: ...

    def prime(self) -> None:
        """Get the kernel ready to move a process in a few ms from now (see CgroupV1.prime);
        nothing moves. Best effort."""
        ...

    def cannot_guarantee(self) -> list[str]: ...


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_pids(path: Path) -> list[int]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return sorted({int(x) for x in text.split()})


def _own_cgroup(controller: str | None) -> str | None:
    """This process's cgroup in the v1 hierarchy of `controller` (None: the v2 one), as
    /proc/self/cgroup says (a path from the hierarchy's root)."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (controller is None and controllers == "") or controller in controllers.split(","):
            return path
    return None


def _stay(hierarchy: Path, own: str | None) -> None:
    """Write this process into the cgroup it is already in: nothing moves, but the
    kernel takes the lock that moves take."""
    if own is None:
        return
    with contextlib.suppress(OSError, ValueError):
        _write(hierarchy / own.lstrip("/") / "cgroup.procs", str(os.getpid()))


def _kill_each(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


class CgroupV1:
    """One directory per job in each mounted v1 controller hierarchy.

    Killing: freeze the job (so nothing forks meanwhile), SIGKILL every member, thaw (a
    frozen process cannot die). Without a freezer hierarchy, kill until empty."""

    version = "v1"

    def __init__(
        self, root: Path = CGROUP_ROOT, controllers: Sequence[str] = V1_CONTROLLERS
    ) -> None:
        self.root = root
        self.hierarchies = {
            c: root / c for c in controllers if (root / c / "cgroup.procs").is_file()
        }
        if not self.hierarchies:
            raise FileNotFoundError(f"no cgroup v1 hierarchy of {list(controllers)} under {root}")
        # Membership is read from one hierarchy; every process is added to all of them.
        first = next(iter(self.hierarchies))
        self._tracking = self.hierarchies.get("pids", self.hierarchies[first])

    def _dirs(self, name: str) -> list[tuple[str, Path]]:
        return [(c, h / name) for c, h in self.hierarchies.items()]

    def create(self, name: str, limits: Limits, devices: Sequence[DeviceRule] | None) -> None:
        for controller, path in self._dirs(name):
            path.mkdir(parents=True, exist_ok=True)
            if controller == "memory" and limits.mem_mib is not None:
                _write(path / "memory.limit_in_bytes", str(limits.mem_mib << 20))
            elif controller == "cpu" and limits.cpu_cores is not None:
                _write(path / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                quota = max(1000, round(limits.cpu_cores * CPU_PERIOD_US))
                _write(path / "cpu.cfs_quota_us", str(quota))
            elif controller == "pids" and limits.pids is not None:
                _write(path / "pids.max", str(limits.pids))
            elif controller == "devices" and devices is not None:
                _write(path / "devices.deny", "a")
                for rule in devices:
                    _write(path / "devices.allow", rule.line())

    def add(self, name: str, pid: int) -> None:
        for _, path in self._dirs(name):
            _write(path / "cgroup.procs", str(pid))

    def prime(self) -> None:
        """The first move of a process after a quiet spell waits for an RCU grace period
        (the kernel's cgroup_threadgroup_rwsem going to its write side: 5 to 15 ms on a
        6.18 host; the moves that follow within about one more grace period cost some
        10 µs). A move of this process into the cgroup it is already in starts that
        wait now, on the caller's thread (run it on a helper), so that a shim moved a few
        ms later finds it over. Forks are not held up by the wait. Errors are ignored: it
        only saves time."""
        controller = "pids" if "pids" in self.hierarchies else next(iter(self.hierarchies))
        _stay(self.hierarchies[controller], _own_cgroup(controller))

    def pids(self, name: str) -> list[int]:
        return _read_pids(self._tracking / name / "cgroup.procs")

    def signal(self, name: str, sig: int) -> None:
        _kill_each(self.pids(name), sig)

    def kill(self, name: str) -> None:
        freezer = self.hierarchies.get("freezer")
        frozen = freezer is not None and (freezer / name / "freezer.state").exists()
        if frozen and freezer is not None:
            state = freezer / name / "freezer.state"
            _write(state, "FROZEN")
            deadline = time.monotonic() + 1.0
            while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
                time.sleep(0.005)
            _kill_each(self.pids(name), signal.SIGKILL)
            _write(state, "THAWED")
            return
        for _ in range(10):  # no freezer: a fork may race each round
            members = self.pids(name)
            if not members:
                return
            _kill_each(members, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self, name: str) -> bool:
        """Remove an empty job group from every hierarchy; False while it has members."""
        done = True
        for _, path in self._dirs(name):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as err:
                if err.errno != errno.EBUSY:
                    raise
                done = False
        return done

    def cannot_guarantee(self) -> list[str]:
        missing = [c for c in V1_CONTROLLERS if c not in self.hierarchies]
        notes = {
            "pids": "process counts are not limited",
            "memory": "memory is not limited",
            "cpu": "CPU time is not limited",
            "devices": "jobs can open every GPU device, not only their own",
            "freezer": "a job forking fast could outrun the kill of its cgroup",
        }
        return [f"cgroup v1 {c} controller not mounted: {notes[c]}" for c in missing]


class CgroupV2:
    """One directory per job in the unified hierarchy; cgroup.kill ends all members."""

    version = "v2"

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        if not (root / "cgroup.controllers").is_file():
            raise FileNotFoundError(f"no cgroup v2 hierarchy at {root}")
        self.root = root
        available = set((root / "cgroup.controllers").read_text().split())
        self.controllers = tuple(c for c in V2_CONTROLLERS if c in available)

    def _enable(self, name: str) -> None:
        """Delegate the controllers down to the job's parent (no processes live in the
        intermediate groups, as v2 requires)."""
        if not self.controllers:
            return
        parts = Path(name).parts
        for depth in range(len(parts)):
            parent = self.root.joinpath(*parts[:depth])
            wanted = " ".join(f"+{c}" for c in self.controllers)
            with contextlib.suppress(OSError):  # already on, or not delegable here
                _write(parent / "cgroup.subtree_control", wanted)
            if depth < len(parts) - 1:
                (parent / parts[depth]).mkdir(exist_ok=True)

    def create(self, name: str, limits: Limits, devices: Sequence[DeviceRule] | None) -> None:
        self._enable(name)
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        if limits.mem_mib is not None and (path / "memory.max").exists():
            _write(path / "memory.max", str(limits.mem_mib << 20))
        if limits.cpu_cores is not None and (path / "cpu.max").exists():
            quota = max(1000, round(limits.cpu_cores * CPU_PERIOD_US))
            _write(path / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        if limits.pids is not None and (path / "pids.max").exists():
            _write(path / "pids.max", str(limits.pids))

    def add(self, name: str, pid: int) -> None:
        _write(self.root / name / "cgroup.procs", str(pid))

    def prime(self) -> None:
        """As CgroupV1.prime: a move into the cgroup this process is already in."""
        _stay(self.root, _own_cgroup(None))

    def pids(self, name: str) -> list[int]:
        return _read_pids(self.root / name / "cgroup.procs")

    def signal(self, name: str, sig: int) -> None:
        _kill_each(self.pids(name), sig)

    def kill(self, name: str) -> None:
        path = self.root / name
        if (path / "cgroup.kill").exists():
            _write(path / "cgroup.kill", "1")
            return
        for _ in range(10):  # kernels before 5.14
            members = self.pids(name)
            if not members:
                return
            _kill_each(members, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self, name: str) -> bool:
        try:
            (self.root / name).rmdir()
        except FileNotFoundError:
            return True
        except OSError as err:
            if err.errno != errno.EBUSY:
                raise
            return False
        return True

    def cannot_guarantee(self) -> list[str]:
        notes = {
            "cpu": "CPU time is not limited",
            "memory": "memory is not limited",
            "pids": "process counts are not limited",
        }
        out = [
            f"cgroup v2 {c} controller not available at {self.root}: {notes[c]}"
            for c in V2_CONTROLLERS
            if c not in self.controllers
        ]
        out.append("cgroup v2: GPU device access is not restricted (needs a BPF device program)")
        return out


def detect(root: Path = CGROUP_ROOT, parent: str = "gpupool") -> tuple[Cgroups | None, str]:
    """The cgroup hierarchy jobs go in, and a sentence saying which (or why none): v2 where
    `root` is a unified hierarchy, else v1 controllers under `root`, if we may write there
    (root, or a delegated subtree)."""
    try:
        v2 = CgroupV2(root)
    except FileNotFoundError:
        pass
    else:
        if os.access(root, os.W_OK):
            return v2, f"cgroup v2 at {root} (controllers: {', '.join(v2.controllers) or 'none'})"
        return None, f"cgroup v2 at {root} is not writable by this user"
    try:
        v1 = CgroupV1(root)
    except FileNotFoundError:
        return None, f"no cgroup hierarchy mounted at {root}"
    writable = [c for c, h in v1.hierarchies.items() if os.access(h, os.W_OK)]
    if not writable:
        return None, f"the cgroup v1 hierarchies under {root} are not writable by this user"
    v1 = CgroupV1(root, tuple(writable))
    return v1, f"cgroup v1 under {root} (controllers: {', '.join(v1.hierarchies)})"


WITHOUT_CGROUPS = (
    "no cgroups: a job's processes are found by the launch token in their environment, so "
    "a child that clears its environment and leaves the job's process group (setsid) "
    "escapes the end of its job and keeps its GPUs; CPU, memory, process counts and GPU "
    "devices are not limited"
)


@dataclass
class _FakeGroup:
    limits: Limits
    devices: tuple[DeviceRule, ...] | None
    members: set[int] = field(default_factory=set)


class FakeCgroups:
    """Membership in memory: processes are "in" a group once added (children are not
    followed), and gone once /proc says so. For tests without root."""

    version = "fake"

    def __init__(self) -> None:
        self.groups: dict[str, _FakeGroup] = {}
        self.killed: list[str] = []

    def create(self, name: str, limits: Limits, devices: Sequence[DeviceRule] | None) -> None:
        self.groups.setdefault(
            name, _FakeGroup(limits, tuple(devices) if devices is not None else None)
        )

    def add(self, name: str, pid: int) -> None:
        self.groups[name].members.add(pid)

    primed = 0
    """How many times prime() was called (it has nothing to prime)."""

    def prime(self) -> None:
        self.primed += 1

    def pids(self, name: str) -> list[int]:
        group = self.groups.get(name)
        if group is None:
            return []
        group.members = {p for p in group.members if _running(p)}
        return sorted(group.members)

    def signal(self, name: str, sig: int) -> None:
        _kill_each(self.pids(name), sig)

    def kill(self, name: str) -> None:
        self.killed.append(name)
        _kill_each(self.pids(name), signal.SIGKILL)

    def remove(self, name: str) -> bool:
        if self.pids(name):
            return False
        self.groups.pop(name, None)
        return True

    def cannot_guarantee(self) -> list[str]:
        return ["fake cgroups: nothing is enforced (tests only)"]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :][:1] not in (b"Z", b"X")
