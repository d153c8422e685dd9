"""Jobs as hostile tenants: real team users, real cgroups, real processes.

A team-b job tries to read team a's files, the database and the server's environment
and to kill team a's job; a job's children escape its process group (setsid, double
fork) and must still die with it, before its GPUs count as free; limits, GPU device
rules and log caps hold. The test process plays the server.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import stat
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import containment
from containment import open_dir  # noqa: F401
from gpupool.errors import SpecError
from gpupool.ports.executor.base import Exit, JobUser, LaunchSpec, Limits
from gpupool.server.agent.processes import read_start_ticks
from gpupool.server.executors.files import exit_file
from gpupool.server.executors.local import LocalExecutor
from gpupool.server.executors.shim import EXIT_NOT_STARTED
from gpupool.server.isolation.cgroups import (
    Cgroups,
    CgroupV1,
    CgroupV2,
    DeviceRule,
    FakeCgroups,
    detect,
    gpu_device_rules,
)
from gpupool.server.isolation.containment import (
    FakeUsers,
    Isolation,
    IsolationConfig,
    parse_isolation,
    user_name_for,
)
from service_proc import HTTP

SHIM = (sys.executable, "-I", "-m", "gpupool.server.executors.shim")
SYSTEM_PY = "/usr/bin/python3"
"""An interpreter a team's user can run (the test's own may live under /root)."""


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def wait_exit(ex: LocalExecutor, timeout_s: float = 10.0) -> Exit:
    deadline = time.monotonic() + timeout_s
    while True:
        got = ex.poll(time.time())
        if got:
            [e] = got
            return e
        if time.monotonic() > deadline:
            raise AssertionError("the job did not end")
        time.sleep(0.01)


def logged(log: Path, text: str, timeout_s: float = 10.0) -> str:
    """The log once it holds `text` (or as it is at the timeout). A running job's output
    reaches its log through the shim's copier thread, a moment after the job wrote it."""
    with contextlib.suppress(AssertionError):
        wait_until(lambda: text in log.read_text(), timeout_s=timeout_s, what=f"{text!r}")
    return log.read_text()


def gone(pid: int) -> bool:
    return read_start_ticks(pid) is None


def py(code: str, python: str = sys.executable) -> tuple[str, ...]:
    return (python, "-c", textwrap.dedent(code))


def launch_spec(
    base: Path, job_id: str, argv: tuple[str, ...], env: dict[str, str] | None = None, **kw: Any
) -> LaunchSpec:
    return LaunchSpec(job_id, 1, argv, env or {}, (), base / job_id, False, **kw)


@pytest.fixture
def ex() -> Iterator[LocalExecutor]:
    containment.require()
    executor = LocalExecutor()
    assert executor.cgroups is not None
    yield executor
    for job_id in list(executor.handles()):
        executor.cancel(job_id, 0, time.time())
    deadline = time.monotonic() + 5
    while executor.handles() and time.monotonic() < deadline:
        executor.poll(time.time())
        time.sleep(0.02)


# --------------------------------------------------------------------------- teams


HOSTILE = """
    import json, os, signal, sys
    a_dir, db, server, a_pid, a_shim = sys.argv[1:6]
    tried = {}
    def attempt(name, fn):
        try:
            fn()
            tried[name] = "allowed"
        except PermissionError:
            tried[name] = "denied"
        except OSError as e:
            tried[name] = f"error {e.errno}"
    attempt("read a's log", lambda: open(os.path.join(a_dir, "stdout.log")).read())
    attempt("list a's run dir", lambda: os.listdir(a_dir))
    attempt("list a's checkpoints", lambda: os.listdir(os.path.join(a_dir, "checkpoint")))
    attempt("read the database", lambda: open(db, "rb").read())
    attempt("list the jobs", lambda: os.listdir(os.path.dirname(a_dir)))
    attempt("read the server's environment", lambda: open(f"/proc/{server}/environ").read())
    attempt("kill a's job", lambda: os.kill(int(a_pid), signal.SIGKILL))
    attempt("kill a's shim", lambda: os.kill(int(a_shim), signal.SIGKILL))
    attempt("write own checkpoint", lambda: open(
        os.path.join(os.environ["GPUPOOL_CHECKPOINT_DIR"], "x"), "w").write("1"))
    attempt("read own log", lambda: open(os.path.join(
        os.path.dirname(os.environ["GPUPOOL_CHECKPOINT_DIR"]), "stderr.log")).read())
    print(json.dumps({"tried": tried, "uid": os.getuid(), "gid": os.getgid(),
                      "groups": os.getgroups(), "env": dict(os.environ), "cwd": os.getcwd()}))
"""


def test_a_team_b_job_cannot_touch_team_a_or_the_server(
    open_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    containment.require()
    monkeypatch.setenv("GPUPOOL_TOKEN", "server-secret-token")
    monkeypatch.setenv("DATABASE_URL", "postgresql://admin:hunter2@db/gpupool")
    state = open_dir / "state"
    state.mkdir()
    db = state / "gpupool.db"
    db.write_text("tokens and hashes")
    isolation = Isolation(IsolationConfig(enabled=True))
    isolation.secure_state(state, state / "jobs", db)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o711
    user_a, user_b = isolation.user_for("ctest-a"), isolation.user_for("ctest-b")
    assert user_a is not None and user_b is not None
    assert (user_a.name, user_b.name) == ("gpupool-ctest-a", "gpupool-ctest-b")
    assert 0 not in (user_a.uid, user_b.uid) and user_a.uid != user_b.uid
    ex = LocalExecutor(isolation=isolation)
    jobs = state / "jobs"
    a_code = "import os, time; open(os.environ['GPUPOOL_CHECKPOINT_DIR'] + '/ready', 'w')"
    a_code += "; print('team a secret output', flush=True); time.sleep(30)"
    a = ex.launch(launch_spec(jobs, "1", (SYSTEM_PY, "-c", a_code), user=user_a), time.time())
    try:
        wait_until((jobs / "1" / "checkpoint" / "ready").exists, what="team a's job")
        [a_pid] = Path(f"/proc/{a.pid}/task/{a.pid}/children").read_text().split()
        argv = (SYSTEM_PY, "-c", textwrap.dedent(HOSTILE), str(jobs / "1"), str(db))
        argv += (str(os.getpid()), a_pid, str(a.pid))
        ex.launch(launch_spec(jobs, "2", argv, env={"MINE": "1"}, user=user_b), time.time())
        deadline = time.monotonic() + 15
        while True:
            ended = ex.poll(time.time())
            if ended or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert [(e.job_id, e.outcome) for e in ended] == [("2", "succeeded")]
        out = (jobs / "2" / "stdout.log").read_text().splitlines()[-1]
        seen = json.loads(out)
        assert seen["tried"] == {
            "read a's log": "denied",
            "list a's run dir": "denied",
            "list a's checkpoints": "denied",
            "read the database": "denied",
            "list the jobs": "denied",
            "read the server's environment": "denied",
            "kill a's job": "denied",
            "kill a's shim": "denied",
            "write own checkpoint": "allowed",
            "read own log": "allowed",
        }, seen["tried"]
        assert (seen["uid"], seen["gid"], seen["groups"]) == (user_b.uid, user_b.gid, [])
        env = seen["env"]
        assert "GPUPOOL_TOKEN" not in env and "DATABASE_URL" not in env
        assert "hunter2" not in json.dumps(env)
        assert env["MINE"] == "1" and env["USER"] == "gpupool-ctest-b"
        assert env["HOME"] == seen["cwd"] == str(jobs / "2" / "home")
        assert read_start_ticks(int(a_pid)) is not None  # team a's job still runs
        assert (jobs / "2" / "checkpoint").stat().st_uid == user_b.uid
    finally:
        ex.cancel("1", 0, time.time())
        wait_exit(ex)


def test_the_shim_gets_a_clean_environment_and_the_job_its_own(
    ex: LocalExecutor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SERVER_SECRET", "s3cret")
    env = {"PYTHONPATH": str(tmp_path / "shadow"), "LD_PRELOAD": "", "OWN": "yes"}
    (tmp_path / "shadow").mkdir()
    (tmp_path / "shadow" / "json.py").write_text("raise SystemExit('shadowed json')\n")
    code = "import os, time; print(os.environ['PYTHONPATH'], os.environ['OWN'], flush=True)"
    code += "; open(os.environ['GPUPOOL_CHECKPOINT_DIR'] + '/ready', 'w'); time.sleep(30)"
    handle = ex.launch(launch_spec(tmp_path, "e", ("python3", "-S", "-c", code), env=env), 0.0)
    wait_until((tmp_path / "e" / "checkpoint" / "ready").exists, what="the job")
    shim_env = Path(f"/proc/{handle.pid}/environ").read_bytes().split(b"\0")
    assert sorted(x.split(b"=")[0] for x in shim_env if x) == [b"GPUPOOL_LAUNCH_TOKEN", b"PATH"]
    assert b"-I" in Path(f"/proc/{handle.pid}/cmdline").read_bytes().split(b"\0")
    assert logged(tmp_path / "e" / "stdout.log", " yes\n").splitlines()[-1].endswith(" yes")
    ex.cancel("e", 0, time.time())
    assert wait_exit(ex).outcome == "cancelled"


def test_isolation_refuses_without_root_and_maps_users() -> None:
    with pytest.raises(SpecError, match="does not run as root"):
        Isolation(IsolationConfig(enabled=True), is_root=False)
    assert not Isolation(IsolationConfig(), is_root=False).enabled
    assert Isolation(IsolationConfig(), is_root=True, users=FakeUsers()).enabled
    users = FakeUsers({"alice": 1000, "root": 0})
    config = IsolationConfig(users={"ml": "alice", "bad": "root", "gone": "nobody-here"})
    iso = Isolation(config, is_root=True, users=users)
    assert iso.user_for("ml") == JobUser("alice", 1000, 1000)
    assert iso.user_for("research") == users.users["gpupool-research"]
    assert iso.user_for("research") is iso.user_for("research")
    assert users.created == ["gpupool-research"]
    with pytest.raises(SpecError, match="root"):
        iso.user_for("bad")
    with pytest.raises(SpecError, match="does not exist"):
        iso.user_for("gone")
    assert user_name_for("research") == "gpupool-research"
    odd = user_name_for("Research.Team-with-a-very-long-name")
    assert len(odd) <= 32 and odd.startswith("gpupool-research_team")
    assert odd != user_name_for("research.team-with-a-very-long-name")


def test_isolation_section_parses_limits_and_refuses_nonsense() -> None:
    config = parse_isolation(
        {
            "enabled": False,
            "log_max_mib": 1,
            "users": {"ml": "alice"},
            "limits": {
                "defaults": {"training": {"cpu": 4, "mem_mib": 1024}},
                "teams": {"ml": {"mem_mib": 2048, "pids": 64}},
            },
        },
        "svc.yaml",
    )
    iso = Isolation(config, is_root=True, users=FakeUsers())
    assert iso.limits_for("ml", "training") == Limits(4.0, 2048, 64)
    assert iso.limits_for("other", "training") == Limits(4.0, 1024, 4096)
    assert iso.limits_for("other", "batch") == Limits(None, None, 4096)
    assert iso.log_max_bytes == 1 << 20 and iso.user_for("ml") is None
    for bad, named in (
        ({"enabld": True}, "enabld"),
        ({"limits": {"defaults": {"trainin": {}}}}, "trainin"),
        ({"limits": {"teams": {"ml": {"cpu": -1}}}}, "cpu"),
        ({"limits": {"teams": {"ml": {"mem_mib": 1.5}}}}, "mem_mib"),
        ({"log_max_mib": 0}, "log_max_mib"),
    ):
        with pytest.raises(SpecError, match=named):
            parse_isolation(bad, "svc.yaml")


# --------------------------------------------------------------------------- escapes

ESCAPE = """
    import os, signal, sys, time
    ckpt = os.environ["GPUPOOL_CHECKPOINT_DIR"]
    child = os.fork()
    if child == 0:  # setsid + double fork: out of the job's session and process group
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # and stubborn
            open(os.path.join(ckpt, "escaped.tmp"), "w").write(str(os.getpid()))
            os.rename(os.path.join(ckpt, "escaped.tmp"), os.path.join(ckpt, "escaped"))
            time.sleep(120)
        os._exit(0)
    os.waitpid(child, 0)
    while not os.path.exists(os.path.join(ckpt, "escaped")):
        time.sleep(0.01)
    if sys.argv[1] == "stay":
        time.sleep(120)
"""


class SlowToKill:
    """The real cgroups, whose kill is ignored `refuse` times: the escaped child is then
    still there when the shim has gone, as on a loaded host."""

    def __init__(self, real: Cgroups, refuse: int) -> None:
        self.real = real
        self.version = real.version
        self.refuse = refuse
        self.refused = 0

    def create(self, name: str, limits: Limits, devices: object) -> None:
        self.real.create(name, limits, devices)  # type: ignore[arg-type]

    def add(self, name: str, pid: int) -> None:
        self.real.add(name, pid)

    def pids(self, name: str) -> list[int]:
        return self.real.pids(name)

    def signal(self, name: str, sig: int) -> None:
        self.real.signal(name, sig)

    def kill(self, name: str) -> None:
        if self.refused < self.refuse:
            self.refused += 1
            return
        self.real.kill(name)

    def remove(self, name: str) -> bool:
        return self.real.remove(name)

    def cannot_guarantee(self) -> list[str]:
        return self.real.cannot_guarantee()


@pytest.mark.parametrize("ending", ["exits", "cancel", "preempt"])
def test_an_escaped_child_dies_with_its_job_before_its_gpus_are_free(
    tmp_path: Path, ending: str
) -> None:
    containment.require()
    real, _ = detect()
    assert real is not None
    groups = SlowToKill(real, refuse=3)
    ex = LocalExecutor(cgroups=groups)  # type: ignore[arg-type]
    mode = "leave" if ending == "exits" else "stay"
    handle = ex.launch(launch_spec(tmp_path, "x", (*py(ESCAPE), mode)), 0.0)
    marker = tmp_path / "x" / "checkpoint" / "escaped"
    wait_until(marker.exists, what="the escaped child")
    escaped = int(marker.read_text())
    assert escaped in groups.pids(handle.cgroup)
    if ending == "cancel":
        ex.cancel("x", 0.2, time.time())
    elif ending == "preempt":
        # "preempted" means it left within its grace (else "killed": the contract in
        # ports/executor/base.py); 0.2 s was shorter than a loaded CI host once took to run
        # the job's SIGTERM handler
        ex.preempt("x", 2.0, time.time())
    # The shim ends, the escaped child is still in the cgroup: no Exit meanwhile.
    early: list[Exit] = []
    deadline = time.monotonic() + 10
    while groups.refused < 3:
        early += ex.poll(time.time())
        assert time.monotonic() < deadline, "the shim did not end"
        time.sleep(0.02)
    assert early == []
    assert not gone(escaped), "the slow kill should have left it running"
    e = wait_exit(ex)
    assert gone(escaped), "reported ended while a process of the job still ran"
    assert groups.pids(handle.cgroup) == []
    want = {"exits": "succeeded", "cancel": "cancelled", "preempt": "preempted"}[ending]
    assert e.outcome == want, e
    assert not (real.root / "pids" / handle.cgroup).exists() or real.version == "v2"


def test_without_cgroups_escapes_are_found_by_their_launch_token(tmp_path: Path) -> None:
    containment.require()
    ex = LocalExecutor(cgroups=None)
    assert "no cgroups" in ex.cannot_guarantee()[0]
    ex.launch(launch_spec(tmp_path, "t", (*py(ESCAPE), "leave")), 0.0)
    marker = tmp_path / "t" / "checkpoint" / "escaped"
    wait_until(marker.exists, what="the escaped child")
    assert wait_exit(ex).outcome == "succeeded"
    assert gone(int(marker.read_text()))


# --------------------------------------------------------------------------- limits


def test_limits_are_written_and_a_fork_bomb_stops_at_pids_max(
    ex: LocalExecutor, tmp_path: Path
) -> None:
    code = """
        import os, sys, time
        kids = []
        try:
            for _ in range(200):
                pid = os.fork()
                if pid == 0:
                    time.sleep(30)
                    os._exit(0)
                kids.append(pid)
        except OSError as e:
            print("fork refused after", len(kids), e.errno, flush=True)
        open(os.environ["GPUPOOL_CHECKPOINT_DIR"] + "/ready", "w")
        time.sleep(30)
    """
    limits = Limits(cpu_cores=0.5, mem_mib=256, pids=20)
    handle = ex.launch(launch_spec(tmp_path, "f", py(code), limits=limits), 0.0)
    wait_until((tmp_path / "f" / "checkpoint" / "ready").exists, timeout_s=20, what="forks")
    out = logged(tmp_path / "f" / "stdout.log", "fork refused after")
    assert "fork refused after" in out, out
    assert int(out.split("fork refused after")[1].split()[0]) < 20
    assert ex.cgroups is not None
    if isinstance(ex.cgroups, CgroupV1):
        root = ex.cgroups.root
        assert (root / "pids" / handle.cgroup / "pids.max").read_text().strip() == "20"
        limit = (root / "memory" / handle.cgroup / "memory.limit_in_bytes").read_text()
        assert int(limit) == 256 << 20
        quota = (root / "cpu" / handle.cgroup / "cpu.cfs_quota_us").read_text()
        assert int(quota) == 50_000
    ex.cancel("f", 0, time.time())
    assert wait_exit(ex).outcome == "cancelled"
    assert ex.cgroups.pids(handle.cgroup) == []


def test_gpu_device_rules_name_the_jobs_gpus_only(tmp_path: Path) -> None:
    assert gpu_device_rules((0,), tmp_path) is None  # no NVIDIA devices: nothing to guard
    containment.require()
    for name, minor in (("nvidia0", 5), ("nvidia1", 8), ("nvidiactl", 7)):
        os.mknod(tmp_path / name, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    (tmp_path / "nvidia-caps").mkdir()
    base = (DeviceRule("c", 1, 3),)
    rules = gpu_device_rules((0,), tmp_path, base)
    assert rules is not None
    assert [r.line() for r in rules] == ["c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm"]
    both = gpu_device_rules((1, 0), tmp_path, base)
    assert both is not None and [r.line() for r in both][1:3] == ["c 1:5 rwm", "c 1:8 rwm"]


def test_a_job_cannot_open_another_jobs_gpu_device(tmp_path: Path) -> None:
    containment.require()
    found, _ = detect()
    if not isinstance(found, CgroupV1) or "devices" not in found.hierarchies:
        pytest.skip("the devices controller is a cgroup v1 one here (v2 needs BPF)")
    dev = tmp_path / "dev"
    dev.mkdir()
    # Stand-ins for /dev/nvidia0, /dev/nvidia1 and /dev/nvidiactl: devices that open
    # without a GPU driver (zero, random, full).
    for name, minor in (("nvidia0", 5), ("nvidia1", 8), ("nvidiactl", 7)):
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    code = f"""
        import json
        seen = {{}}
        for name in ("nvidia0", "nvidia1", "nvidiactl"):
            try:
                open("{dev}/" + name, "rb").close()
                seen[name] = "opened"
            except PermissionError:
                seen[name] = "denied"
        print(json.dumps(seen))
    """
    ex = LocalExecutor(devices_dir=dev, base_devices=(DeviceRule("c", 1, 3),))
    spec = LaunchSpec("d", 1, py(code), {}, (0,), tmp_path / "d", False)
    ex.launch(spec, 0.0)
    e = wait_exit(ex)
    assert e.outcome == "succeeded", (tmp_path / "d" / "stderr.log").read_text()
    seen = json.loads((tmp_path / "d" / "stdout.log").read_text().splitlines()[-1])
    assert seen == {"nvidia0": "opened", "nvidia1": "denied", "nvidiactl": "opened"}
    with open(dev / "nvidia1", "rb"):  # outside the job's cgroup it opens
        pass


def test_cgroup_v2_tracks_and_kills_where_mounted(tmp_path: Path) -> None:
    """The unified hierarchy here has no controllers (they are v1's), but membership
    and cgroup.kill work: enough to contain an escaped child."""
    containment.require()
    unified = Path("/sys/fs/cgroup/unified")
    if not (unified / "cgroup.controllers").is_file():
        found, _ = detect()
        if not isinstance(found, CgroupV2):
            pytest.skip("no cgroup v2 hierarchy mounted")
        unified = found.root
    ex = LocalExecutor(cgroups=CgroupV2(unified))
    handle = ex.launch(launch_spec(tmp_path, "v2", (*py(ESCAPE), "leave")), 0.0)
    marker = tmp_path / "v2" / "checkpoint" / "escaped"
    wait_until(marker.exists, what="the escaped child")
    assert wait_exit(ex).outcome == "succeeded"
    assert gone(int(marker.read_text()))
    assert not (unified / handle.cgroup).exists()


def test_priming_moves_nothing_and_a_launch_primes(tmp_path: Path) -> None:
    """prime() writes this process into the cgroups it is already in (the kernel takes
    the lock a move takes, so a shim moved next does not wait for it): afterwards this
    process is where it was, in every hierarchy; a launch primes on a helper thread."""
    containment.require()
    found, _ = detect()
    assert found is not None
    before = Path("/proc/self/cgroup").read_text()
    found.prime()
    assert Path("/proc/self/cgroup").read_text() == before
    fake = FakeCgroups()
    ex = LocalExecutor(cgroups=fake)
    ex.expect_launch()
    wait_until(lambda: fake.primed == 1, what="the prime")
    ex.launch(launch_spec(tmp_path, "p", ("true",)), 0.0)
    wait_until(lambda: fake.primed == 2, what="the launch's prime")
    assert wait_exit(ex).outcome == "succeeded"


def test_a_ray_node_launcher_primes_its_cgroups_when_asked_to_start() -> None:
    """The warm launcher on a Ray node primes its cgroups on a helper thread as a
    start_many call comes in (the grace period overlaps the shims' start); uncontained,
    nothing. (Built without Ray: only its containment matters here.)"""
    from gpupool.server.agent.start import Containment
    from gpupool.server.executors.ray_launcher import NodeLauncher

    fake = FakeCgroups()
    launcher = NodeLauncher.__new__(NodeLauncher)
    launcher._containment = Containment(fake)
    launcher._priming = None
    assert launcher.start_many([]) == []
    wait_until(lambda: fake.primed == 1, what="the launcher's prime")
    bare = NodeLauncher.__new__(NodeLauncher)
    bare._containment = Containment(None)
    bare._priming = None
    assert bare.start_many([]) == []
    assert bare._priming is None


def test_fake_cgroups_follow_what_was_added() -> None:
    fake = FakeCgroups()
    fake.create("gpupool/x", Limits(pids=5), None)
    fake.add("gpupool/x", os.getpid())
    assert fake.pids("gpupool/x") == [os.getpid()]
    assert fake.remove("gpupool/x") is False
    assert fake.groups["gpupool/x"].limits.pids == 5


# --------------------------------------------------------------------------- logs


def test_logs_are_capped_and_rotated(tmp_path: Path) -> None:
    ex = LocalExecutor(log_max_bytes=64 << 10, cgroups=None)
    code = """
        import sys
        for i in range(4000):
            print(f"line {i:06d} " + "x" * 90)
        print("the end", file=sys.stderr)
    """
    ex.launch(launch_spec(tmp_path, "big", py(code)), 0.0)
    assert wait_exit(ex).outcome == "succeeded"
    run = tmp_path / "big"
    assert (run / "stdout.log").stat().st_size <= 64 << 10
    assert (run / "stdout.log.1").stat().st_size == 64 << 10
    assert (run / "stdout.log").read_text().splitlines()[-1].startswith("line 003999 ")
    assert (run / "stderr.log").read_text() == "== attempt 1 ==\nthe end\n"
    assert json.loads(exit_file(run, 1).read_text())["exit_code"] == 0


def test_a_shim_whose_launcher_died_starts_nothing(tmp_path: Path) -> None:
    import subprocess

    r, w = os.pipe()
    whole = marshal.dumps({"argv": ["touch", str(tmp_path / "ran")]})
    os.write(w, whole[: len(whole) // 2])  # the launcher died while handing it over
    os.close(w)
    record = tmp_path / "exit.json"
    done = subprocess.run(
        [*SHIM, "--exit-file", str(record), "--spec-fd", str(r)],
        pass_fds=(r,),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    os.close(r)
    assert done.returncode == EXIT_NOT_STARTED
    assert "not started" in done.stderr
    assert not record.exists()


def test_through_the_service_a_team_b_job_cannot_reach_team_a_or_the_server(
    open_dir: Path,  # noqa: F811
) -> None:
    """The same attack on a real `gpupool serve` (root, isolation on by default), its
    environment holding a secret."""
    containment.require()

    from service_proc import Server, wait_for

    state = open_dir / "state"
    env = {**os.environ, "GPUPOOL_SERVER_SECRET": "hunter2"}
    args = ("--fake-gpus", "2xA100-80GB", "--auth", "none", "--cycle", "0.2")
    server = Server(state, *args, isolation=True, env=env).start()
    try:
        assert server.proc is not None
        a_code = "import os, time; open(os.environ['GPUPOOL_CHECKPOINT_DIR'] + '/pid', 'w')"
        a_code += ".write(str(os.getpid())); time.sleep(60)"
        jobs = f"{server.url}/v1/jobs"
        a = HTTP.post(jobs, json={"command": [SYSTEM_PY, "-c", a_code], "team": "ctest-a"})
        a_id = a.json()["id"]
        pid_file = state / "jobs" / str(a_id) / "checkpoint" / "pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text() != "", 30, "team a's job")
        a_pid = pid_file.read_text()
        stat = Path(f"/proc/{a_pid}/stat").read_text()
        a_shim = stat[stat.rfind(")") + 2 :].split()[1]  # its parent
        assert "gpupool.server.executors.shim" in Path(f"/proc/{a_shim}/cmdline").read_text()
        argv = [SYSTEM_PY, "-c", textwrap.dedent(HOSTILE), str(state / "jobs" / str(a_id))]
        argv += [str(state / "gpupool.db"), str(server.proc.pid), a_pid, a_shim]
        b_id = HTTP.post(jobs, json={"command": argv, "team": "ctest-b"}).json()["id"]
        wait_for(
            lambda: HTTP.get(f"{jobs}/{b_id}").json()["state"] in ("succeeded", "failed"),
            30,
            "team b's job",
        )
        log = HTTP.get(f"{jobs}/{b_id}/logs").text
        seen = json.loads(log.splitlines()[-1])
        assert HTTP.get(f"{jobs}/{a_id}").json()["state"] == "running"
        HTTP.post(f"{jobs}/{a_id}/cancel")
        wait_for(lambda: HTTP.get(f"{jobs}/{a_id}").json()["state"] == "cancelled", 30, "cancel")
    finally:
        server.stop()
    assert {k: v for k, v in seen["tried"].items() if v != "denied"} == {
        "write own checkpoint": "allowed",
        "read own log": "allowed",
    }, seen["tried"]
    assert "hunter2" not in json.dumps(seen["env"])
    assert seen["env"]["USER"] == "gpupool-ctest-b"


def test_serve_turns_isolation_off_for_the_demo_and_says_so(tmp_path: Path) -> None:
    from gpupool.server.isolation.containment import service_isolation

    config = tmp_path / "svc.yaml"
    config.write_text("isolation: {log_max_mib: 2}\n")
    configured = service_isolation(config, off=False)
    assert configured.enabled == (os.geteuid() == 0)
    assert configured.log_max_bytes == 2 << 20
    assert not service_isolation(None, off=False, demo=True).enabled
    assert not service_isolation(None, off=True).enabled
    config.write_text("isolation: {enabled: true}\n")
    if os.geteuid() == 0:
        assert service_isolation(config, off=False, demo=True).enabled


def test_a_shim_that_cannot_start_leaves_no_cgroup(tmp_path: Path) -> None:
    containment.require()
    ex = LocalExecutor(python=str(tmp_path / "no-such-python"))
    assert ex.cgroups is not None
    with pytest.raises(SpecError, match="cannot start the shim"):
        ex.launch(launch_spec(tmp_path, "n", ("true",)), 0.0)
    assert ex.handles() == {}
    assert ex.cgroups.pids("gpupool") == []  # and nothing of it remains under gpupool/
    found, _ = detect()
    if isinstance(found, CgroupV1):
        leftovers = [p.name for p in (found.root / "pids" / "gpupool").glob("job-n-*")]
        assert leftovers == []
