"""The dashboard against a live `thorn-run` stack with its emulated fabric: it signs in by
token, draws the fabric, shows a lab failure on the map within a second and in the failover
timeline, drains and undrains a link while watching whether it still carries traffic, keeps
viewers read-only and says in words what a refused action was, and answers what-ifs."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from browser_page import click_element, screenshot, sign_in
from playwright.sync_api import Page, expect
from thorn_stack import Stack

MAP_WITHIN_S = 1.0  # a failure shows on the map this soon after it is injected


@pytest.fixture(scope="module")
def stack(lab_stack: Stack) -> Iterator[Stack]:
    lab_stack.wait_planned(hosts=16)
    yield lab_stack


def fabric_link(stack: Stack, a: str, b: str) -> dict[str, Any]:
    links = stack.api("GET", "/api/v1/links", params={"limit": 1000}).json()["items"]
    return next(lk for lk in links if {lk["a"]["node"], lk["b"]["node"]} == {a, b})


def edge_state(page: Page, link_id: object) -> str:
    return str(page.evaluate(f"() => window.thorn.cy.getElementById('l{link_id}').data('state')"))


def test_the_page_signs_in_and_draws_the_whole_fabric_live(stack: Stack, page: Page) -> None:
    sign_in(page, stack)
    summary = stack.api("GET", "/api/v1/fabric/summary").json()
    drawn = page.evaluate("() => [window.thorn.cy.nodes().length, window.thorn.cy.edges().length]")
    assert drawn == [summary["switches"] + summary["hosts"], summary["links"]]
    expect(page.locator("#who")).to_contain_text("(admin)")
    # Tiers: spines above leaves above hosts.
    y = page.evaluate("""() => ['spine1', 'leaf1', 'host1'].map(
        (n) => window.thorn.cy.getElementById(n).position('y'))""")
    assert y[0] < y[1] < y[2]
    # Every link has health's colour once health has seen it (the lab's links are up).
    page.wait_for_function(
        """() => window.thorn.cy.edges().every(
        (e) => e.data('state') === 'up')""",
        timeout=30_000,
    )
    page.fill("input[name=src]", "host1")
    page.fill("input[name=dst]", "host16")
    page.click("text=Show paths")
    expect(page.locator("#path-result")).to_contain_text("red")
    assert page.evaluate("() => window.thorn.cy.edges('.red').length") > 0
    assert page.evaluate("() => window.thorn.cy.edges('.blue').length") > 0
    assert page.evaluate("() => window.thorn.cy.edges('.active').length") > 0
    expect(page.locator("#protection")).to_contain_text("shared risk")
    screenshot(page, "dashboard-paths")


def test_a_wrong_token_is_refused_in_words(stack: Stack, page: Page) -> None:
    page.goto(stack.url + "/")
    page.fill("#token", "thn_not-a-real-token")
    page.click("#signin-form button[type=submit]")
    expect(page.locator("#signin-error")).to_contain_text("Not signed in")


def test_a_lab_failure_shows_on_the_map_within_a_second_and_in_the_timeline(
    stack: Stack, page: Page
) -> None:
    sign_in(page, stack)
    page.wait_for_function(
        """() => window.thorn.cy.edges().every(
        (e) => e.data('state') === 'up')""",
        timeout=30_000,
    )
    page.click("#tabs button[data-tab=failovers]")
    expect(page.locator("#failovers")).to_be_visible()
    link = fabric_link(stack, "leaf1", "spine1")
    end = link["a"] if link["a"]["node"] == "leaf1" else link["b"]
    try:
        stack.thornctl("lab", "fail", "carrier", f"{end['node']}:{end['port']}")
        injected = time.monotonic()
        page.wait_for_function(
            f"""() => ['down', 'flapping'].includes(
            window.thorn.cy.getElementById('l{link["id"]}').data('state'))""",
            timeout=10_000,
        )
        shown_after = time.monotonic() - injected
        assert shown_after <= MAP_WITHIN_S, f"the map showed the failure after {shown_after:.2f} s"
        # Both ends keep other links: they show degraded, not down.
        of = "(n) => window.thorn.cy.getElementById(n).data('state')"
        states = page.evaluate(f"() => ['leaf1', 'spine1'].map({of})")
        assert states == ["degraded", "degraded"], states
        named = re.compile(r"leaf1:\S+ \u2013 spine1|spine1:\S+ \u2013 leaf1")  # the link
        row = page.locator("#failovers tbody tr", has_text=named)
        expect(row.first).to_be_visible(timeout=15_000)
        row.first.click()
        expect(page.locator("#failover-detail")).to_contain_text("Hops")
        screenshot(page, "dashboard-failover")
    finally:
        stack.thornctl("lab", "restore", "--all")
    page.wait_for_function(
        f"""() => window.thorn.cy.getElementById('l{link["id"]}')
        .data('state') === 'up'""",
        timeout=60_000,
    )


def test_an_operator_drains_a_link_until_it_carries_no_traffic_then_undrains_it(
    stack: Stack, page: Page
) -> None:
    sign_in(page, stack, stack.token("operator"))
    link = fabric_link(stack, "leaf2", "spine2")
    click_element(page, f"l{link['id']}")
    expect(page.locator("#panel h2")).to_contain_text("leaf2")
    expect(page.locator("#panel")).to_contain_text("Drops and errors over time")
    page.click("#drain")
    expect(page.locator("#carries-traffic")).to_have_text("no", timeout=60_000)
    page.wait_for_function(
        f"""() => window.thorn.cy.getElementById('l{link["id"]}')
        .data('state') === 'drained'""",
        timeout=10_000,
    )
    assert stack.api("GET", f"/api/v1/drains/links/{link['id']}").json()["carries_traffic"] is False
    screenshot(page, "dashboard-drain")
    expect(page.locator("#undrain")).to_be_enabled(timeout=10_000)
    page.click("#undrain")
    expect(page.locator("#carries-traffic")).to_have_text("yes", timeout=60_000)
    page.wait_for_function(
        f"""() => window.thorn.cy.getElementById('l{link["id"]}')
        .data('state') !== 'drained'""",
        timeout=10_000,
    )


def test_a_viewer_sees_read_only_controls_and_a_refusal_in_words(stack: Stack, page: Page) -> None:
    sign_in(page, stack, stack.token("viewer"))
    expect(page.locator("#recompute")).to_be_disabled()
    click_element(page, "leaf3")
    expect(page.locator("#panel h2")).to_contain_text("leaf3")
    expect(page.locator("#drain")).to_be_disabled()
    expect(page.locator("#undrain")).to_be_disabled()
    # Past the read-only control (as with a stale page): the service refuses, in words.
    page.evaluate("() => { document.getElementById('drain').disabled = false; }")
    page.click("#drain")
    expect(page.locator("#message")).to_contain_text("Not allowed: your token's role (viewer)")
    assert stack.api("GET", "/api/v1/nodes/leaf3").json()["admin_state"] == "up"


def test_a_what_if_names_what_a_spine_failure_would_do_without_doing_it(
    stack: Stack, page: Page
) -> None:
    sign_in(page, stack, stack.token("viewer"))
    click_element(page, "spine1")
    page.click("#tabs button[data-tab=whatif]")
    page.click("text=Add spine1")
    page.click("#simulate")
    expect(page.locator("#whatif-flip")).to_be_visible(timeout=15_000)
    truth = stack.api("GET", "/api/v1/plan/what-if", params={"node": "spine1"}).json()
    shown = [int(page.inner_text(f"#whatif-{k}")) for k in ("flip", "lose", "cut")]
    assert shown == [truth["flip"], truth["lose_protection"], truth["cut"]]
    assert truth["flip"] + truth["lose_protection"] > 0
    assert page.evaluate("() => window.thorn.cy.elements('.failed').length") == 1 + len(
        truth["links"]
    )
    screenshot(page, "dashboard-whatif")
    assert stack.api("GET", "/api/v1/nodes/spine1").json()["admin_state"] == "up"
    # A topology change elsewhere re-reads the fabric; the answer on screen stays.
    seen = "() => Number(document.body.dataset.events || 0)"
    before = page.evaluate(seen)
    made = stack.api("POST", "/api/v1/tenants", json={"name": "whatif-bystander"})
    assert made.status_code == 201, made.text
    page.wait_for_function(f"n => ({seen})() > n", arg=before, timeout=15_000)
    page.wait_for_timeout(1_500)  # the re-read (500 ms after the event) and its render
    assert page.locator("#whatif-flip").inner_text(timeout=1_000) == str(truth["flip"])


def test_a_views_late_answer_does_not_draw_over_the_view_the_user_moved_to(
    stack: Stack, page: Page
) -> None:
    sign_in(page, stack, stack.token("viewer"))
    held: list[Any] = []
    # The node view's answer is held until the user has moved on to the what-if tab.
    page.route("**/api/v1/nodes/*/observed", lambda route: held.append(route))
    click_element(page, "leaf1")
    expect(page.locator("#panel")).to_contain_text("Loading leaf1")
    page.click("#tabs button[data-tab=whatif]")
    expect(page.locator("#whatif-heading")).to_be_visible()
    assert held, "the node view never asked for its node"
    for route in held:
        route.continue_()
    page.wait_for_timeout(1_000)  # the held answer arrives and is drawn (or, now, not)
    expect(page.locator("#whatif-heading")).to_be_visible()
    expect(page.locator("#panel")).not_to_contain_text("admin state")
    page.click("text=Add leaf1")
    expect(page.locator("#panel")).to_contain_text("Fail: leaf1")
