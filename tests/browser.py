"""Headless Chromium for the web page's tests and benchmark: Debian's chromium and
chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver), driven by Selenium.

Nothing is downloaded: the driver's path is given, so Selenium Manager is never asked.
`chromium_missing` says why a test must skip (the packages are not installed, or
selenium is not). `open_browser` starts a fresh profile each time, with the flags this
machine needs (no sandbox as root, no GPU, no background networking: its closed network
refuses those connections). `Page` wraps a driver for Trio tests: every WebDriver call
runs in a worker thread, so the in-process daemon keeps serving meanwhile, and every wait
polls for a condition (no sleeps as synchronisation).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

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


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"{path} is missing: install Debian's {package} (apt-get install chromium chromium-driver; .ci/run does)"
    return None


@contextmanager
def open_browser(width: int = 1280, height: int = 860, *, dark: bool = False) -> Iterator[Any]:
    """A headless Chromium with a fresh, empty profile, quit (and its profile removed) at exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="t3d-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    if dark:
        options.add_argument("--force-dark-mode")
        options.add_argument("--blink-settings=preferredColorScheme=0")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        try:
            driver.quit()
        finally:
            shutil.rmtree(profile, ignore_errors=True)


class Page:
    """A driver seen from a Trio test: every call in a worker thread."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args)

    async def get(self, url: str) -> None:
        await self.run(self.driver.get, url)

    async def js(self, script: str, *args: Any) -> Any:
        return await self.run(self.driver.execute_script, script, *args)

    async def wait(self, condition: Callable[[], Any], seconds: float = 30, what: str = "") -> Any:
        """Poll ``condition`` (run in a worker thread, exceptions count as false) until it
        returns something true; fail naming ``what`` after ``seconds``."""
        last: BaseException | None = None
        with trio.move_on_after(seconds):
            while True:
                try:
                    value = await self.run(condition)
                    if value:
                        return value
                except Exception as exc:  # a stale or missing element, mid-render
                    last = exc
                await trio.sleep(0.05)
        raise AssertionError(f"timed out after {seconds} s waiting for {what or condition}: {last!r}\n{self.console()}")

    async def wait_js(self, script: str, seconds: float = 30, what: str = "") -> Any:
        return await self.wait(lambda: self.driver.execute_script(script), seconds, what or script)

    async def css(self, selector: str, seconds: float = 30) -> Any:
        """The first element matching ``selector`` once it is there and shown."""
        from selenium.webdriver.common.by import By

        def find() -> Any:
            for el in self.driver.find_elements(By.CSS_SELECTOR, selector):
                if el.is_displayed():
                    return el
            return None

        return await self.wait(find, seconds, f"a visible {selector}")

    async def text_of(self, selector: str) -> str:
        return str(await self.js("const el = document.querySelector(arguments[0]); return el ? el.textContent : ''", selector))

    async def click(self, selector: str, seconds: float = 30) -> None:
        element = await self.css(selector, seconds)
        await self.run(element.click)

    async def keys(self, *keys: str) -> None:
        from selenium.webdriver.common.action_chains import ActionChains

        def send() -> None:
            ActionChains(self.driver).send_keys(*keys).perform()

        await self.run(send)

    async def screenshot(self, path: Path) -> None:
        await self.run(self.driver.save_screenshot, str(path))

    def console(self) -> str:
        try:
            entries = self.driver.get_log("browser")
        except Exception:
            return ""
        return "\n".join(f"console {e.get('level')}: {e.get('message')}" for e in entries[-20:])
