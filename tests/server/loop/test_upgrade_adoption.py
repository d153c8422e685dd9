"""Running jobs survive the upgrade to the folder layout: a server of this tree adopts a job
that the server of the release before it started.

That job's shim runs under the old module name (`gpupool.service.shim`), from the old
package's directory, and the old server's code wrote its launch intent, handle and exit
files. The previous release is this repository at PREVIOUS_RELEASE (the last commit with
the old module names), unpacked with `git archive` and run with the same dependencies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpupool.examples.ckpt_counter import expected_result
from service_proc import HTTP, ROOT, Server, free_port, wait_for

PREVIOUS_RELEASE = "7498918"
"""The last commit whose modules are gpupool.service.* (the layout before the folders)."""
OLD_SHIM = "gpupool.service.shim"
STEPS = 5


def previous_release_source(into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE, "src"],
        capture_output=True,
        check=True,
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    src = into / "src"
    assert (src / "gpupool" / "service" / "shim.py").is_file(), "not the old layout"
    return src


def shims_named(module: str, run_dir: Path) -> list[int]:
    """Live processes whose command line names `module` and the job's run directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if module in argv and any(str(run_dir) in a for a in argv):
            found.append(int(entry.name))
    return found


def test_a_job_the_previous_release_started_is_adopted_not_run_twice(tmp_path: Path) -> None:
    old_src = previous_release_source(tmp_path / "previous")
    state = tmp_path / "state"
    go = tmp_path / "go"
    port = free_port()
    args = ("--fake-gpus", "1xA100-80GB", "--auth", "none", "--cycle", "0.2", "--sample", "0.5")
    counter = [sys.executable, "-m", "gpupool.examples.ckpt_counter"]
    counter += ["--steps", str(STEPS), "--step-s", "0.05", "--every", "2"]
    gate = (  # the job waits for the new server before it counts (at most 120 s)
        'echo waiting; i=0; while [ ! -e "$1" ] && [ $i -lt 1200 ]; do sleep 0.1; '
        'i=$((i+1)); done; shift; exec "$@"'
    )
    spec = {"command": ["sh", "-c", gate, "sh", str(go), *counter], "team": "research"}

    old = Server(state, *args, port=port, env={**os.environ, "PYTHONPATH": str(old_src)})
    old.start()
    try:
        job_id = HTTP.post(f"{old.url}/v1/jobs", json=spec).json()["id"]
        job_url = f"{old.url}/v1/jobs/{job_id}"
        wait_for(
            lambda: "waiting" in HTTP.get(f"{job_url}/logs").text,
            60,
            "the job to run under the previous release",
        )
    finally:
        old.kill()  # the server goes; its job runs on
    run_dir = state / "jobs" / str(job_id)
    old_shims = shims_named(OLD_SHIM, run_dir)
    assert old_shims, "the previous release's shim runs the job under its old module name"

    new = Server(state, *args, port=port).start()
    try:
        url = f"{new.url}/v1/jobs/{job_id}"
        wait_for(lambda: HTTP.get(url).json()["state"] == "running", 30, "the adopted job to run")
        assert shims_named(OLD_SHIM, run_dir) == old_shims, "the same process, not a relaunch"
        go.touch()
        wait_for(lambda: HTTP.get(url).json()["state"] == "succeeded", 120, "the job to end")
        job = HTTP.get(url).json()
        assert job["attempts"] == 1 and job["preemptions"] == 0, job
        log = HTTP.get(f"{url}/logs").text
        results = [ln for ln in log.splitlines() if ln.startswith("result=")]
        assert len(results) == 1, log  # it ran once
        assert int(results[0].split()[0].split("=")[1]) == expected_result(STEPS)
        events = HTTP.get(f"{url}/events").json()["events"]
        assert "adopted" in {e["kind"] for e in events}, events
    finally:
        new.stop()


def test_the_old_cloud_node_module_still_runs_and_says_where_it_moved() -> None:
    """Users' sites files run `python -m gpupool.service.cloud_node`: it works for a
    release, with a deprecation message naming the new module."""
    old = subprocess.run(
        [sys.executable, "-m", "gpupool.service.cloud_node", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    new = subprocess.run(
        [sys.executable, "-m", "gpupool.server.fleet.cloud_node", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert old.returncode == 0 == new.returncode, old.stderr
    assert old.stdout == new.stdout
    assert "deprecated" in old.stderr and "gpupool.server.fleet.cloud_node" in old.stderr
