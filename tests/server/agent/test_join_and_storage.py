"""`gpupool node join`'s pieces without a cluster (the real joins run in
tests/e2e/test_pool_e2e.py): what a node declares, the `ray start` it runs, its labels and
refusals; the shared storage's section and its probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpupool.errors import SpecError
from gpupool.server.agent import join
from gpupool.server.agent.join import (
    RAY_DRAIN_ENV,
    JoinOptions,
    NodeJoin,
    inventory,
    parse_labels,
    ray_command,
    resources,
    running_jobs,
    unreleased_jobs,
)
from gpupool.server.agent.storage import StorageConfig, parse_storage, prepare_shared, probe


def options(tmp_path: Path, **kw: object) -> JoinOptions:
    base: dict[str, object] = {"head": "10.0.0.1:6379", "name": "n7", "node_dir": tmp_path}
    base.update(kw)
    return JoinOptions(**base)  # type: ignore[arg-type]


def test_a_node_declares_its_gpus_site_and_labels(tmp_path: Path) -> None:
    model, count = inventory("4xA100-80GB")
    assert (model, count) == ("A100-80GB", 4)
    opts = options(tmp_path, site="east", labels={"rack": "r7"})
    res = resources(opts, model, count)
    assert res["gpupool_node_n7"] == 1.0 and res["gpupool_model_A100-80GB"] == 1.0
    assert res["gpupool_site_east"] == 1.0 and res["gpupool_label_rack_r7"] == 1.0
    assert sorted(k for k in res if k.startswith("gpupool_n7_gpu")) == [
        f"gpupool_n7_gpu{i}" for i in range(4)
    ]
    argv = ray_command(options(tmp_path, node_ip="10.0.0.7", num_cpus=8), res)
    assert argv[1:5] == ["start", "--block", "--address", "10.0.0.1:6379"]
    assert argv[argv.index("--node-ip-address") + 1] == "10.0.0.7"
    ray_dir = Path(argv[argv.index("--temp-dir") + 1])
    assert ray_dir == join.ray_dir(tmp_path)
    assert len(str(ray_dir)) + join.RAY_SOCKET_SUFFIX <= join.SOCKET_PATH_MAX
    assert argv[argv.index("--num-gpus") + 1] == "0"  # gpupool places GPUs, not Ray
    assert json.loads(argv[argv.index("--resources") + 1]) == res


def test_mixed_models_and_bad_labels_are_refused_with_the_reason() -> None:
    with pytest.raises(SpecError, match="one model"):
        inventory("2xA100-80GB,2xH100-80GB")
    assert parse_labels(["rack=r7", "zone=a-1"]) == {"rack": "r7", "zone": "a-1"}
    for bad in ("rack", "rack=", "=r7", "rack=r 7", "rack=r/7"):
        with pytest.raises(SpecError, match="KEY=VALUE"):
            parse_labels([bad])


def test_running_jobs_are_the_agents_records_whose_shim_lives(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    agent.mkdir()
    me = os.getpid()
    ticks = int(Path(f"/proc/{me}/stat").read_text().rsplit(")", 1)[1].split()[19])
    (agent / "job-7.json").write_text(json.dumps({"job_id": "7", "pid": me, "ticks": ticks}))
    (agent / "job-8.json").write_text(json.dumps({"job_id": "8", "pid": me, "ticks": ticks + 1}))
    assert running_jobs(tmp_path) == ["7"]
    # job 8's shim has ended, but the server has not yet released it (copied its output)
    assert unreleased_jobs(tmp_path) == ["7", "8"]
    (agent / "job-8.json").unlink()  # released
    assert unreleased_jobs(tmp_path) == ["7"]


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this machine has NVIDIA GPUs")
def test_join_without_gpus_says_how_to_try_it(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpupool", "node", "join", "127.0.0.1:1", "--node-dir",
         str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode != 0
    assert "--fake-gpus 4xA100-80GB" in out.stderr, out.stderr
    assert RAY_DRAIN_ENV == "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"


def test_the_storage_section_and_its_probe(tmp_path: Path) -> None:
    assert parse_storage(None, "f.yaml") == StorageConfig()
    shared = parse_storage({"shared_dir": str(tmp_path)}, "f.yaml")
    assert shared.checkpoint_dir(12) == tmp_path / "checkpoints" / "12"
    for bad in ({"shared_dir": "relative/dir"}, {"shared_dir": 3}, {"nfs": "/x"}):
        with pytest.raises(SpecError):
            parse_storage(bad, "f.yaml")
    prepare_shared(tmp_path)
    assert (tmp_path / "checkpoints").stat().st_mode & 0o777 == 0o711
    assert probe(tmp_path, "n1") == ""
    assert list((tmp_path / ".gpupool-probe").iterdir()) == []  # it cleans up
    (tmp_path / "file").touch()  # a path below a file can never be written
    missing = probe(tmp_path / "file" / "below", "n1")
    assert "cannot write and read the shared storage" in missing and "mount it" in missing


def test_a_joined_nodes_fake_inlet_reaches_its_telemetry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpupool node join --fake-inlet 0=45` puts the hot aisle in the node's Ray processes'
    environment; its telemetry actor's fake GPUs breathe it (GPU 1 the room's 30 C)."""
    from gpupool.server.telemetry.ray import FAKE_INLET_ENV, NodeTelemetryActor

    monkeypatch.setenv(FAKE_INLET_ENV, "0=45")
    actor = NodeTelemetryActor("n1", "A100-80GB", 2)
    if actor.source() != "fake":
        pytest.skip("this machine has NVIDIA GPUs: its telemetry is NVML")
    hot, room = actor.sample(0.0)
    assert hot.temp_c >= 45.0 > room.temp_c, (hot, room)
    # and join refuses an inlet without fake GPUs to give it to, or for a GPU it lacks
    for fake, why in ((None, "add --fake-gpus"), ("2xA100-80GB", "has GPUs 0-1")):
        opts = JoinOptions(
            head="127.0.0.1:1", name="n1", node_dir=tmp_path, fake_gpus=fake,
            fake_inlet="0=45" if fake is None else "2=45",
        )  # fmt: skip
        with pytest.raises(SpecError, match=why):
            NodeJoin(opts, say=lambda _line: None).run()


def fake_ray(tmp_path: Path, fails: int) -> Path:
    """A `ray` that fails to start `fails` times (as a raylet whose agents came up too late
    does), then runs until stopped; each try leaves a line in `tries`."""
    script = tmp_path / "ray"
    script.write_text(
        "#!/bin/sh\n"
        f'echo try >> "{tmp_path}/tries"\n'
        f'[ "$(wc -l < "{tmp_path}/tries")" -le {fails} ] && exit 3\n'
        "exec sleep 60\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    return script


def test_ray_that_fails_to_start_is_tried_again_with_a_backoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(join, "START_BACKOFF_S", 0.05)
    said: list[str] = []
    opts = options(tmp_path / "node", fake_gpus="2xA100-80GB", ray=str(fake_ray(tmp_path, fails=2)))
    joined = NodeJoin(opts, say=said.append)
    rc: list[int] = []
    runner = threading.Thread(target=lambda: rc.append(joined.run()))
    runner.start()
    try:
        for _ in range(200):  # bounded: 10 s
            if (tmp_path / "tries").is_file() and len(
                (tmp_path / "tries").read_text().splitlines()
            ) == 3:
                break
            threading.Event().wait(0.05)
    finally:
        joined.leave.set()
        runner.join(40)
    assert rc == [0], said
    retries = [line for line in said if "trying again" in line]
    assert len(retries) == 2, said
    assert "exit 3" in retries[0] and "in 0.05 s (try 2 of 4)" in retries[0], said
    assert "in 0.1 s (try 3 of 4)" in retries[1], said
    assert said[-1].endswith("left the cluster"), said


def test_ray_that_never_starts_ends_the_join_after_its_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(join, "START_BACKOFF_S", 0.01)
    said: list[str] = []
    opts = options(
        tmp_path / "node", fake_gpus="2xA100-80GB", ray=str(fake_ray(tmp_path, fails=99))
    )
    assert NodeJoin(opts, say=said.append).run() == 3
    assert len((tmp_path / "tries").read_text().splitlines()) == join.START_TRIES
    assert said[-1].endswith(f"Ray did not start (exit 3) ({join.START_TRIES} tries); leaving")


def test_a_node_directory_too_deep_for_rays_sockets_gets_a_short_ray_directory(
    tmp_path: Path,
) -> None:
    short = Path("/var/lib/gpupool/n1")
    assert join.ray_dir(short) == short / "ray"
    deep = tmp_path / ("d" * 60) / "node"
    far = join.ray_dir(deep)
    assert far != deep / "ray" and len(str(far)) + join.RAY_SOCKET_SUFFIX <= join.SOCKET_PATH_MAX
    assert join.ray_dir(deep) == far  # the same node directory, the same Ray directory
    join.link_ray_dir(deep)
    try:
        assert (deep / "ray").is_symlink() and (deep / "ray").resolve() == far.resolve()
        join.link_ray_dir(deep)  # again: nothing changes
        assert (deep / "ray").resolve() == far.resolve()
    finally:
        far.rmdir()
