"""A service whose replica cannot run (`false`) backs off through the real `gpupool serve`:
its next replica waits 2 s, then 4, then 8 (the cap here), instead of one replica (and one
job row) per cycle, and `gpupool service show` and the dashboard say so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from browser import chromium
from service_proc import HTTP, cli, configured_server, wait_for

CONFIG = """\
teams:
  - {name: web}
autoscale: {restart_backoff_s: 2, restart_backoff_max_s: 8}
"""
WATCH_S = 12.0


@pytest.mark.slow
def test_a_crash_looping_service_backs_off(tmp_path: Path) -> None:
    server = configured_server(tmp_path, CONFIG, gpus="2xA100-80GB").start()
    try:
        made = cli(server.url, "service", "create", "crashy", "--team", "web", "--", "false")
        assert made.returncode == 0, made.stderr

        def replica_jobs() -> list[dict[str, object]]:
            jobs = HTTP.get(f"{server.url}/v1/jobs", params={"limit": 1000}, timeout=5).json()
            return [j for j in jobs["jobs"] if j.get("service") == "crashy"]

        wait_for(lambda: any(j["state"] == "failed" for j in replica_jobs()), 20, "a failure")
        first_failed = time.monotonic()
        time.sleep(WATCH_S)  # the cycle runs 60 times in this while: one replica each, unchecked
        jobs = replica_jobs()
        # failures at about 0, 2, 6 and 14 s after the first: 3 or 4 replicas in all, a few
        # more if the host is slow to start them (each start takes its own time)
        assert 2 <= len(jobs) <= 6, [(j["id"], j["state"]) for j in jobs]
        assert all(j["state"] in ("failed", "pending", "running") for j in jobs)
        assert time.monotonic() - first_failed >= WATCH_S

        shown = cli(server.url, "service", "show", "crashy")
        assert shown.returncode == 0, shown.stderr
        assert "backing off:" in shown.stdout, shown.stdout
        assert "replicas in a row failed soon after they started" in shown.stdout
        view = HTTP.get(f"{server.url}/v1/services/crashy", timeout=5).json()
        assert view["backoff"]["failures"] >= 2

        with chromium() as browser:  # the services panel marks it
            page = browser.new_page()
            page.goto(server.url + "/")
            badge = page.locator("#panel-services tr[data-service=crashy] .backoff")
            badge.wait_for(timeout=15_000)
            assert badge.inner_text().startswith("backing off: ")
            assert "failed soon after they started" in (badge.get_attribute("title") or "")
    finally:
        server.stop()
