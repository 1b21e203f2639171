"""The browser lane: the dashboard in real headless Chromium (Debian's `chromium` package,
driven by Playwright with its executable path: no browser download) against a live
`thorn-run` stack, which is what `make run` starts.

A stack per module: `lab_stack` with the emulated fabric (root: network namespaces) for
failures and drains, or a bare one (`THORN_EMULATED_FABRIC=0`) for a generated k=16 fabric.
THORN_SCREENSHOT_DIR=docs/images saves the screenshots the docs and the README show.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from thorn_stack import Stack, run_stack

CHROMIUM = Path(os.environ.get("THORN_CHROMIUM", "/usr/bin/chromium"))


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


def sign_in(page: Page, stack: Stack, token: str | None = None) -> None:
    page.goto(stack.url + "/")
    page.fill("#token", token or stack.admin)
    page.click("#signin-form button[type=submit]")
    page.wait_for_selector("#live.on", timeout=15_000)
    page.wait_for_function("() => window.thorn.cy.nodes().length > 0", timeout=30_000)


def screenshot(page: Page, name: str) -> None:
    where = os.environ.get("THORN_SCREENSHOT_DIR")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / f"{name}.png"))


def click_element(page: Page, element_id: str) -> float:
    """A real mouse click on a node or link of the map, where Cytoscape drew it; returns
    when the click was made (time.perf_counter)."""
    page.evaluate(f"""() => {{ const cy = window.thorn.cy;
        cy.zoom(Math.max(cy.zoom(), 0.6)); cy.center(cy.getElementById({element_id!r})); }}""")
    page.wait_for_timeout(100)
    box = page.locator("#map").bounding_box()
    assert box is not None
    point = page.evaluate(f"""() => {{ const el = window.thorn.cy.getElementById({element_id!r});
        const p = el.isNode() ? el.renderedPosition() : el.renderedMidpoint();
        return [p.x, p.y]; }}""")
    clicked = time.perf_counter()
    page.mouse.click(box["x"] + point[0], box["y"] + point[1])
    return clicked
