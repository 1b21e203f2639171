"""The dashboard with a k=16 fat-tree (1,024 hosts, 320 switches): the map draws every node
in tiers and stays interactive (a click selects and opens the node's view). The figures
(time to draw, to answer a click) are `make bench`'s, in docs/benchmarks.md."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser_page import click_element, screenshot, sign_in
from playwright.sync_api import Page, expect
from thorn_stack import Stack


@pytest.fixture(scope="module")
def k16(bare_stack: Stack) -> Iterator[Stack]:
    made = bare_stack.api("POST", "/api/v1/fabric/generate/fat-tree", json={"k": 16})
    assert made.status_code == 200, made.text
    bare_stack.wait_planned(hosts=1024)
    yield bare_stack


def test_a_k16_fat_tree_draws_in_tiers_and_answers_clicks(k16: Stack, page: Page) -> None:
    sign_in(page, k16)
    page.wait_for_function("() => window.thorn.cy.nodes().length === 1344", timeout=60_000)
    tiers = page.evaluate("""() => {
        const y = (n) => window.thorn.cy.getElementById(n).position('y');
        return [y('core1'), y('agg1-1'), y('edge1-1'), y('host1-1-1')]; }""")
    assert tiers == sorted(tiers) and len(set(tiers)) == 4, tiers
    screenshot(page, "dashboard-k16")
    click_element(page, "agg3-2")
    expect(page.locator("#panel h2")).to_contain_text("agg3-2", timeout=10_000)
    assert page.evaluate("() => window.thorn.cy.getElementById('agg3-2').selected()")
