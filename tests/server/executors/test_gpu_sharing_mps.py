"""Enforcing GPU shares: MPS per card where the driver has it, the share told otherwise."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

from gpupool.domain.model import JobKind
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.base import Handle, LaunchSpec
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.executors.files import job_environment
from gpupool.server.executors.mps import (
    FakeMps,
    Mps,
    NoMps,
    ShareRequest,
    SystemMps,
    detect_mps,
    share_env,
)
from gpupool.server.isolation.containment import FakeUsers, Isolation, IsolationConfig
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig, one_team_per_card
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store

SHARE = ShareRequest(device_index=3, device_uuid="GPU-abc", gpu_milli=229, mem_mib=18432)


def test_without_mps_the_job_is_told_its_share_and_nothing_is_enforced() -> None:
    env = share_env(SHARE, NoMps())
    assert env == {
        "GPUPOOL_GPU_SHARE": "0.229",
        "GPUPOOL_GPU_MEM_MIB": "18432",
        "GPUPOOL_GPU_SHARE_ENFORCED": "advisory",
    }


def test_with_mps_one_daemon_per_card_and_the_limits_in_the_client_env(tmp_path: Path) -> None:
    mps = FakeMps(tmp_path / "mps")
    env = share_env(SHARE, mps)
    pipe = str(tmp_path / "mps" / "gpu3" / "pipe")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=18432M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "23"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-abc"  # the daemon renumbers: name it by UUID
    assert env["GPUPOOL_GPU_SHARE_ENFORCED"] == "mps"
    share_env(ShareRequest(3, "GPU-abc", 500, 40000), mps)  # a second sharer: same daemon
    share_env(ShareRequest(4, "GPU-def", 500, 40000), mps)  # another card: its own
    assert [s["CUDA_VISIBLE_DEVICES"] for s in mps.starts] == ["GPU-abc", "GPU-def"]
    assert (tmp_path / "mps" / "gpu3" / "log").is_dir()
    mps.close()
    assert sorted(s["CUDA_MPS_PIPE_DIRECTORY"] for s in mps.stops) == [
        pipe,
        str(tmp_path / "mps" / "gpu4" / "pipe"),
    ]


def test_system_mps_runs_the_control_daemon_and_quits_it(tmp_path: Path) -> None:
    record = tmp_path / "calls.txt"
    tool = tmp_path / "nvidia-cuda-mps-control"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "args=$* visible=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY '
        f'stdin=$(cat)" >> {record}\n'
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    mps = detect_mps(tmp_path / "mps", real_gpus=True, which=lambda name: str(tool))
    assert isinstance(mps, SystemMps)
    share_env(SHARE, mps)
    mps.close()
    lines = record.read_text().splitlines()
    pipe = tmp_path / "mps" / "gpu3" / "pipe"
    assert lines == [
        f"args=-d visible=GPU-abc pipe={pipe} stdin=",
        f"args= visible=GPU-abc pipe={pipe} stdin=quit",
    ]


def test_no_mps_on_a_fake_fleet_or_without_the_driver_tool(tmp_path: Path) -> None:
    assert isinstance(detect_mps(tmp_path, real_gpus=False, which=lambda n: "/x"), NoMps)
    assert isinstance(detect_mps(tmp_path, real_gpus=True, which=lambda n: None), NoMps)


def test_an_mps_client_sees_its_card_by_uuid() -> None:
    spec = LaunchSpec("1", 1, ("true",), {}, (3,), Path("/tmp/r"), False, visible_devices="GPU-a")
    assert job_environment(spec, {})["CUDA_VISIBLE_DEVICES"] == "GPU-a"
    whole = LaunchSpec("2", 1, ("true",), {}, (3, 4), Path("/tmp/r"), False)
    assert job_environment(whole, {})["CUDA_VISIBLE_DEVICES"] == "3,4"


class RecordingExecutor(FakeExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.specs: dict[str, LaunchSpec] = {}

    def launch(self, spec: LaunchSpec, now_s: float) -> Handle:
        self.specs[spec.job_id] = spec
        return super().launch(spec, now_s)


def sharing_service(
    tmp_path: Path, executor: RecordingExecutor, mps: Mps
) -> tuple[Store, LiveService]:
    """A live service on one fake A100-80GB with this executor and MPS."""
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.migrate()
    service = LiveService(
        LiveConfig(tmp_path / "state", LIVE_DEFAULTS, sample_s=0.0, host="h"),
        store,
        executor,
        FakeTelemetry("1xA100-80GB"),
        ManualClock(1000.0),
        mps=mps,
    )
    return store, service


def test_the_live_service_gives_a_sharing_job_its_mps_limits(tmp_path: Path) -> None:
    executor = RecordingExecutor()
    mps = FakeMps(tmp_path / "mps")
    store, service = sharing_service(tmp_path, executor, mps)
    try:
        share = store.jobs.submit(
            NewJob("s", "ml", JobKind.ONLINE.value, 0, 1, ("true",), gpu_mem_mib=18 * 1024),
            1000.0,
        )[0]
        whole = store.jobs.submit(NewJob("w", "ml", "training", 0, 1, ("true",)), 1000.0)[0]
        service.step()
        env = executor.specs[str(share.id)].env
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=18432M"
        assert env["GPUPOOL_GPU_MEM_MIB"] == "18432"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "23"
        assert str(whole.id) not in executor.specs  # training may not join an online share
    finally:
        service.stop()
    assert len(mps.stops) == 1  # the daemon is quit with the service


def test_the_daemon_directories_are_reachable_by_the_job_users(tmp_path: Path) -> None:
    """Jobs run as their teams' users; a client that cannot reach the pipe runs without
    MPS (on an H200 it then took twice its memory limit), so the directories are 0711
    even under the server's 0077 umask."""
    old = os.umask(0o077)
    try:
        share_env(SHARE, FakeMps(tmp_path / "mps"))
    finally:
        os.umask(old)
    for d in ("mps", "mps/gpu3", "mps/gpu3/pipe", "mps/gpu3/log"):
        assert stat.S_IMODE((tmp_path / d).stat().st_mode) == 0o711, d


class IsolatedExecutor(RecordingExecutor):
    """Runs each team's jobs as the team's own user (the server as root)."""

    def __init__(self) -> None:
        super().__init__()
        self.isolation = Isolation(IsolationConfig(enabled=True), is_root=True, users=FakeUsers())


def serve_shares(tmp_path: Path, executor: RecordingExecutor, mps: Mps) -> list[str]:
    """Three 10 GiB online shares on one A100-80GB, of teams ml, cv and ml: which start."""
    store, service = sharing_service(tmp_path, executor, mps)
    try:
        names = {}
        for name, team in (("a", "ml"), ("b", "cv"), ("c", "ml")):
            job = NewJob(name, team, JobKind.ONLINE.value, 0, 1, ("true",), gpu_mem_mib=10240)
            names[str(store.jobs.submit(job, 1000.0)[0].id)] = name
        service.step()
        service.step()
        return sorted(names[j] for j in executor.specs)
    finally:
        service.stop()


def test_with_mps_and_team_users_a_card_is_shared_by_one_team_only(tmp_path: Path) -> None:
    """MPS serves one user per card at a time: a cv job next to ml's would sit in CUDA's
    start-up until ml's had ended, so the core keeps it off that card."""
    assert serve_shares(tmp_path, IsolatedExecutor(), FakeMps(tmp_path / "mps")) == ["a", "c"]


def test_one_user_or_no_mps_lets_teams_share_a_card(tmp_path: Path) -> None:
    assert serve_shares(tmp_path / "one-user", RecordingExecutor(), FakeMps(tmp_path / "m")) == [
        "a",
        "b",
        "c",
    ]
    assert serve_shares(tmp_path / "advisory", IsolatedExecutor(), NoMps()) == ["a", "b", "c"]


def test_the_file_decides_one_team_per_card_when_it_says() -> None:
    forced = dataclasses.replace(
        LIVE_DEFAULTS, sharing=dataclasses.replace(LIVE_DEFAULTS.sharing, one_team_per_card=False)
    )
    isolation = Isolation(IsolationConfig(enabled=True), is_root=True, users=FakeUsers())
    mps = FakeMps(Path("/nonexistent"))
    assert one_team_per_card(forced, mps, isolation).sharing.one_team_per_card is False
    assert one_team_per_card(LIVE_DEFAULTS, mps, isolation).sharing.one_team_per_card is True
    assert one_team_per_card(LIVE_DEFAULTS, mps, None).sharing.one_team_per_card is False
