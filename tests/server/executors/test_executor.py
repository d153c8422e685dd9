"""The local executor against real processes, the fake against the same rules, and the
checkpoint examples through real preemptions."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import marshal
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpupool.errors import ConflictError, NotFoundError, SpecError
from gpupool.examples.ckpt_counter import expected_result
from gpupool.ports.executor.base import Exit, Handle, LaunchSpec, classify
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.server.agent.processes import read_start_ticks
from gpupool.server.executors import local as executor_module
from gpupool.server.executors.files import exit_file, launch_file
from gpupool.server.executors.local import LocalExecutor

PY = sys.executable


def job(code: str) -> tuple[str, ...]:
    return (PY, "-c", textwrap.dedent(code))


# A job that says it is ready (its handlers are installed) by creating $CKPT/ready.
READY = "open(os.path.join(os.environ['GPUPOOL_CHECKPOINT_DIR'], 'ready'), 'w').close()"


IGNORES_TERM = "signal.signal(signal.SIGTERM, signal.SIG_IGN)"
EXITS_ON_TERM = "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))"


def sleeper(setup: str = "") -> tuple[str, ...]:
    """A job that runs `setup`, says it is ready, then sleeps for a minute."""
    return job(f"import os, signal, sys, time\n{setup}\n{READY}\ntime.sleep(60)")


def spec(
    tmp_path: Path,
    job_id: str,
    argv: tuple[str, ...],
    *,
    attempt: int = 1,
    env: dict[str, str] | None = None,
    gpus: tuple[int, ...] = (),
    resume: bool = False,
    cwd: Path | None = None,
) -> LaunchSpec:
    return LaunchSpec(job_id, attempt, argv, env or {}, gpus, tmp_path / job_id, resume, cwd)


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


def wait_exits(ex: LocalExecutor, n: int = 1, timeout_s: float = 10.0) -> list[Exit]:
    got: list[Exit] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n:
        got += ex.poll(time.time())
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(got)} of {n} jobs ended: {got}")
        time.sleep(0.01)
    return got


def ready(tmp_path: Path, job_id: str) -> None:
    wait_until((tmp_path / job_id / "checkpoint" / "ready").exists)


def gone(pid: int) -> bool:
    return read_start_ticks(pid) is None


@pytest.fixture
def ex() -> Iterator[LocalExecutor]:
    executor = LocalExecutor()
    yield executor
    running = list(executor.handles())
    for job_id in running:  # never leave a test's jobs running
        executor.cancel(job_id, 0, time.time())
    if running:
        wait_exits(executor, len(running), timeout_s=5.0)


# --------------------------------------------------------------------------- local


def test_environment_gpus_and_cwd_reach_the_job(
    ex: LocalExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPOOL_RESUME", "1")  # must not leak into a fresh start
    monkeypatch.setenv("FROM_SERVICE", "inherited")
    wd = tmp_path / "wd"
    wd.mkdir()
    dump = job("""
        import json, os
        keys = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUPOOL_JOB_ID", "GPUPOOL_ATTEMPT",
                "GPUPOOL_CHECKPOINT_DIR", "GPUPOOL_RESUME", "FOO", "FROM_SERVICE"]
        print(json.dumps({k: os.environ.get(k) for k in keys} | {"cwd": os.getcwd()}))
    """)
    ex.launch(spec(tmp_path, "a", dump, env={"FOO": "bar"}, gpus=(1, 3), resume=True), 0.0)
    ex.launch(spec(tmp_path, "b", dump, attempt=2, cwd=wd), 0.0)
    assert {e.outcome for e in wait_exits(ex, 2)} == {"succeeded"}

    def seen(job_id: str) -> dict[str, str | None]:
        lines = (tmp_path / job_id / "stdout.log").read_text().splitlines()
        return json.loads(lines[-1])  # type: ignore[no-any-return]

    a, b = seen("a"), seen("b")
    assert a["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert a["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert (a["GPUPOOL_JOB_ID"], a["GPUPOOL_ATTEMPT"]) == ("a", "1")
    assert a["GPUPOOL_CHECKPOINT_DIR"] == str(tmp_path / "a" / "checkpoint")
    assert (tmp_path / "a" / "checkpoint").is_dir()
    assert (a["GPUPOOL_RESUME"], a["FOO"]) == ("1", "bar")
    assert a["FROM_SERVICE"] is None  # the server's environment never reaches a job
    assert b["CUDA_VISIBLE_DEVICES"] == ""
    assert (b["GPUPOOL_ATTEMPT"], b["GPUPOOL_RESUME"], b["FOO"]) == ("2", None, None)
    assert b["cwd"] == str(wd)


def test_logs_append_across_attempts_and_exit_codes(ex: LocalExecutor, tmp_path: Path) -> None:
    code = "import sys; print('out{0}'); print('err{0}', file=sys.stderr); sys.exit({1})"
    ex.launch(spec(tmp_path, "j", job(code.format(1, 3))), 0.0)
    [first] = wait_exits(ex)
    assert (first.outcome, first.exit_code, first.signal) == ("failed", 3, None)
    assert first.reason == "exited 3"
    ex.launch(spec(tmp_path, "j", job(code.format(2, 0)), attempt=2, resume=True), 0.0)
    [second] = wait_exits(ex)
    assert (second.outcome, second.exit_code, second.attempt) == ("succeeded", 0, 2)
    run = tmp_path / "j"
    assert (run / "stdout.log").read_text() == "== attempt 1 ==\nout1\n== attempt 2 ==\nout2\n"
    assert (run / "stderr.log").read_text() == "== attempt 1 ==\nerr1\n== attempt 2 ==\nerr2\n"
    record = json.loads(exit_file(run, 1).read_text())
    assert (record["exit_code"], record["signal"]) == (3, None)
    assert json.loads(exit_file(run, 2).read_text())["exit_code"] == 0


def test_missing_command_fails_on_next_poll(ex: LocalExecutor, tmp_path: Path) -> None:
    ex.launch(spec(tmp_path, "nf", ("gpupool-no-such-command",)), 0.0)
    [e] = wait_exits(ex)
    assert (e.outcome, e.exit_code) == ("failed", 127)
    assert e.reason == "command not found: gpupool-no-such-command"


def test_the_job_starts_clean_from_the_shim(ex: LocalExecutor, tmp_path: Path) -> None:
    """What the shim's fork and exec hand the job: stdin from /dev/null, only fds 0-2, and
    SIGPIPE and SIGXFSZ not ignored (Python ignores them; a job must not inherit that).
    Other ignored signals pass through as a server started in the background has them."""
    probe = ("sh", "-c", "grep SigIgn /proc/self/status; readlink /proc/$$/fd/0; ls /proc/$$/fd")
    ex.launch(spec(tmp_path, "c", probe), 0.0)
    [e] = wait_exits(ex)
    assert e.outcome == "succeeded"
    lines = (tmp_path / "c" / "stdout.log").read_text().splitlines()[1:]
    ignored = int(lines[0].split()[1], 16)
    assert ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)) == 0, lines[0]
    assert lines[1] == "/dev/null"
    assert sorted(lines[2:]) == ["0", "1", "2"]


def test_a_job_that_cannot_start_says_why(ex: LocalExecutor, tmp_path: Path) -> None:
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    ex.launch(spec(tmp_path, "x", (str(script),)), 0.0)
    [e] = wait_exits(ex)
    assert (e.outcome, e.exit_code) == ("failed", 126)
    assert e.reason == f"command not executable: {script}"


def test_the_command_is_found_on_the_jobs_path_as_execvpe_finds_it(
    ex: LocalExecutor, tmp_path: Path
) -> None:
    """The shim searches the job's PATH itself (not os.execvpe, whose search imports
    warnings in every job's child): entries in order, one that is not executable skipped
    when a later one is, and reported as not executable when none is."""
    first, second = tmp_path / "first", tmp_path / "second"
    for d in (first, second):
        d.mkdir()
    (first / "gpupool-probe").write_text("#!/bin/sh\necho first\n")  # not executable
    (second / "gpupool-probe").write_text("#!/bin/sh\necho second\n")
    (second / "gpupool-probe").chmod(0o755)
    path = f"{tmp_path / 'none'}:{first}:{second}"
    ex.launch(spec(tmp_path, "p", ("gpupool-probe",), env={"PATH": path}), 0.0)
    [e] = wait_exits(ex)
    assert e.outcome == "succeeded", e.reason
    assert (tmp_path / "p" / "stdout.log").read_text().splitlines()[1:] == ["second"]
    ex.launch(spec(tmp_path, "q", ("gpupool-probe",), env={"PATH": str(first)}), 0.0)
    [e] = wait_exits(ex)
    assert (e.outcome, e.exit_code) == ("failed", 126)
    assert e.reason == "command not executable: gpupool-probe"


def test_the_shim_is_this_installs_and_starts_without_site(
    ex: LocalExecutor, tmp_path: Path
) -> None:
    """The shim runs from the directory of the executor that started it (not whichever
    gpupool site-packages names), isolated (-I) and without site (-S), and a restarted
    executor still recognises it by its command line."""
    handle = ex.launch(spec(tmp_path, "s", sleeper()), 0.0)
    ready(tmp_path, "s")
    cmdline = Path(f"/proc/{handle.pid}/cmdline").read_bytes().decode().split("\0")
    assert {"-I", "-S", "gpupool.server.executors.shim"} <= set(cmdline)
    assert str(Path(executor_module.__file__).parent) in cmdline
    other = LocalExecutor()
    assert other.adopt(handle, tmp_path / "s")
    other.shutdown()


def _shims_of(run_dir: Path) -> list[int]:
    """Live processes whose command line names an exit file in `run_dir`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and read_start_ticks(int(name)) is not None:
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "gpupool.server.executors.shim" in cmdline and str(run_dir) in cmdline:
                found.append(int(name))
    return found


def test_a_launch_whose_intent_cannot_be_written_leaves_nothing_running(
    ex: LocalExecutor, tmp_path: Path
) -> None:
    """The shim starts before the intent is written (its start overlaps the intent and
    the cgroup); when the intent fails, the shim, never handed its job, is killed and
    reaped, and the job never ran."""
    marker = tmp_path / "ran"
    (tmp_path / "i").mkdir()
    launch_file(tmp_path / "i", 1).mkdir()  # a directory where the intent must go
    with pytest.raises(OSError):
        ex.launch(spec(tmp_path, "i", job(f"open({str(marker)!r}, 'w')")), 0.0)
    assert ex.handles() == {}
    assert _shims_of(tmp_path / "i") == []
    time.sleep(0.2)
    assert not marker.exists()


def test_preempted_job_checkpoints_within_grace(ex: LocalExecutor, tmp_path: Path) -> None:
    code = f"""
        import os, signal, sys, time
        def leave(signum, frame):
            open(os.path.join(os.environ['GPUPOOL_CHECKPOINT_DIR'], 'ckpt'), 'w').write('7')
            sys.exit(0)
        signal.signal(signal.SIGTERM, leave)
        {READY}
        time.sleep(60)
    """
    handle = ex.launch(spec(tmp_path, "p", job(code)), 0.0)
    ready(tmp_path, "p")
    assert ex.poll(time.time()) == []
    assert ex.handles() == {"p": handle}
    ex.preempt("p", 5.0, time.time())
    [e] = wait_exits(ex)
    assert (e.outcome, e.exit_code, e.signal) == ("preempted", 0, None)
    assert "grace period after SIGTERM for preemption" in e.reason
    assert (tmp_path / "p" / "checkpoint" / "ckpt").read_text() == "7"
    assert ex.handles() == {}


def test_job_ignoring_sigterm_is_killed_after_grace(ex: LocalExecutor, tmp_path: Path) -> None:
    ex.launch(spec(tmp_path, "k", sleeper(IGNORES_TERM)), 0.0)
    ready(tmp_path, "k")
    sent = time.time()
    ex.preempt("k", 0.5, sent)
    time.sleep(0.3)
    assert ex.poll(sent + 0.3) == []  # still in its grace period (by the caller's clock)
    assert "k" in ex.handles()
    [e] = wait_exits(ex)
    assert (e.outcome, e.signal) == ("killed", signal.SIGKILL)
    assert e.reason == "killed by SIGKILL after the 0.5 s grace period"
    assert 0.5 <= e.at_s - sent < 3.0


def test_cancel_is_cancelled_whether_job_leaves_or_is_killed(
    ex: LocalExecutor, tmp_path: Path
) -> None:
    ex.launch(spec(tmp_path, "polite", sleeper()), 0.0)  # dies of the SIGTERM
    ex.launch(spec(tmp_path, "stubborn", sleeper(IGNORES_TERM)), 0.0)
    ready(tmp_path, "polite")
    ready(tmp_path, "stubborn")
    ex.cancel("polite", 5.0, time.time())
    ex.cancel("stubborn", 0.2, time.time())
    exits = {e.job_id: e for e in wait_exits(ex, 2)}
    assert exits["polite"].outcome == exits["stubborn"].outcome == "cancelled"
    assert exits["polite"].signal == signal.SIGTERM
    assert exits["stubborn"].signal == signal.SIGKILL
    assert "SIGKILL after the 0.2 s grace period" in exits["stubborn"].reason


def test_outside_sigkill_is_oom_and_sigsegv_is_crashed(ex: LocalExecutor, tmp_path: Path) -> None:
    ex.launch(spec(tmp_path, "oom", sleeper()), 0.0)
    ex.launch(spec(tmp_path, "seg", job("import os, signal; os.kill(os.getpid(), 11)")), 0.0)
    ready(tmp_path, "oom")
    # The OOM killer picks the job's command (the big process), not the small shim.
    shim = ex.handles()["oom"].pid
    [job_pid] = Path(f"/proc/{shim}/task/{shim}/children").read_text().split()
    os.kill(int(job_pid), signal.SIGKILL)
    exits = {e.job_id: e for e in wait_exits(ex, 2)}
    assert (exits["oom"].outcome, exits["oom"].signal) == ("oom", signal.SIGKILL)
    assert "out-of-memory" in exits["oom"].reason
    assert (exits["seg"].outcome, exits["seg"].signal) == ("crashed", signal.SIGSEGV)
    assert exits["seg"].reason == "died of SIGSEGV"


def test_whole_shim_killed_from_outside_is_oom(ex: LocalExecutor, tmp_path: Path) -> None:
    ex.launch(spec(tmp_path, "g", sleeper()), 0.0)
    ready(tmp_path, "g")
    os.killpg(ex.handles()["g"].pgid, signal.SIGKILL)  # e.g. a cgroup OOM kill
    [e] = wait_exits(ex)
    assert (e.outcome, e.signal) == ("oom", signal.SIGKILL)
    assert not exit_file(tmp_path / "g", 1).exists()


GRANDCHILD = """
    import os, subprocess, time
    child = subprocess.Popen(["sleep", "60"])
    pid_file = os.path.join(os.environ['GPUPOOL_CHECKPOINT_DIR'], 'grandchild')
    open(pid_file, 'w').write(str(child.pid))
"""


def test_preemption_reaches_grandchildren(ex: LocalExecutor, tmp_path: Path) -> None:
    ex.launch(spec(tmp_path, "tree", job(GRANDCHILD + "    child.wait()\n")), 0.0)
    pid_file = tmp_path / "tree" / "checkpoint" / "grandchild"
    wait_until(lambda: pid_file.exists() and pid_file.read_text() != "")
    grandchild = int(pid_file.read_text())
    assert not gone(grandchild)
    ex.preempt("tree", 5.0, time.time())
    [e] = wait_exits(ex)
    assert e.outcome == "preempted"
    wait_until(lambda: gone(grandchild), timeout_s=3.0)


def test_leftovers_are_killed_when_the_command_exits(ex: LocalExecutor, tmp_path: Path) -> None:
    ex.launch(spec(tmp_path, "daemon", job(GRANDCHILD)), 0.0)  # exits 0, child still runs
    [e] = wait_exits(ex)
    assert e.outcome == "succeeded"
    grandchild = int((tmp_path / "daemon" / "checkpoint" / "grandchild").read_text())
    wait_until(lambda: gone(grandchild), timeout_s=3.0)


def test_shim_alone_records_the_end_and_kills_leftovers(tmp_path: Path) -> None:
    """What an adopted job relies on when no executor is its parent to clean up."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    env = dict(os.environ, GPUPOOL_CHECKPOINT_DIR=str(ckpt))
    shim = (PY, "-m", "gpupool.server.executors.shim", "--exit-file")
    record = tmp_path / "exit.json"
    daemon = subprocess.run(
        (*shim, str(record), "--", *job(GRANDCHILD)), env=env, start_new_session=True
    )
    assert daemon.returncode == 0
    assert json.loads(record.read_text())["exit_code"] == 0
    wait_until(lambda: gone(int((ckpt / "grandchild").read_text())), timeout_s=3.0)

    segv = job("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    crashed = subprocess.run((*shim, str(record), "--", *segv), start_new_session=True)
    assert crashed.returncode == 128 + signal.SIGSEGV
    assert json.loads(record.read_text())["signal"] == signal.SIGSEGV
    assert not list(tmp_path.glob(".exit.json.*"))  # the temp file was renamed away


def _catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler installed for `sig` (SigCgt in its status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def test_a_sigterm_before_the_job_starts_means_it_never_starts(tmp_path: Path) -> None:
    """A stop that reaches the shim while it still waits for the job is not lost: the job
    is not started (else it would run on, unsignalled, until the grace period ends)."""
    marker = tmp_path / "ran"
    record = tmp_path / "exit.json"
    r, w = os.pipe()
    shim = subprocess.Popen(
        (
            PY,
            "-I",
            "-m",
            "gpupool.server.executors.shim",
            "--exit-file",
            str(record),
            "--spec-fd",
            str(r),
        ),
        pass_fds=(r,),
        start_new_session=True,
        stderr=subprocess.PIPE,
    )
    os.close(r)
    try:
        wait_until(lambda: _catches(shim.pid, signal.SIGTERM), timeout_s=10.0)
        os.killpg(shim.pid, signal.SIGTERM)  # what the executor sends to the attempt
        os.write(w, marshal.dumps({"argv": [PY, "-c", f"open({str(marker)!r}, 'w')"]}))
    finally:
        os.close(w)
    _, err = shim.communicate(timeout=10)
    assert shim.returncode == 128 + signal.SIGTERM
    assert json.loads(record.read_text())["signal"] == signal.SIGTERM
    assert b"SIGTERM before the job started" in err
    assert not marker.exists()


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "proc-fallback"])
def test_job_survives_restart_and_is_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    if not pidfd:  # old kernels, or out of file descriptors

        def no_pidfd(pid: int, flags: int = 0) -> int:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    go = tmp_path / "go"
    code = f"""
        import os, sys, time
        while not os.path.exists({str(go)!r}):
            time.sleep(0.01)
        sys.exit(7)
    """
    first = LocalExecutor()
    handle = first.launch(spec(tmp_path, "long", job(code)), 0.0)
    first.shutdown()
    assert first.handles() == {}
    time.sleep(0.1)
    assert read_start_ticks(handle.pid) == handle.start_ticks  # shutdown killed nothing

    second = LocalExecutor()
    (tmp_path / "alias").symlink_to(tmp_path)  # the same run_dir, spelled another way
    assert second.adopt(handle, tmp_path / "alias" / "long") is True
    assert second.handles() == {"long": handle}
    assert second.poll(time.time()) == []
    go.touch()
    [e] = wait_exits(second)
    assert (e.job_id, e.outcome, e.exit_code, e.reason) == ("long", "failed", 7, "exited 7")


def test_grace_deadline_survives_restart(tmp_path: Path) -> None:
    first = LocalExecutor()
    handle = first.launch(spec(tmp_path, "s", sleeper(IGNORES_TERM)), 0.0)
    ready(tmp_path, "s")
    first.preempt("s", 0.4, time.time())
    first.shutdown()
    second = LocalExecutor()
    assert second.adopt(handle, tmp_path / "s") is True
    [e] = wait_exits(second)
    assert (e.outcome, e.signal) == ("killed", signal.SIGKILL)
    assert "0.4 s grace period" in e.reason


def _watchers() -> int:
    return sum(t.name == "gpupool-exit-watch" for t in threading.enumerate())


def test_an_ended_shim_wakes_the_exit_watch_without_a_poll(tmp_path: Path) -> None:
    """watch_exits: a job's end (its shim's, our child's or an adopted one's) calls the
    wake at once, so the loop reaps it without waiting out its cycle; a running job does
    not; shutdown() ends the watch's thread."""
    woken = threading.Event()
    ex = LocalExecutor()
    ex.watch_exits(woken.set)
    ex.launch(spec(tmp_path, "quick", job("pass")), 0.0)
    assert woken.wait(10), "the end of the job did not wake the watch"
    assert wait_exits(ex)[0].outcome == "succeeded"
    woken.clear()
    handle = ex.launch(spec(tmp_path, "long", sleeper()), 0.0)
    ready(tmp_path, "long")
    assert not woken.wait(0.3)
    ex.shutdown()
    wait_until(lambda: _watchers() == 0)
    adopter = LocalExecutor()
    adopter.watch_exits(woken.set)
    assert adopter.adopt(handle, tmp_path / "long")
    assert not woken.wait(0.2)
    adopter.cancel("long", 0, time.time())
    assert woken.wait(10), "the end of an adopted job did not wake the watch"
    assert wait_exits(adopter)[0].outcome == "cancelled"
    adopter.shutdown()
    wait_until(lambda: _watchers() == 0)


def test_the_exit_watch_keeps_within_its_share_of_descriptors(tmp_path: Path) -> None:
    """Past exit_watch_limit pidfds (a quarter of RLIMIT_NOFILE) a job is not watched: it
    ends at the next poll as before, and costs the server no descriptor."""
    ex = LocalExecutor()
    ex.watch_exits(lambda: None)
    ex.exit_watch_limit = 1
    try:
        before = len(os.listdir("/proc/self/fd"))
        for name in ("w1", "w2", "w3"):
            ex.launch(spec(tmp_path, name, sleeper()), 0.0)
            ready(tmp_path, name)
        assert len(os.listdir("/proc/self/fd")) == before + 1
        for name in ("w1", "w2", "w3"):
            ex.cancel(name, 0, time.time())
        assert {e.outcome for e in wait_exits(ex, 3)} == {"cancelled"}
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        ex.shutdown()


def test_adopt_refuses_dead_pid_and_recycled_pid(ex: LocalExecutor, tmp_path: Path) -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    dead = Handle("dead", 1, done.pid, done.pid, 12345)
    other = LocalExecutor()
    assert other.adopt(dead, tmp_path / "dead") is False
    assert other.handles() == {}
    [lost] = other.poll(time.time())
    assert (lost.job_id, lost.outcome) == ("dead", "lost")

    live = ex.launch(spec(tmp_path, "live", job("import time; time.sleep(60)")), 0.0)
    # A pid recycled by a stranger, and no launch intent to find the attempt by.
    recycled = dataclasses.replace(live, start_ticks=live.start_ticks + 1, token="", cgroup="")
    intent = launch_file(tmp_path / "live", 1)
    intent.rename(intent.with_suffix(".away"))
    assert other.adopt(recycled, tmp_path / "live") is False
    intent.with_suffix(".away").rename(intent)
    [e] = other.poll(time.time())
    assert e.outcome == "lost"
    assert ex.handles() == {"live": live}  # the real job was never touched

    # A dead pid with an exit record: the record tells how it ended.
    (tmp_path / "rec").mkdir()
    exit_file(tmp_path / "rec", 2).write_text('{"exit_code": 0, "signal": null, "ended_at": 1}')
    assert other.adopt(Handle("rec", 2, done.pid, done.pid, 1), tmp_path / "rec") is False
    [rec] = other.poll(time.time())
    assert (rec.outcome, rec.exit_code, rec.attempt) == ("succeeded", 0, 2)


def test_bad_requests_raise(ex: LocalExecutor, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="command is empty"):
        ex.launch(spec(tmp_path, "e", ()), 0.0)
    with pytest.raises(SpecError, match="does not exist"):
        ex.launch(spec(tmp_path, "e", ("true",), cwd=tmp_path / "nowhere"), 0.0)
    with pytest.raises(NotFoundError):
        ex.preempt("never", 1.0, 0.0)
    ex.launch(spec(tmp_path, "twice", job("import time; time.sleep(60)")), 0.0)
    with pytest.raises(ConflictError):
        ex.launch(spec(tmp_path, "twice", ("true",), attempt=2), 0.0)


def test_poll_is_cheap(ex: LocalExecutor, tmp_path: Path) -> None:
    for i in range(20):
        ex.launch(spec(tmp_path, f"j{i}", ("sleep", "60")), 0.0)
    started = time.perf_counter()
    for _ in range(10):
        assert ex.poll(time.time()) == []
    per_job_s = (time.perf_counter() - started) / (10 * 20)
    assert per_job_s < 0.0005, f"poll spends {per_job_s * 1e6:.0f} µs per running job"


# --------------------------------------------------------------------------- examples


def _log(tmp_path: Path, job_id: str) -> str:
    return (tmp_path / job_id / "stdout.log").read_text()


def _attempt_log(tmp_path: Path, job_id: str, attempt: int) -> str:
    return _log(tmp_path, job_id).split(f"== attempt {attempt} ==\n")[-1]


def test_ckpt_counter_survives_two_preemptions(ex: LocalExecutor, tmp_path: Path) -> None:
    steps = 60
    argv = (PY, "-m", "gpupool.examples.ckpt_counter", "--steps", str(steps))
    argv += ("--step-s", "0.01", "--every", "5")
    for attempt in (1, 2):
        ex.launch(spec(tmp_path, "c", argv, attempt=attempt, resume=attempt > 1), 0.0)
        # let it make progress past a periodic checkpoint, then preempt mid-run
        wait_until(lambda a=attempt: "(checkpointed)" in _attempt_log(tmp_path, "c", a))
        ex.preempt("c", 10.0, time.time())
        [e] = wait_exits(ex)
        assert (e.outcome, e.exit_code) == ("preempted", 0), _log(tmp_path, "c")
        assert "SIGTERM: checkpoint saved" in _attempt_log(tmp_path, "c", attempt)
    ex.launch(spec(tmp_path, "c", argv, attempt=3, resume=True), 0.0)
    [e] = wait_exits(ex)
    assert e.outcome == "succeeded", _log(tmp_path, "c")
    last = _log(tmp_path, "c").splitlines()[-1]
    fields = dict(part.split("=") for part in last.split())
    assert int(fields["result"]) == expected_result(steps) == sum(i * i for i in range(steps))
    assert int(fields["steps"]) == steps
    assert 0 < int(fields["resumed_from"]) < steps


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="PyTorch is not installed here (gpupool does not depend on it)",
)
def test_torch_train_resumes_to_the_same_model(ex: LocalExecutor, tmp_path: Path) -> None:
    argv = (PY, "-m", "gpupool.examples.torch_train", "--steps", "300", "--every", "20")
    ex.launch(spec(tmp_path, "whole", argv), 0.0)
    ex.launch(spec(tmp_path, "split", (*argv, "--step-s", "0.005")), 0.0)
    wait_until(lambda: "(checkpointed)" in _log(tmp_path, "split"), timeout_s=30)
    ex.preempt("split", 10.0, time.time())
    exits = {e.job_id: e for e in wait_exits(ex, 2, timeout_s=30)}
    assert exits["split"].outcome == "preempted", _log(tmp_path, "split")
    assert exits["whole"].outcome == "succeeded", _log(tmp_path, "whole")
    ex.launch(spec(tmp_path, "split", argv, attempt=2, resume=True), 0.0)
    [e] = wait_exits(ex, timeout_s=30)
    assert e.outcome == "succeeded"
    whole = _log(tmp_path, "whole").splitlines()[-1].split()
    split = _log(tmp_path, "split").splitlines()[-1].split()
    assert whole[0] == split[0]  # loss=...: bit-for-bit on the CPU
    assert whole[0].startswith("loss=") and float(whole[0][5:]) < 0.05
    assert split[2] != "resumed_from=0"


# --------------------------------------------------------------------------- fake


def _spec(job_id: str) -> LaunchSpec:
    return LaunchSpec(job_id, 1, ("train",), {}, (0,), Path("/nonexistent") / job_id, False)


def test_fake_executor_outcomes_and_calls() -> None:
    fake = FakeExecutor(exit_after_s=2.0, ignores_sigterm={"stubborn"})
    for job_id in ("ok", "bad", "oom", "polite", "stubborn", "slow", "gone"):
        fake.launch(_spec(job_id), 0.0)
    fake.finish("ok")
    fake.finish("bad", exit_code=3)
    fake.finish("oom", signal_num=signal.SIGKILL)
    fake.vanish("gone")
    fake.preempt("polite", 60.0, 10.0)  # leaves at 12
    fake.preempt("stubborn", 5.0, 10.0)  # killed at 15
    fake.cancel("slow", 1.0, 10.0)  # needs 2 s, has 1: killed at 11
    first = {e.job_id: e.outcome for e in fake.poll(10.0)}
    assert first == {"ok": "succeeded", "bad": "failed", "oom": "oom", "gone": "lost"}
    assert {e.job_id: e.outcome for e in fake.poll(11.0)} == {"slow": "cancelled"}
    assert {e.job_id: e.outcome for e in fake.poll(12.0)} == {"polite": "preempted"}
    assert fake.poll(14.9) == []
    [killed] = fake.poll(15.0)
    assert (killed.job_id, killed.outcome, killed.signal) == ("stubborn", "killed", 9)
    assert killed.reason == "killed by SIGKILL after the 5 s grace period"
    assert fake.handles() == {}
    assert fake.calls[:2] == [("launch", "ok"), ("launch", "bad")]
    assert fake.calls[-3:] == [("preempt", "polite"), ("preempt", "stubborn"), ("cancel", "slow")]
    with pytest.raises(NotFoundError):
        fake.preempt("ok", 1.0, 20.0)


def test_fake_executor_restart_and_adopt() -> None:
    fake = FakeExecutor()
    handle = fake.launch(_spec("a"), 0.0)
    with pytest.raises(ConflictError):
        fake.launch(_spec("a"), 0.0)
    fake.shutdown()
    assert fake.handles() == {}
    assert fake.poll(1.0) == []  # not watched: nothing reported
    assert fake.adopt(handle, Path("/nonexistent/a")) is True
    assert fake.handles() == {"a": handle}
    stranger = Handle("b", 1, 4242, 4242, 7)
    assert fake.adopt(stranger, Path("/nonexistent/b")) is False
    assert [(e.job_id, e.outcome) for e in fake.poll(2.0)] == [("b", "lost")]
    fake.preempt("a", 60.0, 3.0)  # exit_after_s=0: checkpoints and leaves at once
    [e] = fake.poll(3.0)
    assert (e.outcome, e.exit_code) == ("preempted", 0)
    assert ("shutdown", "") in fake.calls and ("adopt", "a") in fake.calls


def test_fake_and_local_agree(ex: LocalExecutor, tmp_path: Path) -> None:
    """The simulator's fake must call the same endings what the live executor calls them."""
    jobs = {"ok": job("pass"), "bad": job("raise SystemExit(4)")}
    jobs |= {"pre": sleeper(EXITS_ON_TERM), "kill": sleeper(IGNORES_TERM)}
    jobs["can"] = sleeper(EXITS_ON_TERM)
    for job_id, argv in jobs.items():
        ex.launch(spec(tmp_path, job_id, argv), 0.0)
    for job_id in ("pre", "kill", "can"):
        ready(tmp_path, job_id)
    ex.preempt("pre", 5.0, time.time())
    ex.preempt("kill", 0.2, time.time())
    ex.cancel("can", 5.0, time.time())
    live = {e.job_id: (e.outcome, e.exit_code, e.signal) for e in wait_exits(ex, len(jobs))}

    fake = FakeExecutor(ignores_sigterm={"kill"})
    for job_id in jobs:
        fake.launch(_spec(job_id), 0.0)
    fake.finish("ok")
    fake.finish("bad", exit_code=4)
    fake.preempt("pre", 5.0, 1.0)
    fake.preempt("kill", 0.2, 1.0)
    fake.cancel("can", 5.0, 1.0)
    simulated = {e.job_id: (e.outcome, e.exit_code, e.signal) for e in fake.poll(2.0)}
    assert simulated == live


def test_classify_reasons() -> None:
    def outcome(**kw: object) -> tuple[str, str]:
        e = classify("j", 1, at_s=0.0, **kw)  # type: ignore[arg-type]
        return e.outcome, e.reason

    assert outcome(exit_code=0, signal_num=None) == ("succeeded", "exited 0")
    assert outcome(exit_code=None, signal_num=6) == ("crashed", "died of SIGABRT")
    assert outcome(exit_code=None, signal_num=None, vanished=True)[0] == "lost"
    stopped = outcome(exit_code=1, signal_num=None, stop_kind="preempt", grace_s=60.0)
    assert stopped == (
        "preempted",
        "exited 1 within the 60 s grace period after SIGTERM for preemption",
    )
    killed = outcome(
        exit_code=None, signal_num=9, stop_kind="preempt", kill_sent=True, grace_s=60.0
    )
    assert killed == ("killed", "killed by SIGKILL after the 60 s grace period")
    # we sent SIGKILL and the shim died with it: no record, no status after a restart
    assert (
        outcome(exit_code=None, signal_num=None, stop_kind="cancel", kill_sent=True, vanished=True)[
            0
        ]
        == "cancelled"
    )
