"""What the status page's browser tests share: Chromium's flags, where screenshots go, and
waiting for the page's charts."""

from __future__ import annotations

import shutil
from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def wait_for_charts(page) -> None:  # type: ignore[no-untyped-def]
    """Until every chart draws a line of several points."""
    page.wait_for_function(
        """() => {
            const lines = [...document.querySelectorAll('#charts .chart svg polyline')];
            return lines.length >= 3
                && lines.every(l => l.getAttribute('points').split(' ').length >= 5);
        }""",
        timeout=30_000,
    )
