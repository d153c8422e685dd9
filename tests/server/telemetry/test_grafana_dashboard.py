"""deploy/grafana/gpupool.json: a well-formed Grafana dashboard whose every query names only
metrics gpupool exports.

The exported names are read from what the collector yields on an in-process service whose
jobs started (create_app on a fake fleet, as tests/server/api/test_api.py does), not from a
list kept here: a metric renamed in the collector and not in the dashboard fails the test. Metric
names are picked out of each PromQL expression by dropping strings, label matchers, ranges,
label lists (by, without, on, ignoring, group_left/right), numbers, keywords and functions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import Store, database_url

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "gpupool.json"
DS = "${DS_PROMETHEUS}"

KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "atan2"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NUMBER = re.compile(r"(?<![\w:$])\d+(?:\.\d*)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?\b")
_IDENT = re.compile(r"\$?[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:([A-Za-z_:][\w:]*)\s*(\{[^}]*\})?\s*,)?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not its functions, labels or keywords)."""
    e = _STRING.sub(" ", expr)
    e = _MATCHERS.sub(" ", e)
    e = _RANGE.sub(" ", e)
    e = _LABEL_LIST.sub(" ", e)
    e = _NUMBER.sub(" ", e)
    names = set()
    for m in _IDENT.finditer(e):
        token = m.group(0)
        if token.startswith("$") or token.lower() in KEYWORDS:
            continue  # a Grafana variable ($__rate_interval, $node) or a PromQL keyword
        if e[m.end() :].lstrip().startswith("("):
            continue  # a function: rate(, sum(, histogram_quantile(
        names.add(token)
    return names


def template_metric(query: str) -> set[str]:
    """The metric a template variable's query reads: label_values(metric, label) or PromQL."""
    m = _LABEL_VALUES.match(query)
    if m is None:
        return metric_names(query)
    return {m.group(1)} if m.group(1) else set()


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that is not a row, rows' own panels included."""
    for p in dash["panels"]:
        if p["type"] == "row":
            yield from p.get("panels", [])
        else:
            yield p


def queries(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and every template variable."""
    for p in panels(dash):
        for t in p["targets"]:
            yield f"panel {p['title']!r} target {t['refId']}", t["expr"]
    for v in dash["templating"]["list"]:
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        yield f"variable {v['name']}", q


def unknown_names(dash: dict[str, Any], exported: set[str]) -> list[tuple[str, str]]:
    out = []
    for where, expr in queries(dash):
        names = template_metric(expr) if where.startswith("variable") else metric_names(expr)
        out += [(where, n) for n in sorted(names - exported)]
    return out


@pytest.fixture(scope="module")
def dash() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """Every sample name the collector yields once GPUs were sampled and jobs started."""
    tmp = tmp_path_factory.mktemp("grafana")
    store = Store(database_url(None, tmp / "db"))
    store.migrate()
    clock = ManualClock(1_000.0)
    service = LiveService(
        LiveConfig(state_dir=tmp / "state", sample_s=0.0, host="h"),
        store,
        FakeExecutor(),
        FakeTelemetry("2xA100-80GB"),
        clock,
    )
    with TestClient(create_app(service, store, auth=False)) as client:
        for kind in ("training", "batch"):
            r = client.post("/v1/jobs", json={"command": ["x"], "team": "nlp", "kind": kind})
            assert r.status_code == 201, r.text
        clock.advance(2.0)
        service.step()
        text = client.get("/metrics").text
    store.close()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert "gpupool_queue_wait_seconds_bucket" in names  # the histograms have samples
    yield names


def test_the_dashboard_is_well_formed(dash: dict[str, Any]) -> None:
    assert dash["title"] == "gpupool" and dash["uid"] == "gpupool"
    assert 36 <= dash["schemaVersion"] <= 41
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    assert dash["__inputs"][0]["pluginId"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
    every = list(panels(dash))
    assert len(every) >= 10
    for p in every:
        assert p["title"] and p["datasource"]["uid"] == DS, p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            assert t["expr"].strip(), f"panel {p['title']!r} target {t['refId']} is empty"
            assert t["datasource"]["uid"] == DS, p["title"]
    for v in dash["templating"]["list"]:
        assert v["datasource"]["uid"] == DS, v["name"]


def test_every_query_names_a_metric_gpupool_exports(
    dash: dict[str, Any], exported: set[str]
) -> None:
    assert unknown_names(dash, exported) == []
    for where, expr in queries(dash):
        found = template_metric(expr) if where.startswith("variable") else metric_names(expr)
        assert found, f"{where} reads no metric: {expr}"


def test_a_renamed_metric_fails_the_check(dash: dict[str, Any], exported: set[str]) -> None:
    """The check is not a blanket pass: one metric renamed in the collector's names, and
    the panels reading it are named."""
    renamed = (exported - {"gpupool_queue_pending"}) | {"gpupool_queue_waiting"}
    missing = unknown_names(dash, renamed)
    reading = {w for w, e in queries(dash) if "gpupool_queue_pending" in e}
    assert reading and {w for w, _ in missing} == reading
    assert {n for _, n in missing} == {"gpupool_queue_pending"}


def test_the_dashboard_shows_what_an_operator_asks(dash: dict[str, Any]) -> None:
    """GPU memory, utilisation, power, temperature; jobs by state and team; the queue; wait
    quantiles from the histograms' buckets; the monitor's signals; nodes up."""
    read = {n for _, e in queries(dash) for n in metric_names(e)}
    assert {
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "gpupool_jobs",
        "gpupool_queue_pending",
        "gpupool_queue_wait_seconds_bucket",
        "gpupool_submit_to_start_seconds_bucket",
        "gpupool_gpus_reclaimable",
        "gpupool_scale_out",
        "gpupool_node_up",
    } <= read
    exprs = [e for _, e in queries(dash)]
    for hist in ("gpupool_queue_wait_seconds", "gpupool_submit_to_start_seconds"):
        for q in ("0.5", "0.95"):
            assert any(
                re.search(
                    rf"histogram_quantile\({q}, sum by \(le, kind\) \(rate\({hist}_bucket\[", e
                )
                for e in exprs
            ), (hist, q)
    assert any("sum by (state)" in e for e in exprs) and any("sum by (team)" in e for e in exprs)


def test_every_panel_query_parses_as_promql(dash: dict[str, Any], tmp_path: Path) -> None:
    """Prometheus's own parser on each query (Grafana's variables given a value), through
    `promtool check rules`: a recording rule per query."""
    tool = shutil.which("promtool")
    if tool is None:
        why = "Debian's promtool is not installed (apt-get install prometheus)"
        if os.environ.get("GPUPOOL_REQUIRE_PROMTOOL") == "1":
            pytest.fail(why)
        pytest.skip(why)
    given = {"$__rate_interval": "5m", "$__interval": "1m", "$node": ".*", "$team": ".*"}
    rules = []
    for k, (_, expr) in enumerate(q for q in queries(dash) if q[0].startswith("panel")):
        for var, val in given.items():
            expr = expr.replace(var, val)
        assert "$" not in expr, expr
        rules.append({"record": f"gpupool:query_{k}", "expr": expr})
    path = tmp_path / "rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout + out.stderr


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'histogram_quantile(0.95, sum by (le, kind) (rate(x_seconds_bucket{a="b}"}[5m])))',
            {"x_seconds_bucket"},
        ),
        ('sum(a) / (b{c=~"$node"} + c_total offset 1h) * 60', {"a", "b", "c_total"}),
        ("increase(lost_total[$__rate_interval]) > bool 1e3", {"lost_total"}),
        ("up == 1 and on (job) group_left (team) info", {"up", "info"}),
        ("DCGM_FI_DEV_GPU_UTIL", {"DCGM_FI_DEV_GPU_UTIL"}),
    ],
)
def test_metric_names_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
