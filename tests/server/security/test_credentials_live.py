"""Credentials and the command line against real servers on 127.0.0.1: uvicorn serving the
app in a thread (paging, retries through a proxy that drops an answer, escaping), and a
`gpupool serve` process with TLS and a connection limit, driven by the CLI over https."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from gpupool.cli import remote as client_cli
from gpupool.cli.main import main
from gpupool.client import Client
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store, database_url
from service_proc import free_port

IO_TIMEOUT_S = 10.0


@pytest.fixture(autouse=True)
def plain_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[float]:
    """No settings from the machine, the real transport, and no real waits between retries."""
    for name in ("GPUPOOL_URL", "GPUPOOL_TOKEN", "GPUPOOL_CONFIG", "GPUPOOL_CA_CERT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(client_cli, "TRANSPORT", None)
    naps: list[float] = []
    monkeypatch.setattr(client_cli, "sleep", naps.append)
    return naps


@contextmanager
def served(tmp_path: Path) -> Iterator[tuple[str, Store, str]]:
    """The API with auth on, served by uvicorn on 127.0.0.1 in a thread: (url, store,
    admin token)."""
    store = Store(database_url(None, tmp_path / "db"))
    store.migrate()
    service = LiveService(
        LiveConfig(state_dir=tmp_path / "state", sample_s=0.0, host="h"),
        store,
        FakeExecutor(),
        FakeTelemetry("2xA100-80GB"),
        ManualClock(1_000.0),
    )
    admin = store.auth.create_token("admin", None, time.time())
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(service, store, auth=True), host="127.0.0.1", port=port, log_level="error"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + IO_TIMEOUT_S
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", store, admin
    finally:
        server.should_exit = True
        thread.join(IO_TIMEOUT_S)
        store.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- paging ---------------------------------------------------------------------------------
def test_ls_all_pages_through_every_job_newest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with served(tmp_path) as (url, store, admin):
        n = 1_205
        store.jobs.submit_many(
            [NewJob(f"j{i}", "nlp", "batch", 50, 0, ("true",)) for i in range(n)], time.time()
        )
        code, out, _ = cli(capsys, "ls", "--all", "--json", "--url", url, "--token", admin)
        assert code == 0
        ids = [j["id"] for j in json.loads(out)["jobs"]]
        assert ids == list(range(n, 0, -1))
        code, out, _ = cli(capsys, "ls", "--url", url, "--token", admin)
        lines = out.splitlines()
        assert lines[2].split()[:2] == [f"{n:,}", f"j{n - 1}"]  # the newest first
        assert len(lines) == 2 + 100 + 1 and "more exist: --limit N or --all" in lines[-1]
        code, out, _ = cli(
            capsys, "ls", "--oldest-first", "--limit", "3", "--json", "--url", url, "--token", admin
        )
        assert [j["id"] for j in json.loads(out)["jobs"]] == [1, 2, 3]
        assert json.loads(out)["more"] is True
        code, out, _ = cli(capsys, "top", "--once", "--all", "--url", url, "--token", admin)
        assert code == 0 and sum(1 for x in out.splitlines() if " pending " in x) == n


# ---- a submit retried with its key makes one job --------------------------------------------
class DroppingProxy:
    """A TCP proxy in front of a server that passes the first `drop` POSTs on, reads the
    server's answer and closes the client's connection without it: an answer lost on the
    way back, after the server acted."""

    def __init__(self, upstream_port: int, drop: int = 1) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.drop = drop
        self.requests: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stopping = True
        self.thread.join(IO_TIMEOUT_S)
        self.listener.close()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(IO_TIMEOUT_S)
        with conn:
            for _ in range(100):
                request = _read_message(conn)
                if request is None:
                    return
                self.requests.append(request)
                with socket.create_connection(self.upstream, timeout=IO_TIMEOUT_S) as up:
                    up.sendall(request)
                    answer = _read_message(up)
                if answer is None:
                    return
                if request.startswith(b"POST") and self.drop > 0:
                    self.drop -= 1
                    return  # the server made the job; its answer never arrives
                conn.sendall(answer)


def _read_message(sock: socket.socket) -> bytes | None:
    """One HTTP/1.1 message with a Content-Length body (or none), or None at EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    found = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    length = int(found.group(1)) if found else 0
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_submit_whose_answer_is_lost_is_retried_into_one_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], plain_settings: list[float]
) -> None:
    with served(tmp_path) as (url, store, admin):
        proxy = DroppingProxy(int(url.rsplit(":", 1)[1]))
        try:
            code, out, err = cli(
                capsys, "submit", "--team", "nlp", "--json", "--url", proxy.url, "--token", admin,
                "--", "python", "train.py",
            )  # fmt: skip
        finally:
            proxy.close()
        assert (code, err) == (0, "")
        posts = [r for r in proxy.requests if r.startswith(b"POST /v1/jobs")]
        keys = {re.search(rb"(?im)^idempotency-key:\s*(\S+)", r).group(1) for r in posts}  # type: ignore[union-attr]
        assert len(posts) == 2 and len(keys) == 1, "retried once, with the same key"
        assert plain_settings == [0.5]  # one back-off before the retry
        assert [j.id for j in store.jobs.list()] == [json.loads(out)["id"]]

        # the same key from two calls of the client: one job, the second answer says so
        with Client(url, admin) as c:
            first = c.submit({"command": ["x"], "team": "cv"}, "key-1")
            again = c.submit({"command": ["x"], "team": "cv"}, "key-1")
        assert first == again and len(store.jobs.list()) == 2


def test_a_lost_answer_tells_the_key_to_retry_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with served(tmp_path) as (url, store, admin):
        proxy = DroppingProxy(int(url.rsplit(":", 1)[1]), drop=10)
        try:
            code, _, err = cli(
                capsys, "submit", "--team", "nlp", "--idempotency-key", "k-7", "--url", proxy.url,
                "--token", admin, "--", "true",
            )  # fmt: skip
        finally:
            proxy.close()
        assert code == 2
        assert "rerun with --idempotency-key k-7" in err and "try again" not in err
        assert len(store.jobs.list()) == 1  # four tries, one job


# ---- control characters ---------------------------------------------------------------------
def test_terminal_escapes_in_names_and_commands_are_shown_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with served(tmp_path) as (url, _store, admin):
        name = "\x1b[2J\x1b[31mowned\u202e"
        with Client(url, admin) as c:
            job = c.submit(
                {"name": name, "team": "nlp", "command": ["echo", "\x1b]0;title\x07", "a\nb"]}
            )
        for argv in (("ls",), ("show", str(job["id"])), ("top", "--once")):
            code, out, _ = cli(capsys, *argv, "--url", url, "--token", admin)
            assert code == 0
            assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out, argv
            assert "\\x1b[2J\\x1b[31mowned\\u202e" in out, argv
        _, out, _ = cli(capsys, "show", str(job["id"]), "--url", url, "--token", admin)
        assert "\\x1b]0;title\\x07" in out and "a\\nb" in out
        _, out, _ = cli(capsys, "show", str(job["id"]), "--json", "--url", url, "--token", admin)
        assert json.loads(out)["name"] == name  # JSON carries the name as it is


# ---- TLS and the connection limit, with `gpupool serve` -------------------------------------
def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost and its key, made for this test."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.fail("neither the cryptography package nor openssl can make a certificate")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    built = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(built.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key


@contextmanager
def tls_server(tmp_path: Path, cert: Path, key: Path, *args: str) -> Iterator[tuple[str, str]]:
    """`gpupool serve` over https on 127.0.0.1: (url, the admin token it printed)."""
    port = free_port()
    log = tmp_path / "server.log"
    cmd = [
        sys.executable, "-m", "gpupool", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--state-dir", str(tmp_path / "state"), "--fake-gpus", "1xA100-80GB",
        "--tls-cert", str(cert), "--tls-key", str(key), "--no-isolation", *args,
    ]  # fmt: skip
    # --no-isolation: the jobs would run this test's interpreter, under /root (0700).
    url = f"https://127.0.0.1:{port}"
    trust = ssl.create_default_context(cafile=str(cert))
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"no https answer: {log.read_text()}"
            try:
                if httpx.get(f"{url}/healthz", verify=trust, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        found = re.search(r"admin token \(shown once, keep it\): (gp_\S+)", log.read_text())
        assert found, log.read_text()
        assert f"export GPUPOOL_URL={url}" in log.read_text()
        assert f"dashboard: {url}/" in log.read_text()
        yield url, found.group(1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_the_cli_over_tls_and_the_connection_limit(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    plain_settings: list[float],
) -> None:
    naps = plain_settings
    cert, key = self_signed(tmp_path)
    with tls_server(tmp_path, cert, key, "--limit-concurrency", "2") as (url, admin):
        ca = ("--ca-cert", str(cert))
        code, out, err = cli(
            capsys, "token", "create", "nlp-bot", "--team", "nlp", "--expires", "1h", "--json",
            "--url", url, "--token", admin, *ca,
        )  # fmt: skip
        assert code == 0, err
        made = json.loads(out)
        assert made["role"] == "team" and made["expires_at"] > time.time() + 3500
        monkeypatch.setenv("GPUPOOL_CA_CERT", str(cert))
        code, out, err = cli(capsys, "submit", "--url", url, "--token", made["token"], "--", "true")
        assert (code, err) == (0, "") and out.startswith("submitted job 1")
        code, out, _ = cli(capsys, "ls", "--url", url, "--token", made["token"])
        assert code == 0 and "nlp" in out.splitlines()[2]
        code, out, _ = cli(capsys, "audit", "--url", url, "--token", admin, "--by", "nlp-bot")
        assert code == 0 and "POST /v1/jobs" in out and "201" in out
        code, out, _ = cli(capsys, "token", "ls", "--url", url, "--token", admin)
        assert "nlp-bot" in out and made["token"] not in out
        code, out, _ = cli(capsys, "token", "revoke", "nlp-bot", "--url", url, "--token", admin)
        assert code == 0 and "revoked" in out
        code, _, err = cli(capsys, "ls", "--url", url, "--token", made["token"])
        assert code == 2 and "revoked" in err

        monkeypatch.delenv("GPUPOOL_CA_CERT")  # the system store does not know this CA
        code, _, err = cli(capsys, "ls", "--url", url, "--token", admin)
        assert code == 2 and "does not trust" in err and "--ca-cert" in err
        code, _, err = cli(capsys, "submit", "--url", url, "--token", admin, "--", "true")
        assert code == 2 and "does not trust" in err
        assert naps == [], "an untrusted certificate is not retried"

        # two connections held by long polls (the limit); a third is turned away with 503
        trust = ssl.create_default_context(cafile=str(cert))
        auth = {"Authorization": f"Bearer {admin}"}
        after = httpx.get(f"{url}/v1/events", headers=auth, verify=trust).json()["next"]
        answers: list[int] = []

        def poll() -> None:
            r = httpx.get(
                f"{url}/v1/events",
                params={"after": after + 1000, "wait": 3},
                headers=auth,
                verify=trust,
                timeout=IO_TIMEOUT_S,
            )
            answers.append(r.status_code)

        polls = [threading.Thread(target=poll) for _ in range(2)]
        for t in polls:
            t.start()
        time.sleep(1.0)  # they are connected and waiting
        assert httpx.get(f"{url}/healthz", verify=trust).status_code == 503
        for t in polls:
            t.join(IO_TIMEOUT_S)
        assert answers == [200, 200]
        assert httpx.get(f"{url}/healthz", verify=trust).status_code == 200


def test_serve_refuses_half_a_tls_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert, _ = self_signed(tmp_path)
    code, _, err = cli(capsys, "serve", "--state-dir", str(tmp_path), "--tls-cert", str(cert))
    assert code == 2 and "--tls-cert and --tls-key go together" in err
    missing = str(tmp_path / "nope.pem")
    code, _, err = cli(
        capsys, "serve", "--state-dir", str(tmp_path), "--tls-cert", str(cert), "--tls-key", missing
    )
    assert code == 2 and "nope.pem" in err
    assert os.path.exists(cert)
