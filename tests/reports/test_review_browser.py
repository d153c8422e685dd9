"""The review HTML opened from a file in a real headless Chromium: every chart renders, no
console error, no request but the file itself; its screenshot goes to bench/results/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import chromium, screenshot, watch
from gpupool.reports.review import build_review
from gpupool.reports.review_html import SECTIONS, write_html
from review_month import month


@pytest.fixture(scope="module")
def review_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("review") / "review.html"
    write_html(build_review(month()), path)
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def test_review_html_renders_offline_from_a_file(review_file: Path, browser: Any) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    seen = watch(page)
    url = review_file.as_uri()
    page.goto(url, wait_until="load")
    boxes = page.eval_on_selector_all(
        "figure svg",
        "els => els.map(e => { const r = e.getBoundingClientRect();"
        " return [r.width, r.height, e.querySelectorAll('path').length]; })",
    )
    assert len(boxes) == len(SECTIONS)
    for width, height, paths in boxes:
        assert width > 300 and height > 100, boxes
        assert paths > 10, boxes  # something was drawn, not an empty frame
    rows = page.eval_on_selector_all("#t-jobs tbody tr", "els => els.length")
    assert rows > 90
    recs = page.inner_text("#recommendations")
    for name in ("idle-holder", "pair-a", "pair-b", "over-asker", "chat"):
        assert name in recs
    assert page.eval_on_selector("body", "b => b.scrollHeight") > 5000
    assert seen.console_errors == []
    assert seen.requests == [url]
    full = screenshot(page, "review-full")  # the whole review, every section
    assert full.stat().st_size > 100_000
    # docs/review.md's picture: the summary and the first sections, one screen tall.
    shot = full.with_name("review.png")
    page.set_viewport_size({"width": 1280, "height": 1500})
    page.screenshot(path=str(shot), full_page=False)
    full.unlink()  # ~1 MB: written to check it renders, not kept
    assert shot.stat().st_size > 50_000
    page.close()


def test_review_prints_one_section_per_page(review_file: Path, browser: Any) -> None:
    page = browser.new_page()
    seen = watch(page)
    page.goto(review_file.as_uri(), wait_until="load")
    page.emulate_media(media="print")
    breaks = page.eval_on_selector_all(
        "section", "els => els.map(e => getComputedStyle(e).breakBefore)"
    )
    assert breaks[0] == "auto" and set(breaks[1:]) == {"page"}
    assert page.eval_on_selector("nav", "n => getComputedStyle(n).display") == "none"
    # tables print whole: no scroll box cutting them off
    assert page.eval_on_selector(".tablewrap", "t => getComputedStyle(t).overflow") == "visible"
    assert seen.console_errors == []
    page.close()
