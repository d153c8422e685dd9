"""The dashboard in a real headless Chromium against a real `gpupool serve` (fake fleet of
2 x A100-80GB and 1 x H100 on 127.0.0.1, tokens on).

On the service: alpha's and beta's jobs run (each prints a line), a second beta job waits
(beta's maximum of A100s is 1: reason QuotaMax), and the service `chat` serves with one
replica on the H100 (30 requests sent to it give it a measured rate and p99). Signed in
with the admin token, every panel shows this data, no console error is logged and the page
asks no host but the server; the screenshot is bench/results/dashboard.png. Signed in with
alpha's token, beta's job shows its history but its logs are refused with the API's
sentence (and none of its output appears), while alpha's own job shows its output.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from browser import chromium, screenshot, watch
from service_proc import HTTP, Server, wait_for

pytestmark = pytest.mark.slow  # ~30 s: a server, a replica and a browser

CONFIG = """\
teams:
  - {name: alpha, guaranteed: {A100-80GB: 1}}
  - {name: beta, max: {A100-80GB: 1}}
  - {name: web}
windows:
  - {from: "00:00", to: "24:00", teams: {alpha: {guaranteed: 0.5}}}
online_reserve: 0
preemption: {min_runtime_s: 0}
"""
ALPHA_SAYS = "alpha-output: 42"
BETA_SAYS = "beta-output: 42"
"""What each job prints; its command (which every token may see) says $((6*7)) instead."""
UI_TIMEOUT_MS = 10_000
REQUESTS = 30
"""Requests sent to the replica before the browser looks (each 5-40 ms)."""


@dataclass
class Live:
    server: Server
    admin: str
    alpha: str
    beta: str
    nodes: list[str]
    alpha_job: int
    beta_job: int
    waiting_job: int

    def get(self, path: str, **params: Any) -> Any:
        r = HTTP.get(f"{self.server.url}{path}", params=params, headers=_auth(self.admin))
        r.raise_for_status()
        return r.json()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _job(url: str, token: str, team: str) -> int:
    body = {
        "command": ["sh", "-c", f"echo {team}-output: $((6*7)); exec sleep 120"],
        "name": f"{team}-train",
        "team": team,
        "gpu_model": "A100-80GB",
        "grace_s": 1,
    }
    r = HTTP.post(f"{url}/v1/jobs", json=body, headers=_auth(token))
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("dashboard")
    (tmp / "service.yaml").write_text(CONFIG, encoding="utf-8")
    server = Server(
        tmp / "state",
        "--fake-gpus",
        "2xA100-80GB,1xH100",
        "--config",
        str(tmp / "service.yaml"),
        "--cycle",
        "0.2",
        "--sample",
        "0.5",
        "--monitor",
        "2",
    ).start()
    admin = ""
    try:
        found = re.search(r"admin token \(shown once, keep it\): (gp_\S+)", server.log.read_text())
        assert found, server.log.read_text()
        admin = found.group(1)
        url = server.url
        team_tokens = {}
        for team in ("alpha", "beta"):
            r = HTTP.post(
                f"{url}/v1/tokens",
                json={"name": f"{team}-bot", "team": team},
                headers=_auth(admin),
            )
            assert r.status_code == 201, r.text
            team_tokens[team] = r.json()["token"]
        alpha_job = _job(url, team_tokens["alpha"], "alpha")
        beta_job = _job(url, team_tokens["beta"], "beta")
        waiting_job = _job(url, team_tokens["beta"], "beta")
        made = HTTP.post(
            f"{url}/v1/services",
            json={
                "name": "chat",
                "team": "web",
                "model": "llama-3-8b",
                "gpu_model": "H100",
                "gpu_mem_mib": 16384,
                "min_replicas": 1,
                "max_replicas": 2,
                "slo_p99_ms": 200,
                "replica_rps": 1000,  # the test's traffic never asks for a second one
                "grace_s": 1,
                "command": [sys.executable, "-m", "gpupool.examples.chat_replica"],
            },
            headers=_auth(admin),
        )
        assert made.status_code == 201, made.text
        live = Live(server, admin, team_tokens["alpha"], team_tokens["beta"], [], 0, 0, 0)
        live.alpha_job, live.beta_job, live.waiting_job = alpha_job, beta_job, waiting_job

        def ready() -> bool:
            states = [live.get(f"/v1/jobs/{j}")["state"] for j in (alpha_job, beta_job)]
            waiting = live.get(f"/v1/jobs/{waiting_job}")
            replicas = live.get("/v1/services/chat")["replicas"]
            return (
                states == ["running", "running"]
                and waiting["reason_code"] == "QuotaMax"
                and any(r["ready"] for r in replicas)
            )

        wait_for(ready, 30, "both jobs running, one waiting, a replica serving")
        # some traffic, so the service has a measured rate and p99 to show
        replica = next(r["url"] for r in live.get("/v1/services/chat")["replicas"] if r["ready"])
        with httpx.Client(timeout=5) as http:
            for _ in range(REQUESTS):
                assert http.get(f"{replica}/generate", params={"tokens": 16}).status_code == 200
        wait_for(lambda: live.get("/v1/services/chat")["p99_ms"] is not None, 15, "a measured p99")
        live.nodes = [n["name"] for n in live.get("/v1/cluster")["nodes"]]
        yield live
    finally:
        for j in HTTP.get(f"{server.url}/v1/jobs", headers=_auth(admin)).json()["jobs"]:
            if j["state"] in ("pending", "running", "suspended") and j["service"] is None:
                HTTP.post(f"{server.url}/v1/jobs/{j['id']}/cancel", headers=_auth(admin))
        HTTP.delete(f"{server.url}/v1/services/chat", headers=_auth(admin))
        try:
            wait_for(
                lambda: all(
                    j["state"] in ("cancelled", "failed", "succeeded")
                    for j in HTTP.get(f"{server.url}/v1/jobs", headers=_auth(admin)).json()["jobs"]
                ),
                20,
                "the jobs and the replica to stop",
            )
        finally:
            server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def _sign_in(page: Any, token: str) -> None:
    page.fill("#token", token)
    page.click("#signin-button")


def _cells(page: Any, team: str, pool: str) -> list[str]:
    """The cells of a team's row for a pool in the teams panel."""
    rows: list[list[str]] = page.eval_on_selector_all(
        f'#panel-teams tr[data-team="{team}"]',
        "rows => rows.map(r => [...r.cells].map(c => c.textContent.trim()))",
    )
    found = [r for r in rows if r[1] == pool]
    assert found, rows
    return found[0]


def _wait_text(page: Any, selector: str, text: str) -> None:
    """Wait until `selector` shows `text` (by locator: the page's policy forbids the string
    evaluation wait_for_function would need)."""
    page.locator(selector, has_text=text).wait_for(timeout=UI_TIMEOUT_MS)


def _text(page: Any, selector: str) -> str:
    text: str = page.locator(selector).inner_text(timeout=UI_TIMEOUT_MS)
    return text


def test_every_panel_shows_the_pool_to_the_admin(live: Live, browser: Any) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    seen = watch(page)
    try:
        page.goto(live.server.url + "/")
        assert "not signed in" in _text(page, "#whoami")
        assert "Sign in" in _text(page, "#notice")
        _sign_in(page, live.admin)
        page.wait_for_selector("#panel-services tr[data-service=chat]", timeout=UI_TIMEOUT_MS)
        assert "signed in as admin (admin)" in _text(page, "#whoami")

        # GPUs by node: every node, with telemetry and who runs where
        for node in live.nodes:
            page.wait_for_selector(f'[data-node="{node}"]', timeout=UI_TIMEOUT_MS)
        gpus = _text(page, "#panel-gpus")
        assert "alpha-train" in gpus and "beta-train" in gpus and "chat-r" in gpus, gpus
        assert re.search(r"memory \d+\.\d / \d+\.\d GiB", gpus), gpus
        assert re.search(r"utilisation \d+ %", gpus) and re.search(r"power \d+ W / \d+ W", gpus)
        assert "2 node(s), 3 of 3 GPUs in use" in gpus, gpus

        # the queue: the waiting job with its reason code and sentence
        row = _text(page, f'#panel-queue tr[data-job="{live.waiting_job}"]')
        sentence = live.get(f"/v1/jobs/{live.waiting_job}")["reason"].split(": ", 1)[1]
        assert "QuotaMax" in row and sentence[:30] in row, (row, sentence)

        # services: replicas, rate, p99
        chat = _text(page, "#panel-services tr[data-service=chat]")
        assert "1 serving / 1 wanted (1..2)" in chat and "web" in chat, chat
        assert re.search(r"\d+\.\d rps", chat) and re.search(r"\d+\.\d ms", chat), chat
        assert re.search(r"chat-r\d+ running on ", chat), chat

        # teams against their quotas and the active window
        window = _text(page, "#active-window")
        assert "Active window 00:00–24:00" in window and "alpha 50 %" in window, window
        # team, pool, held, guaranteed (alpha's by the window: half of 2), max
        assert _cells(page, "alpha", "A100-80GB")[:5] == ["alpha", "A100-80GB", "1", "1", "2"]
        assert _cells(page, "beta", "A100-80GB")[:5] == ["beta", "A100-80GB", "1", "0", "1"]

        # the monitor's signals, jobs and the event stream
        _wait_text(page, "#panel-signals", "mean utilisation")
        assert _text(page, "#signal-scale-out") in ("no", "yes: the fleet is busy, add GPUs")
        jobs = _text(page, "#panel-jobs")
        assert f"#{live.alpha_job} alpha-train" in jobs and "pending" in jobs, jobs
        events = _text(page, "#panel-events")
        assert "submitted" in events and "running" in events, events

        # one job's history and logs (an admin reads any team's)
        page.click(f'#panel-jobs tr[data-job="{live.alpha_job}"]')
        _wait_text(page, "#job-logs", ALPHA_SAYS)
        history = _text(page, "#job-events")
        assert "submitted" in history and "running" in history, history

        # it refreshes itself: a job submitted now appears without a reload
        r = HTTP.post(
            f"{live.server.url}/v1/jobs",
            json={"command": ["true"], "name": "late-arrival", "team": "web", "gpus": 0},
            headers=_auth(live.admin),
        )
        assert r.status_code == 201, r.text
        _wait_text(page, "#panel-jobs", "late-arrival")
        page.wait_for_timeout(300)  # the image shows the settled page
        shot = screenshot(page, "dashboard")
        assert shot.stat().st_size > 20_000
        assert seen.console_errors == [], seen.console_errors
        assert seen.hosts() == {live.server.url}, seen.hosts()
    finally:
        page.close()


def test_a_team_token_reads_only_its_own_jobs_logs(live: Live, browser: Any) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    seen = watch(page)
    try:
        page.goto(live.server.url + "/")
        _sign_in(page, live.alpha)
        page.wait_for_selector(f'#panel-jobs tr[data-job="{live.beta_job}"]', timeout=UI_TIMEOUT_MS)
        assert "signed in as alpha-bot (team, team alpha)" in _text(page, "#whoami")

        page.click(f'#panel-jobs tr[data-job="{live.beta_job}"]')
        refused = page.locator("#job-logs-refused")
        refused.wait_for(state="visible", timeout=UI_TIMEOUT_MS)
        assert refused.inner_text() == (
            f"Logs not shown: job {live.beta_job} belongs to team beta, not alpha"
        )
        assert "running" in _text(page, "#job-events")  # the history is everyone's
        page.wait_for_timeout(2500)  # a refresh later: still refused, still nothing shown
        assert refused.is_visible()
        assert BETA_SAYS not in page.content()

        page.click(f'#panel-jobs tr[data-job="{live.alpha_job}"]')
        _wait_text(page, "#job-logs", ALPHA_SAYS)
        assert not refused.is_visible()
        assert BETA_SAYS not in page.content()
        # the one error Chromium logs is the refused request itself, asked once
        refusals = [e for e in seen.console_errors if "status of 403" in e]
        assert len(refusals) == 1 and refusals == seen.console_errors, seen.console_errors
        assert seen.hosts() == {live.server.url}, seen.hosts()
    finally:
        page.close()


def test_a_bad_token_is_told_why(live: Live, browser: Any) -> None:
    page = browser.new_page()
    try:
        page.goto(live.server.url + "/")
        _sign_in(page, "gp_not-a-token")
        _wait_text(page, "#notice", "unknown token")
        assert "not signed in" in _text(page, "#whoami")
        assert page.locator("#panel-gpus .body").inner_text() == ""  # no data without a token
    finally:
        page.close()
