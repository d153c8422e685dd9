"""The review's advice is right: on a two-day cut of review-planted.yaml, every right-size,
share-a-card and reclaimable-card recommendation holds against the usage profiles the
simulator gave the jobs (read straight from the run, not through the review's
attribution: tests/support/review_truth.py), and the planted findings are still found.
The 30-day month is bench/bench_review_truth.py's."""

from __future__ import annotations

import pytest

from review_truth import CHECKED, PLANTED, Run


@pytest.fixture(scope="module")
def two_days() -> Run:
    return Run(48)


def test_at_least_95_percent_of_the_advice_is_true(two_days: Run) -> None:
    told = two_days.truth()
    assert set(told) == set(CHECKED)
    for kind, truth in told.items():
        assert sum(truth) >= 0.95 * len(truth), f"{kind}: {sum(truth)} of {len(truth)} true"


def test_the_planted_findings_are_still_found(two_days: Run) -> None:
    # the drift comes at 400 h of the month: outside two days
    assert set(PLANTED[:3]) <= two_days.found()
