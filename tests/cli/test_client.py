"""The REST client and `gpupool submit|ls|show|cancel|logs|top`, against a fake server.

The fake speaks the server's API version 1 from an in-memory dict through
httpx.MockTransport, so these tests need no network and no running server.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.cli import remote as client_cli
from gpupool.cli.jobs import POLL_S
from gpupool.cli.main import main
from gpupool.cli.nodes import CLEAR
from gpupool.cli.parse import parse_duration
from gpupool.cli.render import printable
from gpupool.client import DEFAULT_URL, AuthError, Client, client_settings
from gpupool.errors import ConflictError, GpupoolError, NotFoundError, SpecError

TERMINAL = {"succeeded", "failed", "cancelled"}


class FakeServer:
    """Just enough of the gpupool server to exercise every client path."""

    def __init__(self) -> None:
        self.jobs: dict[int, dict[str, Any]] = {}
        self.requests: list[httpx.Request] = []
        self.token: str | None = None
        self.forbidden = False
        self.down = False
        self.idempotency: dict[str, int] = {}
        # Per (job, stream): chunks appended to the log, one each time the reader has caught
        # up; when they run out the job succeeds. log_limit caps each answer like ?limit=.
        self.log: dict[tuple[int, str], bytes] = {}
        self.log_script: dict[tuple[int, str], list[bytes]] = {}
        self.log_limit = 1 << 20
        self.cluster: dict[str, Any] = {"nodes": [], "signals": {}, "queue": {}}
        self.events: list[dict[str, Any]] = [
            {"seq": 1, "at_s": 10.0, "kind": "submitted", "job_id": 1, "message": "job 1"}
        ]

    def add_job(self, **fields: Any) -> dict[str, Any]:
        job_id = len(self.jobs) + 1
        job: dict[str, Any] = {
            "id": job_id,
            "name": f"job-{job_id}",
            "team": "default",
            "kind": "batch",
            "priority": 50,
            "gpu_count": 1,
            "gpu_model": None,
            "gpus": [],
            "state": "pending",
            "preempting": False,
            "reason": "",
            "command": ["true"],
            "attempts": 0,
            "preemptions": 0,
            "exit_code": None,
            "submitted_at": time.time() - 65,
            "started_at": None,
            "ended_at": None,
            "checkpoint_every_s": None,
            "grace_s": 30.0,
        }
        job.update(fields)
        self.jobs[job_id] = job
        return job

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.forbidden:
            return httpx.Response(403, json={"detail": "token lacks the admin role"})
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return httpx.Response(401, json={"detail": "missing or invalid token"})
        path, method, q = request.url.path, request.method, request.url.params
        parts = path.strip("/").split("/")
        if path == "/v1/jobs" and method == "POST":
            return self.submit(request)
        if path == "/v1/jobs" and method == "GET":
            jobs = [
                j
                for j in self.jobs.values()
                if q.get("state") in (None, j["state"])
                and q.get("team") in (None, j["team"])
                and int(q.get("after", 0)) < j["id"] < int(q.get("before", 2**31))
            ]
            if q.get("order") == "desc":
                jobs.reverse()
            return httpx.Response(200, json={"jobs": jobs[: int(q.get("limit", 1000))]})
        if path == "/v1/cluster":
            return httpx.Response(200, json=self.cluster)
        if path == "/v1/events":
            after = int(q["after"])
            events = [e for e in self.events if e["seq"] > after]
            return httpx.Response(
                200, json={"events": events, "next": events[-1]["seq"] if events else after}
            )
        if len(parts) >= 3 and parts[:2] == ["v1", "jobs"] and parts[2].isdigit():
            job = self.jobs.get(int(parts[2]))
            if job is None:
                return httpx.Response(404, json={"detail": f"job {parts[2]} does not exist"})
            if len(parts) == 3:
                return httpx.Response(200, json=job)
            if parts[3] == "cancel" and method == "POST":
                return self.cancel(job)
            if parts[3] == "logs":
                return self.logs(job, q.get("stream", "stdout"), int(q.get("offset", "0")))
        return httpx.Response(404, json={"detail": "Not Found"})

    def submit(self, request: httpx.Request) -> httpx.Response:
        spec = json.loads(request.content)
        gpus = spec.get("gpus", 1)
        if gpus < 0:
            problem = {
                "loc": ["body", "gpus"],
                "msg": "Input should be greater than or equal to 0",
                "type": "greater_than_equal",
            }
            return httpx.Response(422, json={"detail": [problem]})
        key = request.headers.get("Idempotency-Key")
        if key in self.idempotency:
            return httpx.Response(200, json=self.jobs[self.idempotency[key]])
        prio = {"low": 10, "normal": 50, "high": 90}.get(spec.get("priority", 50), 50)
        job = self.add_job(
            name=spec.get("name", "job"),
            team=spec.get("team", "default"),
            kind=spec.get("kind", "batch"),
            priority=prio,
            gpu_count=gpus,
            command=spec["command"],
            submitted_at=time.time(),
        )
        if key:
            self.idempotency[key] = job["id"]
        return httpx.Response(201, json=job)

    def cancel(self, job: dict[str, Any]) -> httpx.Response:
        if job["state"] in TERMINAL:
            return httpx.Response(409, json={"detail": f"job {job['id']} already ended"})
        if job["state"] == "running":
            job["preempting"] = True
        else:
            job["state"] = "cancelled"
        return httpx.Response(200, json=job)

    def logs(self, job: dict[str, Any], stream: str, offset: int) -> httpx.Response:
        key = (job["id"], stream)
        script = self.log_script.get(key)
        if script is not None and offset == len(self.log.get(key, b"")):
            if script:
                self.log[key] = self.log.get(key, b"") + script.pop(0)
            else:
                job["state"] = "succeeded"
        data = self.log.get(key, b"")[offset : offset + self.log_limit]
        return httpx.Response(
            200,
            content=data,
            headers={
                "Content-Type": "text/plain; charset=utf-8",
                "X-Log-Offset": str(offset + len(data)),
                "X-Job-State": job["state"],
            },
        )


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeServer:
    """A fake server wired into the CLI, with no settings leaking in from the machine."""
    fake = FakeServer()
    monkeypatch.setattr(client_cli, "TRANSPORT", httpx.MockTransport(fake.handle))
    monkeypatch.setattr(client_cli, "sleep", _no_sleep_after(100))
    for name in ("GPUPOOL_URL", "GPUPOOL_TOKEN", "GPUPOOL_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return fake


def _no_sleep_after(limit: int) -> Any:
    """A sleep that returns at once and fails the test if a loop never ends."""
    calls: list[float] = []

    def fake(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) > limit:
            raise AssertionError(f"still polling after {limit} sleeps")

    fake.calls = calls  # type: ignore[attr-defined]
    return fake


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# ---- submit ---------------------------------------------------------------------------------


def test_submit_sends_the_spec_and_keeps_the_command_after_dashes(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        [
            "submit",
            "--gpus",
            "2",
            "--kind",
            "training",
            "--priority",
            "low",
            "--checkpoint-every",
            "30m",
            "--grace",
            "1m30s",
            "--duration",
            "1h30m",
            "--env",
            "A=1",
            "B=x=y",
            "--env",
            "C=",
            "--team",
            "ml",
            "--",
            "python",
            "train.py",
            "--lr",
            "3e-4",
            "--gpus",
            "8",
        ],
        capsys,
    )
    assert (code, err) == (0, "")
    assert out == "submitted job 1 (pending)\n"
    sent = json.loads(server.requests[-1].content)
    assert sent == {
        "command": ["python", "train.py", "--lr", "3e-4", "--gpus", "8"],
        "kind": "training",
        "team": "ml",
        "gpus": 2,
        "priority": "low",
        "checkpoint_every_s": 1800.0,
        "grace_s": 90.0,
        "duration_s": 5400.0,
        "env": {"A": "1", "B": "x=y", "C": ""},
    }
    # a fresh key per invocation, so the client's own retries cannot make a second job
    assert server.requests[-1].headers["Idempotency-Key"].startswith("cli-")
    assert "Authorization" not in server.requests[-1].headers


def test_submit_json_prints_the_created_job(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["submit", "--priority", "7", "--json", "--", "echo", "hi"], capsys)
    assert code == 0
    job = json.loads(out)
    assert job["id"] == 1 and job["state"] == "pending" and job["command"] == ["echo", "hi"]
    assert json.loads(server.requests[-1].content)["priority"] == 7


def test_submit_idempotency_key_returns_the_same_job(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    first = run(["submit", "--idempotency-key", "k1", "--json", "--", "true"], capsys)
    again = run(["submit", "--idempotency-key", "k1", "--json", "--", "true"], capsys)
    assert json.loads(first[1])["id"] == json.loads(again[1])["id"] == 1
    assert len(server.jobs) == 1
    assert server.requests[-1].headers["Idempotency-Key"] == "k1"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit", "--gpus", "1"], "give the job's command after --"),
        (["submit", "--env", "NOEQUALS", "--", "true"], "--env 'NOEQUALS': use KEY=VALUE"),
        (["submit", "--priority", "urgent", "--", "true"], "--priority 'urgent'"),
        (["submit", "--grace", "10x", "--", "true"], "--grace '10x'"),
        (["submit", "--checkpoint-every", "0", "--", "true"], "more than zero"),
    ],
)
def test_submit_rejects_bad_input_before_sending(
    server: FakeServer, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.startswith("gpupool: error: ") and message in err
    assert server.requests == []


def test_submit_422_lists_the_field_problems(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["submit", "--gpus", "-1", "--", "true"], capsys)
    assert code == 2
    assert "field gpus: Input should be greater than or equal to 0" in err


# ---- ls, show, cancel -----------------------------------------------------------------------


def test_ls_prints_an_aligned_table_and_passes_filters(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    server.add_job(name="train", team="ml", state="running", started_at=now - 3725, gpu_count=2)
    server.add_job(name="etl", team="data", reason="waiting for 4 free GPUs", gpu_model="H100")
    code, out, _ = run(["ls"], capsys)
    assert code == 0
    lines = out.rstrip("\n").split("\n")
    assert lines[0].split() == [
        "id",
        "name",
        "team",
        "kind",
        "prio",
        "GPUs",
        "state",
        "age/runtime",
        "reason",
    ]
    assert len({len(line) for line in lines}) == 1, "columns line up"
    # newest first
    assert "train" in lines[3] and "running" in lines[3] and "1h02m" in lines[3]
    assert "1 x H100" in lines[2] and "pending" in lines[2] and "1m0" in lines[2]
    assert "waiting for 4 free GPUs" in lines[2]

    code, out, _ = run(["ls", "--state", "running", "--team", "ml", "--json"], capsys)
    assert [j["name"] for j in json.loads(out)["jobs"]] == ["train"]
    params = dict(server.requests[-1].url.params)
    assert params == {"state": "running", "team": "ml", "limit": "101", "order": "desc"}

    code, out, _ = run(["ls", "--state", "failed"], capsys)
    assert (code, out) == (0, "no jobs (state failed)\n")


def test_show_json_has_state_and_gpus_and_text_is_readable(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.add_job(
        state="running",
        gpus=[{"node": "n1", "index": 0}, {"node": "n1", "index": 1}],
        gpu_count=2,
        command=["python", "train.py", "--msg", "a b"],
        started_at=time.time() - 10,
        checkpoint_every_s=1800.0,
    )
    code, out, _ = run(["show", "1", "--json"], capsys)
    job = json.loads(out)
    assert code == 0 and job["state"] == "running"
    assert job["gpus"] == [{"node": "n1", "index": 0}, {"node": "n1", "index": 1}]

    code, out, _ = run(["show", "1"], capsys)
    assert out.startswith("job 1  job-1  (running)")
    assert "2 on n1:0, n1:1" in out
    assert "python train.py --msg 'a b'" in out
    assert "every 30m00s" in out


def test_show_unknown_job_is_not_found(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["show", "99"], capsys)
    assert code == 2 and err == "gpupool: error: job 99 does not exist\n"
    fake = httpx.MockTransport(server.handle)
    with Client("http://gpupool.test", transport=fake) as c, pytest.raises(NotFoundError):
        c.job(99)


def test_cancel_pending_running_and_ended_jobs(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.add_job()
    server.add_job(state="running", started_at=time.time())
    code, out, _ = run(["cancel", "1"], capsys)
    assert (code, out) == (0, "job 1 cancelled\n")
    assert server.requests[-1].method == "POST"
    assert server.requests[-1].url.path == "/v1/jobs/1/cancel"
    code, out, _ = run(["cancel", "2", "--json"], capsys)
    assert json.loads(out)["preempting"] is True
    code, out, _ = run(["cancel", "2"], capsys)
    assert "job 2 is stopping (running)" in out
    code, _, err = run(["cancel", "1"], capsys)
    assert code == 2 and "job 1 already ended" in err
    fake = httpx.MockTransport(server.handle)
    with Client("http://gpupool.test", transport=fake) as c, pytest.raises(ConflictError):
        c.cancel(1)


# ---- logs -----------------------------------------------------------------------------------


def test_logs_follow_reads_every_offset_until_the_job_ends(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.add_job(state="running", started_at=time.time())
    chunks = [b"step 1\n", b"", b"step 2 \xc3\xa9t\xc3\xa9\n", b"", b"", b"done\n"]
    server.log_script[(1, "stdout")] = list(chunks)
    server.log_limit = 4  # forces several reads per chunk and cuts 'é' in two
    code, out, _ = run(["logs", "-f", "1"], capsys)
    assert code == 0
    assert out == b"".join(chunks).decode()
    assert server.jobs[1]["state"] == "succeeded"
    offsets = [int(r.url.params["offset"]) for r in server.requests]
    assert offsets == sorted(offsets) and offsets[-1] == len(b"".join(chunks))
    assert 14 in offsets, "the read of bytes 11-15 ends inside 'é' and stops before it"
    assert client_cli.sleep.calls  # type: ignore[attr-defined]
    assert set(client_cli.sleep.calls) == {POLL_S}  # type: ignore[attr-defined]


def test_logs_without_follow_drains_and_stops(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.add_job(state="running", started_at=time.time())
    server.log[(1, "stderr")] = b"warning: a\nwarning: b\n"
    server.log_limit = 5
    code, out, _ = run(["logs", "--stderr", "1"], capsys)
    assert (code, out) == (0, "warning: a\nwarning: b\n")
    assert {r.url.params["stream"] for r in server.requests} == {"stderr"}
    assert client_cli.sleep.calls == []  # type: ignore[attr-defined]


def test_logs_hold_back_a_split_character_until_the_job_ends() -> None:
    state = "running"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=b"ab\xc3", headers={"X-Log-Offset": "3", "X-Job-State": state}
        )

    with Client("http://gpupool.test", transport=httpx.MockTransport(handler)) as c:
        assert c.logs(1) == ("ab", 2, "running")
        state = "failed"
        assert c.logs(1) == ("ab\ufffd", 3, "failed")


# ---- top ------------------------------------------------------------------------------------


def _cluster() -> dict[str, Any]:
    gpu = {
        "uuid": "GPU-x",
        "model": "H100",
        "mem_total_mib": 81920,
        "mem_used_mib": 40960,
        "util_pct": 87.0,
        "temp_c": 61.0,
        "power_w": 420.0,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
        "ecc_uncorrected": 0,
        "healthy": True,
        "problem": "",
        "job_id": 1,
        "reclaimable": False,
    }
    idle = {**gpu, "index": 1, "util_pct": 2.0, "mem_used_mib": 0, "job_id": None}
    return {
        "nodes": [
            {
                "name": "node-a",
                "gpu_model": "H100",
                "healthy": True,
                "gpus": [{**gpu, "index": 0}, {**idle, "reclaimable": True}],
            },
            {
                "name": "node-b",
                "gpu_model": "H100",
                "healthy": True,
                "gpus": [
                    {**idle, "index": 2, "util_pct": None, "power_w": None},
                    {**idle, "index": 3, "healthy": False, "problem": "XID 79"},
                ],
            },
        ],
        "signals": {
            "reclaimable": [1],
            "scale_out": True,
            "mean_util_pct": 44.5,
            "window_s": 300.0,
            "evaluated_at": time.time() - 5,
        },
        "queue": {"pending": 1, "running": 1},
    }


def test_top_once_renders_gpus_jobs_and_signals(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.cluster = _cluster()
    server.add_job(name="train", state="running", gpus=[{"node": "node-a", "index": 0}])
    server.add_job(name="queued", reason="needs 8 GPUs")
    server.add_job(name="old", state="succeeded")
    code, out, _ = run(["top", "--once"], capsys)
    assert code == 0 and CLEAR not in out
    assert "queue: 1 running, 1 pending" in out
    assert "scale-out: YES" in out and "mean util 44.5% over 300 s" in out
    assert "reclaimable GPUs: 1" in out
    rows = {line.split()[0] + line.split()[1]: line for line in out.split("\n") if "node-" in line}
    assert rows.keys() >= {"node-a0", "node-a1", "node-b2", "node-b3"}
    assert (
        "87" in rows["node-a0"] and "40.0/80.0" in rows["node-a0"] and "420/700" in rows["node-a0"]
    )
    assert rows["node-a1"].split()[-2:] == ["yes", "ok"]
    assert "-/700" in rows["node-b2"]
    assert rows["node-b3"].rstrip().endswith("XID 79")
    assert "train" in out and "node-a:0" in out and "needs 8 GPUs" in out
    assert "old" not in out


def test_top_redraws_and_survives_a_server_restart(
    server: FakeServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server.cluster = _cluster()
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        server.down = len(naps) == 1  # the second frame fails, the third recovers
        if len(naps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(client_cli, "sleep", nap)
    code, out, _ = run(["top", "--interval", "0.25"], capsys)
    assert code == 130 and naps == [0.25, 0.25, 0.25]
    frames = out.split(CLEAR)[1:]
    assert len(frames) == 3
    assert "node-a" in frames[0] and "node-a" in frames[2]
    assert "cannot reach the gpupool server" in frames[1] and "retrying" in frames[1]


def test_top_rejects_a_bad_interval(server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["top", "--interval", "0"], capsys)
    assert code == 2 and "--interval" in err


# ---- settings -------------------------------------------------------------------------------


def _config(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_settings_precedence_flags_env_config_default(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert client_settings(None, None) == (DEFAULT_URL, None)
    _config(
        tmp_path / "home/.config/gpupool/config.yaml",
        "url: http://from-config:1\ntoken: config-token\nserve: {port: 9}\n",
    )
    assert client_settings(None, None) == ("http://from-config:1", "config-token")
    monkeypatch.setenv("GPUPOOL_URL", "http://from-env:2")
    assert client_settings(None, None) == ("http://from-env:2", "config-token")
    monkeypatch.setenv("GPUPOOL_TOKEN", "env-token")
    assert client_settings(None, None) == ("http://from-env:2", "env-token")
    assert client_settings("http://flag:3", "flag-token") == ("http://flag:3", "flag-token")
    other = _config(tmp_path / "elsewhere.yaml", "url: http://named:4\n")
    monkeypatch.setenv("GPUPOOL_CONFIG", str(other))
    monkeypatch.delenv("GPUPOOL_URL")
    monkeypatch.delenv("GPUPOOL_TOKEN")
    assert client_settings(None, None) == ("http://named:4", None)


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        (None, NotFoundError, "GPUPOOL_CONFIG names"),
        ("url: [unclosed\n", SpecError, "not valid YAML"),
        ("- a list\n", SpecError, "must be a mapping"),
        ("token: 12345\n", SpecError, "token must be a string"),
    ],
)
def test_bad_config_file_is_a_clear_error(
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    text: str | None,
    error: type[Exception],
    message: str,
) -> None:
    path = tmp_path / "config.yaml"
    if text is not None:
        _config(path, text)
    monkeypatch.setenv("GPUPOOL_CONFIG", str(path))
    with pytest.raises(error, match=message):
        client_settings(None, None)
    assert client_settings("http://flag:1", "t") == ("http://flag:1", "t"), "file not needed"


def test_cli_flags_and_env_reach_the_request(
    server: FakeServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server.token = "s3cret"
    monkeypatch.setenv("GPUPOOL_URL", "http://env-host:9000")
    monkeypatch.setenv("GPUPOOL_TOKEN", "s3cret")
    assert run(["ls"], capsys)[0] == 0
    assert server.requests[-1].url.host == "env-host"
    assert server.requests[-1].headers["Authorization"] == "Bearer s3cret"
    code, _, err = run(["ls", "--url", "http://flag-host:1", "--token", "wrong"], capsys)
    assert code == 2 and "GPUPOOL_TOKEN" in err
    assert server.requests[-1].url.host == "flag-host"
    assert server.requests[-1].headers["Authorization"] == "Bearer wrong"


# ---- errors ---------------------------------------------------------------------------------


def test_401_and_403_say_how_to_pass_a_token(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.token = "s3cret"
    code, _, err = run(["ls"], capsys)
    assert code == 2
    assert "missing or invalid token" in err and "GPUPOOL_TOKEN" in err and "--token" in err
    assert run(["ls", "--token", "s3cret"], capsys)[0] == 0
    server.forbidden = True
    fake = httpx.MockTransport(server.handle)
    with (
        Client("http://gpupool.test", transport=fake) as c,
        pytest.raises(AuthError, match=r"token lacks the admin role.*GPUPOOL_TOKEN"),
    ):
        c.jobs()


def test_connection_refused_names_the_url_and_the_fix(
    server: FakeServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with Client(url, timeout_s=2) as c, pytest.raises(GpupoolError) as caught:
        c.job(1)
    assert str(caught.value) == (
        f"cannot reach the gpupool server at {url}; is `gpupool serve` running? "
        "set GPUPOOL_URL (or --url) to its address"
    )
    monkeypatch.setattr(client_cli, "TRANSPORT", None)
    code, _, err = run(["show", "1", "--url", url], capsys)
    assert code == 2 and err.startswith(f"gpupool: error: cannot reach the gpupool server at {url}")


def _answering(status: int, **kwargs: Any) -> Client:
    return Client(
        "http://gpupool.test",
        transport=httpx.MockTransport(lambda request: httpx.Response(status, **kwargs)),
    )


def test_server_errors_and_protocol_surprises() -> None:
    with pytest.raises(GpupoolError, match=r"server error 500 on GET /v1/cluster: boom"):
        _answering(500, text="boom").cluster()
    with pytest.raises(GpupoolError, match=r"server error 503.*draining") as caught:
        _answering(503, json={"detail": "draining"}).job(1)
    assert type(caught.value) is GpupoolError
    with pytest.raises(NotFoundError, match="has no GET /v1/cluster; is it a gpupool server"):
        _answering(404, json={"detail": "Not Found"}).cluster()
    with pytest.raises(GpupoolError, match="without a JSON object"):
        _answering(200, text="<html>").cluster()
    with pytest.raises(GpupoolError, match="X-Log-Offset"):
        _answering(200, text="hi").logs(1)
    with pytest.raises(SpecError, match="unknown state"):
        _answering(422, json={"detail": "unknown state"}).jobs(state="x")
    with pytest.raises(SpecError, match=r"(?m)^  field state: unknown state bogus$"):
        problem = {"loc": ["query", "state"], "msg": "unknown state bogus"}
        _answering(422, json={"detail": [problem]}).jobs(state="bogus")
    with pytest.raises(SpecError, match="must start with http"):
        Client("localhost:8642")


def test_events_and_jobs_query(server: FakeServer) -> None:
    with Client("http://gpupool.test/", transport=httpx.MockTransport(server.handle)) as c:
        assert c.events(after=0, wait_s=1.5)["next"] == 1
        assert dict(server.requests[-1].url.params) == {"after": "0", "wait": "1.5"}
        assert c.events(after=1) == {"events": [], "next": 1}
        assert c.jobs(limit=5) == []
        assert dict(server.requests[-1].url.params) == {"limit": "5"}


# ---- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45s", 45.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1d2h3m4s", 93784.0),
        ("1.5h", 5400.0),
        ("90", 90.0),
        ("2.5", 2.5),
        (" 2H ", 7200.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["10x", "", "h", "30m1h", "1h1h", "1h 30m", "-5", "0", "0s", "nan", "inf", "5ms"]
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(SpecError, match="--grace"):
        parse_duration(text, "--grace")


def test_zero_grace_is_allowed_but_not_negative() -> None:
    assert parse_duration("0", "--grace", allow_zero=True) == 0.0
    with pytest.raises(SpecError, match="zero or more"):
        parse_duration("-1", "--grace", allow_zero=True)
    with pytest.raises(SpecError, match="use a number"):
        parse_duration("", "--grace", allow_zero=True)


# ---- retries and escaping -------------------------------------------------------------------


def test_submit_retries_a_lost_answer_with_the_same_key(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = server.handle
    lost: list[int] = []

    def drop_first(request: httpx.Request) -> httpx.Response:
        resp = answer(request)  # the server acts...
        if request.method == "POST" and not lost:
            lost.append(resp.status_code)
            raise httpx.ReadError("connection reset", request=request)  # ...its answer is lost
        return resp

    client_cli.TRANSPORT = httpx.MockTransport(drop_first)
    code, out, err = run(["submit", "--json", "--", "true"], capsys)
    assert (code, err) == (0, "") and json.loads(out)["id"] == 1
    keys = [r.headers["Idempotency-Key"] for r in server.requests]
    assert len(keys) == 2 and keys[0] == keys[1] and lost == [201]
    assert len(server.jobs) == 1


def test_submit_gives_up_naming_the_key_to_rerun_with(
    server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.down = True
    code, _, err = run(["submit", "--idempotency-key", "k9", "--", "true"], capsys)
    assert code == 2 and len(server.requests) == 4
    assert "cannot reach" in err


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain name-1", "plain name-1"),
        ("\x1b[2Jx", "\\x1b[2Jx"),
        ("a\nb\tc\rd", "a\\nb\\tc\\rd"),
        ("\x9b31m", "\\x9b31m"),  # the one-byte C1 escape
        ("evil\u202etxt.exe", "evil\\u202etxt.exe"),
        ("caf\u00e9 \u65e5\u672c", "caf\u00e9 \u65e5\u672c"),
    ],
)
def test_printable_escapes_controls_and_keeps_text(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_the_terminal_state_names_are_the_ones_the_server_stores() -> None:
    from gpupool.domain.lifecycle import STATE_NAMES, TERMINAL_NAMES
    from gpupool.server.store.states import STATE_OF
    from gpupool.server.store.states import TERMINAL as STORED_TERMINAL

    assert STATE_NAMES == STATE_OF
    assert TERMINAL_NAMES == STORED_TERMINAL == TERMINAL
