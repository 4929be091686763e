"""Headless Chromium for the web page's tests: the launcher is bench/chromium.py (Debian's
chromium and chromium-driver, nothing downloaded); `Page` wraps a driver for Trio tests:
every WebDriver call runs in a worker thread, so the in-process daemon keeps serving
meanwhile, and every wait polls for a condition (no sleeps as synchronisation).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from bench.chromium import chromium_missing, open_browser

__all__ = ["Page", "chromium_missing", "open_browser"]


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
