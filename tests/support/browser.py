"""A real headless Chromium (Debian's) driven by Playwright, for the browser tests.

Playwright cannot download its own browser here, so it is pointed at the system's
executable. With GPUPOOL_REQUIRE_BROWSER=1 (as `.ci/run` sets) a missing Chromium fails the
test instead of skipping it. `watch(page)` records console errors and every request, so a
test can assert that a page asked no host but the one it was served from.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

# Flags that keep Chromium from dialling out on its own (update checks, sync, QUIC probes):
# on a closed network those connections are refused and only add noise and start-up time.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
]


def chromium_path() -> str:
    """The Chromium executable, or skip (fail under GPUPOOL_REQUIRE_BROWSER=1)."""
    path = os.environ.get("GPUPOOL_CHROMIUM") or shutil.which("chromium")
    if path:
        return path
    why = "Debian's chromium is not installed (apt-get install chromium)"
    if os.environ.get("GPUPOOL_REQUIRE_BROWSER") == "1":
        pytest.fail(why)
    pytest.skip(why)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium browser for one test (or one module)."""
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class PageWatch:
    """What a page did: console errors, page errors, and the URLs it requested."""

    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def hosts(self) -> set[str]:
        """Every scheme://host:port asked for, data: and blob: URLs left out."""
        out = set()
        for url in self.requests:
            u = urlparse(url)
            if u.scheme in ("data", "blob", "about"):
                continue
            out.add(f"{u.scheme}://{u.netloc}" if u.netloc else u.scheme)
        return out


def watch(page: Any) -> PageWatch:
    """Start recording `page`'s console errors, uncaught exceptions and requests."""
    w = PageWatch()
    page.on("console", lambda m: m.type == "error" and w.console_errors.append(m.text))
    page.on("pageerror", lambda e: w.console_errors.append(f"uncaught: {e}"))
    page.on("request", lambda r: w.requests.append(r.url))
    return w


def screenshot(page: Any, name: str) -> Path:
    """A full-page PNG of `page` written to bench/results/NAME.png (kept for the docs)."""
    out = Path(__file__).resolve().parents[2] / "bench" / "results" / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out), full_page=True)
    return out
