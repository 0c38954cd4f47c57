"""The report in a real browser: headless Chromium renders it with no console message (no
script error, nothing blocked), its script runs, and the grid and failure table are there.

Skips where no Chromium is installed (Debian: `apt-get install chromium`)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from reports.render import write_runs_report
from records.results import Label
from tests.test_report_doctored import LABEL_CASES, Page, doctored_run

BROWSER = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                if shutil.which(name)), None)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (Debian: apt-get install "
                                                "chromium); the browser check of the report is skipped"),
]


def load(page: Path, profile: Path) -> tuple[str, list[str]]:
    """The DOM after scripts ran, and the page's console messages."""
    proc = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


def test_console_messages_are_detected(tmp_path):
    """The detector itself: a page with a script error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><p>x</p><script>notAFunction();</script>")
    _, console = load(bad, tmp_path / "profile")
    assert any("Uncaught ReferenceError" in line for line in console)


def test_report_renders_without_console_messages(tmp_path):
    write_runs_report([doctored_run(seed=1), doctored_run()], tmp_path / "report",
                      names=["old.json", "new.json"])
    dom, console = load(tmp_path / "report" / "index.html", tmp_path / "profile")
    assert console == []
    page = Page(dom)
    assert page.find("table", class_="grid")
    cells = [a for t, a in page.tags if t == "td" and a.get("class", "").startswith("l-")]
    assert {c["class"] for c in cells} >= {f"l-{label.value}" for label in Label}
    failure_rows = [a for a in page.find("tr") if a.get("id", "").startswith("fail:")]
    assert len(failure_rows) == len([lb for lb in LABEL_CASES
                                     if lb not in (Label.PASS, Label.COMPILED)])
    assert page.find("svg") and page.find("table", id="disagreements") == []  # runs agree
    # the inline script ran to the end: it made every sortable heading clickable
    headings = [a for t, a in page.tags if t == "th" and "cursor" in a.get("style", "")]
    assert len(headings) >= 8
