"""Team quotas: guarantees and maxima per GPU type, time windows, fair-share history."""

from __future__ import annotations

import math

import pytest

from gpupool.domain.quota import DAY_S, QuotaBook, QuotaWindow, TeamQuota, clock_s
from gpupool.errors import SpecError
from gpupool.sim.scenario.config import parse_scenario

H = 3600.0


def hm(text: str) -> float:
    """'23:00' -> seconds after midnight, computed here without clock_s."""
    h, m = text.split(":")
    return int(h) * H + int(m) * 60.0


# ---- guaranteed / maximum per team and GPU type ---------------------------------------------
def book_two_types() -> QuotaBook:
    return QuotaBook(
        [
            TeamQuota("infer", {"H200": 8, "A100": 4}, {"H200": 16}),
            TeamQuota("train", {"H200": 8}, {"H200": 24, "A100": 2}),
        ],
        {"H200": 24, "A100": 8},
    )


@pytest.mark.parametrize(
    ("team", "gpu_type", "guaranteed", "maximum"),
    [
        ("infer", "H200", 8, 16),
        ("infer", "A100", 4, 8),  # no max given for A100: the whole pool
        ("train", "H200", 8, 24),
        ("train", "A100", 0, 2),
        ("nobody", "H200", 0, 24),  # a team without quota: nothing promised, pool-wide max
        ("infer", "V100", 0, 0),  # a GPU type the pool lacks
    ],
)
def test_guaranteed_and_maximum_per_team_and_gpu_type(
    team: str, gpu_type: str, guaranteed: int, maximum: int
) -> None:
    book = book_two_types()
    for t in (0.0, 11 * H, 3 * DAY_S + 5):
        assert book.guaranteed(team, gpu_type, t) == guaranteed
        assert book.maximum(team, gpu_type, t) == maximum


def test_teams_keep_their_order() -> None:
    assert book_two_types().teams == ["infer", "train"]


# ---- windows ------------------------------------------------------------------------------
NIGHT = QuotaWindow(hm("22:30"), hm("05:30"), {"infer": 0.25, "train": 0.75}, {"infer": 0.45})
DAY = QuotaWindow(hm("05:30"), hm("22:30"), {"infer": 0.75, "train": 0.25}, {"train": 0.55})


def windowed_book(*windows: QuotaWindow) -> QuotaBook:
    return QuotaBook(
        [TeamQuota("infer", {"H200": 1}, {"H200": 3}), TeamQuota("train", {"H200": 2}, {})],
        {"H200": 10},
        windows,
    )


@pytest.mark.parametrize(
    ("clock", "night"),
    [("23:00", True), ("03:00", True), ("05:29", True), ("05:30", False), ("12:00", False)],
)
def test_window_wrapping_midnight_selects_the_right_shares(clock: str, night: bool) -> None:
    book = windowed_book(NIGHT, DAY)
    for day in (0, 1, 6):
        t = day * DAY_S + hm(clock)
        assert book.window(t) is (NIGHT if night else DAY)
        # pool of 10: 0.25 -> floor(2.5) = 2, 0.75 -> floor(7.5) = 7
        if night:
            assert book.guaranteed("infer", "H200", t) == 2
            assert book.guaranteed("train", "H200", t) == 7
            assert book.maximum("infer", "H200", t) == 4  # floor(0.45 * 10)
            # train has no max share at night: its own max (none: the pool), >= guarantee
            assert book.maximum("train", "H200", t) == 10
        else:
            assert book.guaranteed("infer", "H200", t) == 7
            assert book.guaranteed("train", "H200", t) == 2
            # infer's max share is absent by day: its own max 3, but never under 7
            assert book.maximum("infer", "H200", t) == 7
            assert book.maximum("train", "H200", t) == 5  # floor(0.55 * 10)


def test_covers_wrapping_window_boundaries() -> None:
    assert NIGHT.covers(hm("22:30"))
    assert not NIGHT.covers(hm("22:29"))
    assert NIGHT.covers(0.0)
    assert NIGHT.covers(hm("05:29") + 59.9)
    assert not NIGHT.covers(hm("05:30"))
    assert DAY.covers(hm("05:30"))
    assert not DAY.covers(hm("22:30"))


def test_outside_every_window_team_quotas_apply() -> None:
    book = windowed_book(NIGHT)
    t = hm("12:00")
    assert book.window(t) is None
    assert book.guaranteed("infer", "H200", t) == 1
    assert book.maximum("infer", "H200", t) == 3
    assert book.guaranteed("train", "H200", t) == 2
    assert book.maximum("train", "H200", t) == 10
    t = DAY_S + hm("23:00")
    assert book.guaranteed("infer", "H200", t) == 2


def test_team_missing_from_a_window_keeps_its_own_quota() -> None:
    only_infer = QuotaWindow(0.0, DAY_S, {"infer": 0.5}, {})
    book = windowed_book(only_infer)
    assert book.guaranteed("infer", "H200", 100.0) == 5
    assert book.guaranteed("train", "H200", 100.0) == 2
    assert book.maximum("train", "H200", 100.0) == 10


@pytest.mark.parametrize(
    ("share", "pool", "expected"),
    [(0.5, 16, 8), (0.3, 16, 4), (0.34, 3, 1), (0.99, 8, 7), (1.0, 24, 24), (0.0, 8, 0)],
)
def test_window_share_is_floored(share: float, pool: int, expected: int) -> None:
    book = QuotaBook(
        [TeamQuota("a", {}, {})],
        {"H200": pool},
        [QuotaWindow(0.0, DAY_S, {"a": share}, {"a": share})],
    )
    assert book.guaranteed("a", "H200", 60.0) == expected
    assert book.maximum("a", "H200", 60.0) == expected


# regression: 0.29 * 100 is 28.999999999999996 in floating point, and was floored to 28
@pytest.mark.parametrize(("share", "pool", "expected"), [(0.29, 100, 29), (0.57, 100, 57)])
def test_window_share_floor_is_exact_for_decimal_shares(
    share: float, pool: int, expected: int
) -> None:
    book = QuotaBook(
        [TeamQuota("a", {}, {})],
        {"H200": pool},
        [QuotaWindow(0.0, DAY_S, {"a": share}, {"a": share})],
    )
    assert book.guaranteed("a", "H200", 60.0) == expected
    assert book.maximum("a", "H200", 60.0) == expected


def test_parse_scenario_builds_the_same_windows() -> None:
    cfg = parse_scenario(
        {
            "name": "w",
            "horizon_h": 24,
            "cluster": [{"gpu_type": "H200", "nodes": 2, "gpus_per_node": 5}],
            "teams": [{"name": "infer"}, {"name": "train"}],
            "windows": [
                {"from": "22:30", "to": "05:30", "teams": {"infer": {"guaranteed": 0.25}}},
                {"from": "05:30", "to": "22:30", "teams": {"infer": {"guaranteed": 0.75}}},
            ],
            "workload": [],
        }
    )
    book = QuotaBook(cfg.scheduling.teams, {"H200": 10}, cfg.scheduling.windows)
    assert [book.guaranteed("infer", "H200", hm(c)) for c in ("23:00", "05:29", "05:30")] == [
        2,
        2,
        7,
    ]


# ---- clock_s --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "seconds"),
    [("00:00", 0.0), ("05:30", 19_800.0), ("22:30", 81_000.0), ("9:05", 32_700.0)],
)
def test_clock_s(text: str, seconds: float) -> None:
    assert clock_s(text) == seconds


def test_clock_s_accepts_end_of_day() -> None:
    assert clock_s("24:00") == DAY_S


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0930", "HH:MM"),
        ("9h30", "HH:MM"),
        ("ab:cd", "HH:MM"),
        ("1:2:3", "HH:MM"),
        ("25:00", "outside 00:00-24:00"),
        ("12:60", "outside 00:00-24:00"),
        ("24:01", "outside 00:00-24:00"),
        ("-1:00", "outside 00:00-24:00"),
    ],
)
def test_bad_clock_is_a_spec_error_naming_the_text(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        clock_s(text)
    assert repr(text) in str(info.value)


def test_bad_clock_in_a_scenario_window() -> None:
    with pytest.raises(SpecError, match="HH:MM"):
        parse_scenario(
            {
                "name": "w",
                "horizon_h": 1,
                "cluster": [{"gpu_type": "H200"}],
                "teams": [{"name": "a"}],
                "windows": [{"from": "9am", "to": "17:00", "teams": {}}],
                "workload": [],
            }
        )


# ---- errors -----------------------------------------------------------------------------------
def test_guarantees_over_the_pool() -> None:
    with pytest.raises(SpecError, match=r"H200 add up to 10 GPUs but the pool has 8.*lower"):
        QuotaBook([TeamQuota("a", {"H200": 6}, {}), TeamQuota("b", {"H200": 4}, {})], {"H200": 8})


def test_guarantees_exactly_filling_the_pool_are_fine() -> None:
    book = QuotaBook(
        [TeamQuota("a", {"H200": 4}, {}), TeamQuota("b", {"H200": 4}, {})], {"H200": 8}
    )
    assert book.guaranteed("b", "H200", 0.0) == 4


def test_unknown_team_in_a_window() -> None:
    w = QuotaWindow(0.0, 3600.0, {"a": 0.5}, {"ghost": 1.0})
    with pytest.raises(SpecError, match=r"unknown team.*ghost"):
        QuotaBook([TeamQuota("a", {}, {})], {"H200": 8}, [w])


def test_unknown_team_in_a_scenario_window_names_the_key() -> None:
    with pytest.raises(SpecError, match=r"windows\[0\]\.teams.*ghost"):
        parse_scenario(
            {
                "name": "w",
                "horizon_h": 1,
                "cluster": [{"gpu_type": "H200"}],
                "teams": [{"name": "a"}],
                "windows": [{"from": "09:00", "to": "17:00", "teams": {"ghost": {}}}],
                "workload": [],
            }
        )


def test_window_guarantees_over_one() -> None:
    w = QuotaWindow(0.0, 3600.0, {"a": 0.6, "b": 0.5}, {})
    with pytest.raises(SpecError, match="more than 1"):
        QuotaBook([TeamQuota("a", {}, {}), TeamQuota("b", {}, {})], {"H200": 8}, [w])


def test_guaranteed_over_max() -> None:
    with pytest.raises(SpecError, match=r"team a: .*guaranteed <= max.*H200.*8 > 4"):
        TeamQuota("a", {"H200": 8}, {"H200": 4})


def test_negative_guarantee() -> None:
    with pytest.raises(SpecError, match="team a"):
        TeamQuota("a", {"H200": -1}, {})


def test_team_listed_twice() -> None:
    with pytest.raises(SpecError, match="twice"):
        QuotaBook([TeamQuota("a", {}, {}), TeamQuota("a", {}, {})], {"H200": 8})


def test_guaranteed_over_max_in_a_scenario() -> None:
    with pytest.raises(SpecError, match="guaranteed <= max"):
        parse_scenario(
            {
                "name": "q",
                "horizon_h": 1,
                "cluster": [{"gpu_type": "H200"}],
                "teams": [{"name": "a", "guaranteed": {"H200": 8}, "max": {"H200": 2}}],
                "workload": [],
            }
        )


# ---- fair share ---------------------------------------------------------------------------------
def test_fair_rank_orders_heavier_decayed_usage_last() -> None:
    book = QuotaBook(
        [TeamQuota(t, {"H200": 4}, {}) for t in ("a", "b", "c")], {"H200": 12}, half_life_s=H
    )
    book.record_usage({"a": 8.0, "b": 2.0}, 600.0)
    assert book.fair_rank("a") == pytest.approx(8.0 * 600 / 4)
    assert book.fair_rank("b") == pytest.approx(2.0 * 600 / 4)
    assert book.fair_rank("c") == 0.0
    assert sorted(book.teams, key=book.fair_rank) == ["c", "b", "a"]
    # b catches up: more recent usage outweighs a's decayed history
    book.record_usage({}, 10 * H)
    book.record_usage({"b": 4.0}, 600.0)
    assert sorted(book.teams, key=book.fair_rank) == ["c", "a", "b"]


def test_fair_rank_is_per_guaranteed_gpu() -> None:
    book = QuotaBook(
        [TeamQuota("big", {"H200": 8}, {}), TeamQuota("small", {"H200": 2}, {})], {"H200": 10}
    )
    book.record_usage({"big": 6.0, "small": 2.0}, 60.0)
    # big used 3x more, but has 4x the guarantee: it ranks first
    assert book.fair_rank("big") == pytest.approx(6 * 60 / 8)
    assert book.fair_rank("small") == pytest.approx(2 * 60 / 2)
    assert book.fair_rank("big") < book.fair_rank("small")


def test_fair_rank_without_guarantee_weighs_one() -> None:
    book = QuotaBook([TeamQuota("z", {}, {})], {"H200": 8})
    book.record_usage({"z": 3.0}, 10.0)
    assert book.fair_rank("z") == pytest.approx(30.0)
    assert book.fair_rank("stranger") == 0.0


def test_record_usage_decay_halves_after_one_half_life() -> None:
    half = 2 * H
    book = QuotaBook(
        [TeamQuota("a", {}, {}), TeamQuota("b", {}, {})], {"H200": 8}, half_life_s=half
    )
    book.record_usage({"a": 4.0}, 60.0)
    assert book.decayed == {"a": 240.0, "b": 0.0}
    book.record_usage({}, half)
    assert book.decayed["a"] == pytest.approx(120.0)
    book.record_usage({}, half / 2)
    assert book.decayed["a"] == pytest.approx(120.0 / math.sqrt(2))
    book.record_usage({}, 3 * half / 2)
    assert book.decayed["a"] == pytest.approx(30.0)


def test_record_usage_adds_the_interval_undecayed() -> None:
    book = QuotaBook([TeamQuota("a", {}, {})], {"H200": 8}, half_life_s=100.0)
    book.record_usage({"a": 1.0}, 100.0)
    assert book.decayed["a"] == pytest.approx(100.0)
    book.record_usage({"a": 2.0}, 100.0)
    assert book.decayed["a"] == pytest.approx(50.0 + 200.0)


def test_record_usage_in_small_steps_matches_one_big_decay() -> None:
    book = QuotaBook([TeamQuota("a", {}, {})], {"H200": 8}, half_life_s=6 * H)
    book.record_usage({"a": 8.0}, 60.0)
    for _ in range(360):  # 6 h of 60 s cycles without usage
        book.record_usage({}, 60.0)
    assert book.decayed["a"] == pytest.approx(8 * 60 / 2)
