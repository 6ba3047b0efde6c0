"""Headless Chromium for the browser tests: Debian's /usr/bin/chromium (`make chromium`
installs it), driven by Playwright for Python; nothing is downloaded."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from tests.support.processes import REPO

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = REPO / "var" / "screenshots"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@contextlib.contextmanager
def chromium():
    if not CHROMIUM.exists():
        raise RuntimeError("Chromium is missing: `make chromium` installs Debian's package")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs its event loop on this thread, which Django's ORM guard takes
    # for async code; the tests' ORM calls are plain sync calls between browser steps.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
