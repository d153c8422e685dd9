"""A job's measured figures come from the samples its cards were held whole: an hourly mean
over a card that changed hands, or stood idle part of the hour, is not the job's own."""

from __future__ import annotations

import pytest

from gpupool.reports.review import build_review
from gpupool.reports.review_data import (
    Allocation,
    GpuRecord,
    JobReview,
    ReviewData,
    UsageSample,
)

T0 = 1_790_000_000.0
H = 3600.0
GIB = 1024.0


def _card(gid: str) -> GpuRecord:
    node, index = gid.split("/")
    return GpuRecord(gid, node, int(index), "A100-80GB", mem_total_mib=81920)


def _job(job_id: str, asked_gib: float) -> JobReview:
    return JobReview(
        job_id, "vision", "training", 1, T0, "completed", gpu_mem_mib=int(asked_gib * GIB)
    )


def _hour(gid: str, k: int, sm: float, mem_mib: float, peak_mib: float) -> UsageSample:
    return UsageSample(gid, T0 + k * H, H, mem_mib, sm, None, None, peak_mib)


def _review() -> dict[str, object]:
    data = ReviewData(
        source="test",
        start_s=T0,
        end_s=T0 + 4 * H,
        gpus=(_card("n/0"), _card("n/1"), _card("n/2")),
        allocations=(
            # six minutes at 43 GiB and 90 % SM, then the card idles out the hour
            Allocation("brief", "n/0", T0, T0 + 0.1 * H),
            # four whole hours at 10 GiB (12 GiB peak)
            Allocation("steady", "n/1", T0, T0 + 4 * H),
            # the card changes hands at 1.5 h
            Allocation("before", "n/2", T0, T0 + 1.5 * H),
            Allocation("after", "n/2", T0 + 1.5 * H, T0 + 4 * H),
        ),
        usage=(
            _hour("n/0", 0, 9.0, 4.3 * GIB, 43 * GIB),
            *(_hour("n/0", k, 0.0, 0.0, 0.0) for k in (1, 2, 3)),
            *(_hour("n/1", k, 50.0, 10 * GIB, 12 * GIB) for k in range(4)),
            _hour("n/2", 0, 80.0, 30 * GIB, 31 * GIB),
            _hour("n/2", 1, 50.0, 17.5 * GIB, 31 * GIB),  # half each: a mix of both
            *(_hour("n/2", k, 20.0, 5 * GIB, 6 * GIB) for k in (2, 3)),
        ),
        jobs=(_job("brief", 80), _job("steady", 40), _job("before", 40), _job("after", 40)),
    )
    review = build_review(data)
    return {
        "rows": {r.job_id: r for r in review.jobs},
        "right": {r.subjects[0]: r.evidence for r in review.recommendations_of("right-size")},
    }


def test_a_job_that_held_a_card_for_part_of_every_sample_is_not_judged_on_it() -> None:
    out = _review()
    brief = out["rows"]["brief"]  # type: ignore[index]
    # its hourly mean says 4.3 GiB: "asks 80 GiB, uses 4.3" would be false (it used 43)
    assert brief.peak_mem_mib == -1.0 and brief.sampled_h == 0.0
    assert "brief" not in out["right"]  # type: ignore[operator]
    # the GPU time it used still counts, exactly: 9 % of the hour is 90 % of its 0.1 h
    assert brief.used_gpu_h == pytest.approx(0.09)


def test_a_card_held_whole_gives_the_jobs_own_peak_with_the_evidence() -> None:
    out = _review()
    steady = out["rows"]["steady"]  # type: ignore[index]
    assert steady.peak_mem_mib == 12 * GIB  # the bucket's peak, not its mean
    assert steady.mean_mem_mib == 10 * GIB and steady.sampled_pct == 100.0
    evidence = out["right"]["steady"]  # type: ignore[index]
    assert "asks 40.0 GiB per GPU, peaks at 12.0 GiB (3.3x)" in evidence
    assert "over the 4.0 h measured while it held its cards whole (100 % of its time)" in evidence


def test_a_card_that_changes_hands_is_read_only_where_each_held_it_whole() -> None:
    rows = _review()["rows"]
    before, after = rows["before"], rows["after"]  # type: ignore[index]
    assert (before.peak_mem_mib, before.mean_sm_pct, before.sampled_h) == (31 * GIB, 80.0, 1.0)
    assert (after.peak_mem_mib, after.mean_sm_pct, after.sampled_h) == (6 * GIB, 20.0, 2.0)
    # the mixed hour's use is split by time held: 0.5 h of 50 % each
    assert before.used_gpu_h == pytest.approx(0.8 + 0.25)
    assert after.used_gpu_h == pytest.approx(0.25 + 0.4)
