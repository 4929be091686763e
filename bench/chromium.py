"""Headless Chromium for the web page's benchmark and tests: Debian's chromium and
chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver), driven by Selenium.

Nothing is downloaded: the driver's path is given, so Selenium Manager is never asked.
`chromium_missing` says why a run cannot happen here. `open_browser` starts a fresh profile
each time, with the flags this machine needs (no sandbox as root, no GPU, no background
networking: a closed network refuses those connections, many at a time).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM = os.environ.get("T3D_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("T3D_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--mute-audio",
)

# What a long task is made of: tasks, script calls, style, layout, paint, garbage collection.
TRACE_CATEGORIES = "devtools.timeline,disabled-by-default-devtools.timeline,v8,blink.user_timing"


def chromium_missing() -> str | None:
    """Why Chromium cannot be driven here, or None when it can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"{path} is missing: install Debian's {package} (apt-get install chromium chromium-driver; .ci/run does)"
    return None


@contextmanager
def open_browser(width: int = 1280, height: int = 860, *, dark: bool = False, trace: bool = False) -> Iterator[Any]:
    """A headless Chromium with a fresh, empty profile, quit (and its profile removed) at exit.
    ``dark`` asks pages for the dark colour scheme (prefers-color-scheme). ``trace``: the
    renderer's timeline trace events (`TRACE_CATEGORIES`) come with ``get_log("performance")``,
    each call handing over those since the last."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="t3d-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    if dark:
        options.add_argument("--blink-settings=preferredColorScheme=0")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", **({"performance": "ALL"} if trace else {})})
    if trace:
        options.add_experimental_option(
            "perfLoggingPrefs", {"enableNetwork": False, "enablePage": False, "traceCategories": TRACE_CATEGORIES}
        )
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        try:
            driver.quit()
        finally:
            shutil.rmtree(profile, ignore_errors=True)
