"""Headless Chromium for the tests of pages (`history --html`, `report --html`): the page as a real browser
builds it, kept off the network; a test skips, saying why, where no Chromium is installed."""
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# Flags that keep a headless browser from reaching out to the network or needing a GPU or a sandbox.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--dump-dom"]


def installed_browser() -> str:
    """The path of an installed Chromium; skips the calling test where there is none."""
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no Chromium found (run_tests.sh installs the Debian package `chromium` where it can)")
    return browser


def render(page: Path, profile: Path) -> subprocess.CompletedProcess:
    """Load `page` in headless Chromium with a fresh profile folder `profile`: stdout holds the DOM the page
    built (its script run), stderr the browser's log, console messages included (lines with ":CONSOLE")."""
    profile.mkdir()
    return subprocess.run([installed_browser(), *FLAGS, f"--user-data-dir={profile}", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
