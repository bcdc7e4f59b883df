"""The status page's browser fixtures, for every browser test module: one Chromium per
module and the gate of the main scenario (defined beside the page's first tests)."""

from tests.browser.test_status_page import browser, scenario

__all__ = ["browser", "scenario"]
