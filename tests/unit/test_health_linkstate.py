"""A link's health state machine: what it publishes for what it is told (fake clock)."""

from __future__ import annotations

import pytest

from thorn_health.linkstate import Dampening, HealthConfig, LinkHealth, LinkState

A, B, BFD = "carrier:leaf1:swp3", "carrier:spine1:swp1", "bfd:leaf1-spine1"
NO_HOLD = HealthConfig(up_hold=0)  # where the up hold is not what a test is about


def states(transitions: list) -> list[LinkState]:  # type: ignore[type-arg]
    return [t.state for t in transitions]


def test_the_first_report_publishes_the_links_state_with_no_previous_one() -> None:
    link = LinkHealth(7)
    [first] = link.observe(A, True, now=0.0)
    assert (first.link_id, first.previous, first.state, first.source) == (7, None, "up", A)


def test_any_source_saying_down_holds_the_link_down_until_all_say_up() -> None:
    link = LinkHealth(7, NO_HOLD)
    link.observe(A, True, 0.0)
    assert states(link.observe(BFD, False, 1.0)) == [LinkState.down]
    assert link.observe(A, False, 1.1) == []  # already down: nothing new to say
    assert link.observe(BFD, True, 1.2) == []  # A still says down
    [back] = link.observe(A, True, 1.3)
    assert (back.previous, back.state, back.source) == ("down", "up", A)


def test_a_link_that_was_down_is_up_again_only_after_its_sources_said_up_for_the_hold() -> None:
    link = LinkHealth(7, HealthConfig(up_hold=1.0))
    link.observe(A, True, 0.0)
    assert states(link.observe(BFD, False, 1.0)) == [LinkState.down]
    assert link.observe(BFD, True, 2.0) == []  # held
    assert link.held(2.5) and link.wake_in(2.5) == pytest.approx(0.5)
    assert link.tick(2.9) == []
    assert link.wake_in(3.2) == 0  # over: the next tick brings it up
    [back] = link.tick(3.2)
    assert (back.previous, back.state, back.source) == ("down", "up", BFD)
    assert link.wake_in(3.0) is None


def test_a_gray_links_brief_ups_publish_nothing_and_each_break_restarts_the_hold() -> None:
    """BFD on a link losing 70 % of its packets comes Up for a few tens of ms at a time."""
    link = LinkHealth(7, HealthConfig(up_hold=1.0))
    published = link.observe(BFD, True, 0.0)
    published += link.observe(BFD, False, 1.0)
    now = 1.0
    for _ in range(5):
        now += 0.04
        published += link.observe(BFD, True, now)
        published += link.tick(now + 0.03)
        now += 0.05
        published += link.observe(BFD, False, now)
    assert states(published) == [LinkState.up, LinkState.down, LinkState.flapping]
    assert link.wake_in(now) == link.reuse_in(now)  # suppressed: only the reuse waits


def test_the_first_state_of_a_link_and_an_undrain_are_not_held() -> None:
    link = LinkHealth(7, HealthConfig(up_hold=1.0))
    assert states(link.observe(A, True, 0.0)) == [LinkState.up]
    link.set_drained(True, 1.0)
    assert states(link.set_drained(False, 2.0)) == [LinkState.up]


def test_a_restored_machine_that_was_held_is_held_again_from_the_restore() -> None:
    link = LinkHealth(7, HealthConfig(up_hold=1.0))
    link.observe(A, True, 0.0)
    link.observe(A, False, 1.0)
    link.observe(A, True, 1.5)
    again = LinkHealth.restore(7, link.snapshot(), 100.0, HealthConfig(up_hold=1.0))
    assert again.state is LinkState.down and again.wake_in(100.0) == pytest.approx(1.0)
    assert states(again.tick(101.0)) == [LinkState.up]


def test_a_negative_up_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="up hold"):
        HealthConfig(up_hold=-1)


def test_loss_above_the_threshold_degrades_an_up_link_and_recovery_restores_it() -> None:
    link = LinkHealth(7, HealthConfig(degraded_loss=0.02))
    link.observe(A, True, 0.0)
    assert link.observe_loss(0.01, 1.0, "counters") == []
    assert states(link.observe_loss(0.05, 2.0, "counters")) == [LinkState.degraded]
    assert states(link.observe_loss(0.0, 3.0, "counters")) == [LinkState.up]


def test_a_drain_overrides_the_link_state_and_an_undrain_gives_back_the_real_one() -> None:
    link = LinkHealth(7)
    link.observe(A, True, 0.0)
    assert states(link.set_drained(True, 1.0)) == [LinkState.drained]
    assert link.observe(A, False, 2.0) == []  # drained either way
    assert states(link.set_drained(False, 3.0)) == [LinkState.down]


def test_a_flap_storm_is_suppressed_after_a_few_events_and_released_once_quiet() -> None:
    dampening = Dampening(penalty=1000, half_life=15, suppress_at=2000, reuse_at=750,
                          max_penalty=6000)  # fmt: skip
    link = LinkHealth(7, HealthConfig(dampening, up_hold=0))
    published = link.observe(A, True, 0.0)
    now = 0.0
    for _ in range(200):  # a flap every 50 ms for 10 s
        now += 0.025
        published += link.observe(A, False, now)
        now += 0.025
        published += link.observe(A, True, now)
    # 400 reports, 6 events: two flaps pass (1,000 then ~2,000 points, just under 2,000),
    # the third suppresses the link; nothing more is published while it storms.
    assert states(published) == [
        LinkState.up, LinkState.down, LinkState.up, LinkState.down, LinkState.up,
        LinkState.flapping,
    ]  # fmt: skip
    assert link.tick(now + 10) == []  # still suppressed
    wait = link.reuse_in(now)
    assert wait is not None and 44 < wait < 46  # 6000 -> 750: three half-lives
    assert link.tick(now + wait - 1) == []
    [released] = link.tick(now + wait + 0.01)
    assert (released.previous, released.state, released.source) == ("flapping", "up", "dampening")


def test_a_link_that_flaps_rarely_is_never_suppressed() -> None:
    link = LinkHealth(7)
    link.observe(A, True, 0.0)
    published = []
    for n in range(10):  # one flap a minute: the penalty decays in between
        published += link.observe(A, False, 60.0 * n + 1)
        published += link.observe(A, True, 60.0 * n + 2)
    assert LinkState.flapping not in states(published)


def test_a_suppressed_link_that_is_down_stays_out_of_service_when_the_penalty_decays() -> None:
    link = LinkHealth(7)
    link.observe(A, True, 0.0)
    for n in range(3):
        link.observe(A, False, 0.1 * n + 0.05)
        link.observe(A, True, 0.1 * n + 0.1)
    assert link.state == LinkState.flapping
    link.observe(A, False, 1.0)
    assert states(link.tick(1000.0)) == [LinkState.down]  # reused, but it is down


def test_bad_settings_and_bad_loss_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="reuse_at < suppress_at"):
        Dampening(suppress_at=500, reuse_at=750)
    with pytest.raises(ValueError, match="between 0 and 1"):
        LinkHealth(7).observe_loss(1.5, 0.0, "counters")
