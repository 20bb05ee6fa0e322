"""A real browser for the live pages: Debian's Chromium, headless, driven by Selenium.

``make test`` installs Chromium and its driver (the device environment's set-up); where they are
absent the browser tests skip, saying so. Waits poll the page (``until``) within a bound and
never stand in for an assertion.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: How long a page may take to show what it should, on a machine busy with other suites.
WITHIN_S = 90.0


def _missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.is_file() and shutil.which(path.name) is None:
            return f"{path} is absent: apt-get install -y chromium chromium-driver (make test installs them)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for a test module's pages."""
    missing = _missing()
    if missing is not None:
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM if CHROMIUM.is_file() else shutil.which("chromium"))
    # No sandbox: it refuses to run as root, and needs user namespaces a container may not give; the
    # pages are the suite's own.
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER if CHROMEDRIVER.is_file() else shutil.which("chromedriver"))),
                              options=options)
    driver.set_page_load_timeout(WITHIN_S)
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    """Poll ``condition(driver)`` until it returns something true (returned); fail naming ``what``."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WITHIN_S, poll_frequency=0.1).until(condition)
    except TimeoutException:
        raise AssertionError(f"the page did not show {what} within {WITHIN_S:g} s") from None


def read(driver: Any, ids: dict[str, str]) -> dict[str, str]:
    """The text of several elements in one script: one render's values, never two renders' mixed."""
    script = "return {" + ", ".join(f"{name!r}: (document.getElementById({id_!r}) || {{}}).textContent"
                                    for name, id_ in ids.items()) + "};"
    return driver.execute_script(script)
