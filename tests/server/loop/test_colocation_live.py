"""The co-location admission through a real `gpupool serve`: its --config's
`sharing.admission` trains the model on the Lucid measurements at start, and GET /v1/learn
and `gpupool learn status` show who decides, the guard's record, why a promotion would be
refused, and that this executor measures no job speeds (so the guard judges nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.cli.learn import colocation_text
from gpupool.traces.location import find_traces_dir
from gpupool.traces.lucid import LUCID_DIR, PAIRS_FILE
from lucid_files import PROFILES_CSV
from service_proc import HTTP, cli, configured_server


def lucid_folder() -> Path:
    traces = find_traces_dir()
    folder = None if traces is None else traces / LUCID_DIR
    if folder is None or not (folder / PAIRS_FILE).is_file():
        pytest.skip(f"the Lucid measurements ({LUCID_DIR}) are not in a shared traces folder")
    return folder


def test_the_learned_colocation_admission_shows_through_the_real_server(tmp_path: Path) -> None:
    (tmp_path / "profiles.csv").write_text(PROFILES_CSV, encoding="utf-8")
    config = (
        "teams:\n  - {name: ml}\nonline_reserve: 0\nsharing:\n  admission:\n"
        "    decider: learned\n    mode: shadow\n    profiles: profiles.csv\n"
        f"    pairs: {lucid_folder()}\n    min_speed: 0.9\n"
    )
    server = configured_server(tmp_path, config).start()
    try:
        view = HTTP.get(f"{server.url}/v1/learn", timeout=10).json()
        assert view["order"] is False  # co-location is this server's only learner
        st = view["colocation"]
        assert (st["decider"], st["mode"], st["decides"]) == ("learned", "shadow", "rule")
        assert (st["profiles"], st["min_speed"], st["pairs_judged"]) == (2, 0.9, 0)
        assert st["measured_speeds"] is False
        assert "this executor does not report job progress" in st["measured_note"]
        assert st["promotion_problem"].startswith("only 0 co-located pairs judged")
        out = cli(server.url, "learn", "status", timeout_s=60)
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert "co-location admission: decider learned, mode shadow; the rule decides" in text
        assert "  profiles:  2 job names; the model admits a pair at 0.90x or faster" in text
        assert "  guard:     trusted; 0 pairs judged" in text
        assert "  measured:  no measured speeds: this executor does not report job" in text
        assert "  promotion: refused: only 0 co-located pairs judged" in text
        shown = json.loads(cli(server.url, "learn", "status", "--json").stdout)
        assert shown["colocation"]["decider"] == "learned"
        # promotion of this learner: its own record (no pair judged here) refuses it
        refused = cli(server.url, "learn", "promote", "colocation")
        assert refused.returncode != 0, refused
        assert "promotion of the colocation learner refused: only 0 co-located pairs" in (
            refused.stderr
        ), refused.stderr
        again = cli(server.url, "learn", "demote", "colocation")
        assert again.returncode != 0 and "in shadow already" in again.stderr, again
        absent = cli(server.url, "learn", "promote", "forecast")
        assert absent.returncode != 0 and "no demand forecast" in absent.stderr, absent
    finally:
        server.stop()


def test_a_server_without_the_admission_says_it_is_off() -> None:
    assert colocation_text({"colocation": None}).strip() == (
        "co-location admission: off (sharing.admission.decider: off)"
    )


def test_an_active_learned_admission_is_refused_where_no_speed_is_measured(
    tmp_path: Path,
) -> None:
    """Active, the model would decide with a guard that never hears of a measured pair:
    the live service refuses to start so (shadow, or the rule, it accepts)."""
    from gpupool.errors import SpecError
    from gpupool.ports.clock.fake import ManualClock
    from gpupool.ports.executor.fake import FakeExecutor
    from gpupool.ports.telemetry.fake import FakeTelemetry
    from gpupool.scheduler.config_schema import parse_scheduling
    from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
    from gpupool.server.loop.driver import LiveService
    from gpupool.server.store import Store
    from lucid_files import write_lucid

    (tmp_path / "profiles.csv").write_text(PROFILES_CSV, encoding="utf-8")
    pairs = write_lucid(tmp_path / "lucid")
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.migrate()

    def start(mode: str) -> LiveService:
        raw = {"sharing": {"admission": {"decider": "learned", "mode": mode}}}
        raw["sharing"]["admission"].update(profiles="profiles.csv", pairs=str(pairs))
        sched = parse_scheduling(raw, str(tmp_path / "service.yaml"), LIVE_DEFAULTS)
        config = LiveConfig(tmp_path / "run", sched, host="h", source="service.yaml")
        return LiveService(
            config, store, FakeExecutor(), FakeTelemetry("1xA100-80GB"), ManualClock(0.0)
        )

    try:
        with pytest.raises(SpecError, match=r"mode active needs the measured speeds"):
            start("active")
        shadow = start("shadow")
        assert shadow.scheduler.learners.mode("colocation") == "shadow"
        shadow.stop()
    finally:
        store.close()
