"""`promtool check metrics` (Debian's prometheus package) on the /metrics of a real `gpupool
serve` process whose jobs ran.

promtool's linter finds one thing only, by design: the DCGM exporter's label `modelName`
is camelCase, and gpupool keeps the exporter's labels so its dashboards work unchanged. That
complaint, per DCGM metric, is allowed by its exact message; any other fails the test. A
copy with a HELP line removed shows promtool, and this filter, do catch a real problem.
With GPUPOOL_REQUIRE_PROMTOOL=1 (as `.ci/run` sets) a missing promtool fails the test
instead of skipping it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.server.telemetry.prometheus import QUEUE_WAIT, SUBMIT_TO_START
from service_proc import HTTP, Server, wait_for

DCGM_LABEL_STYLE = re.compile(
    r"^DCGM_FI_[A-Z0-9_]+ label names should be written in 'snake_case' not 'camelCase'$"
)
"""What promtool says about the DCGM exporter's `modelName` label: the one complaint allowed."""

KINDS = ("training", "batch", "online-inference")

pytestmark = pytest.mark.slow  # a real server: ~5 s to start on a quiet host, ~15 s on a busy one


def promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    why = "Debian's promtool is not installed (apt-get install prometheus)"
    if os.environ.get("GPUPOOL_REQUIRE_PROMTOOL") == "1":
        pytest.fail(why)
    pytest.skip(why)


def check(tool: str, text: str) -> tuple[int, list[str]]:
    """promtool check metrics on `text`: its exit status and every line it printed."""
    out = subprocess.run(
        [tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    lines = (out.stdout + out.stderr).splitlines()
    return out.returncode, [x.strip() for x in lines if x.strip()]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """/metrics of a live service after one job of each kind ran, and a fourth waited."""
    state = tmp_path_factory.mktemp("promtool") / "state"
    srv = Server(
        state,
        "--fake-gpus",
        "2xA100-80GB",
        "--auth",
        "none",
        "--cycle",
        "0.2",
        "--sample",
        "0.3",
    ).start()
    try:
        url = srv.url
        hold = "import time; time.sleep(0.5)"  # the third and fourth wait for a GPU
        ids = []
        for kind in (*KINDS, "training"):
            body = {"command": [sys.executable, "-c", hold], "team": "nlp", "kind": kind}
            r = HTTP.post(f"{url}/v1/jobs", json=body, timeout=10)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])

        def ended() -> bool:
            states = [HTTP.get(f"{url}/v1/jobs/{i}", timeout=10).json()["state"] for i in ids]
            assert "failed" not in states, states
            return all(s == "succeeded" for s in states)

        wait_for(ended, 60, "the four jobs to run on two GPUs and succeed")
        r = HTTP.get(f"{url}/metrics", timeout=10)
        assert r.status_code == 200, r.text
        yield r.text
    finally:
        srv.stop()


def test_promtool_finds_nothing_but_the_dcgm_label_style(scraped: str) -> None:
    tool = promtool()
    rc, said = check(tool, scraped)
    others = [x for x in said if not DCGM_LABEL_STYLE.match(x)]
    assert others == [], others
    assert rc in (0, 3), (rc, said)  # 3: lint findings (the allowed ones); 1 would be a parse error
    flagged = {x.split()[0] for x in said}
    assert "DCGM_FI_DEV_GPU_UTIL" in flagged and rc == 3, said


def test_promtool_does_catch_a_missing_help_line(scraped: str) -> None:
    """The filter above is not a blanket pass: drop one HELP line and promtool says so."""
    tool = promtool()
    lines = scraped.splitlines(keepends=True)
    cut = "".join(x for x in lines if not x.startswith("# HELP gpupool_queue_pending "))
    assert cut != scraped
    _, said = check(tool, cut)
    others = [x for x in said if not DCGM_LABEL_STYLE.match(x)]
    assert others == ["gpupool_queue_pending no help text"], said


def test_the_start_histograms_have_counts(scraped: str) -> None:
    counts = {
        (s.name, s.labels["kind"]): s.value
        for f in text_string_to_metric_families(scraped)
        for s in f.samples
        if s.name.endswith("_count")
    }
    for kind in KINDS:
        assert counts[(f"{SUBMIT_TO_START}_count", kind)] >= 1, counts
        assert counts[(f"{QUEUE_WAIT}_count", kind)] >= 1, counts
    # four first starts, one each; the fourth waited for a GPU to come free
    assert counts[(f"{SUBMIT_TO_START}_count", "training")] == 2, counts
    assert sum(v for (n, _), v in counts.items() if n == f"{SUBMIT_TO_START}_count") == 4


def test_the_scrape_is_the_real_service(scraped: str) -> None:
    """Jobs of the service counted by state, the DCGM gauges present for both GPUs."""
    families = {f.name: f for f in text_string_to_metric_families(scraped)}
    done = {
        s.labels["kind"]: s.value
        for s in families["gpupool_jobs"].samples
        if s.labels["state"] == "succeeded"
    }
    assert done == {"training": 2.0, "batch": 1.0, "online-inference": 1.0}
    gpus = {s.labels["gpu"] for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert gpus == {"0", "1"}
