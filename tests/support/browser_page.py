"""Driving the dashboard in a real browser: sign in, click what the map drew, save
screenshots. Shared by the browser lane (tests/browser) and the dashboard benchmark."""

from __future__ import annotations

import os
import time
from pathlib import Path

from playwright.sync_api import Page
from thorn_stack import Stack

# Debian's chromium (make test-deps installs it): Playwright drives it, nothing is downloaded.
CHROMIUM = Path(os.environ.get("THORN_CHROMIUM", "/usr/bin/chromium"))


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
