"""The browser lane: the dashboard in real headless Chromium (Debian's `chromium` package,
driven by Playwright with its executable path: no browser download) against a live
`thorn-run` stack, which is what `make run` starts.

A stack per module: `lab_stack` with the emulated fabric (root: network namespaces) for
failures and drains, or a bare one (`THORN_EMULATED_FABRIC=0`) for a generated k=16 fabric.
THORN_SCREENSHOT_DIR=docs/images saves the screenshots the docs and the README show.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from browser_page import CHROMIUM
from playwright.sync_api import Browser, Page, sync_playwright
from thorn_stack import Stack, run_stack


@pytest.fixture(scope="module")
def lab_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if os.geteuid() != 0:
        pytest.skip("the emulated fabric needs root (network namespaces)")
    with run_stack(tmp_path_factory.mktemp("browser-lab"), emulated=True) as stack:
        yield stack


@pytest.fixture(scope="module")
def bare_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with run_stack(tmp_path_factory.mktemp("browser-bare"), emulated=False) as stack:
        yield stack


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test-deps` installs Debian's chromium")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1500, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    context.close()
    assert not errors, f"the page threw: {errors}"
