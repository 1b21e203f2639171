"""Failovers against tenants' RC budgets (thorn_health.budget, pure over timelines): which
tenants a failover touched, its verdict for each from its one-clock gap (or why there is
none), each tenant's p50/p99, and the per-tenant gauges."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from rc_tenants import fabric_of_two_tenants

from thorn.events import FailoverEvent, Trace, new_trace_id
from thorn.model import TenantUpdate
from thorn.rcbudget import BudgetStatus, Tenancy
from thorn_health.budget import export_metrics, failover_verdicts, tenant_summaries
from thorn_health.failovers import Timeline, record_of, timeline

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def ms(n: float) -> datetime:
    return T0 + timedelta(milliseconds=n)


def switch_repair(node: str, prefixes: list[str], applied_ms: float) -> Timeline:
    """A switch's own repair: detected and applied on the switch's clock."""
    trace = Trace(id=new_trace_id())
    trace = trace.then("detected", node, at=ms(0)).then("agent_applied", node, at=ms(applied_ms))
    event = FailoverEvent(node=node, peers=prefixes, from_colour=None, to_colour="backup",
                          at=ms(applied_ms), reason="carrier lost on swp1", tier="switch",
                          trace=trace)  # fmt: skip
    return timeline([record_of(event, 1)])


def central_flip(source: str, peers: list[str]) -> Timeline:
    """Detected on spine1's clock, applied on the source's: the gap is not measured."""
    trace = (
        Trace(id="a1b2c3d4e5f60718")
        .then("detected", "spine1", at=ms(0))
        .then("agent_received", source, at=ms(2))
        .then("agent_applied", source, at=ms(3))
    )
    event = FailoverEvent(node=source, peers=peers, from_colour="red", to_colour="blue",
                          at=ms(3), reason="central: link 5", tier="central",
                          trace=trace)  # fmt: skip
    return timeline([record_of(event, 1)])


def test_a_measured_switch_repair_gets_a_verdict_for_each_tenant_toward_its_prefixes() -> None:
    tenancy = Tenancy(fabric_of_two_tenants())
    verdicts = failover_verdicts(switch_repair("leaf1", ["10.0.1.0/30"], 4.0), tenancy)
    assert [v.tenant for v in verdicts] == ["a", "b"]
    a, b = verdicts
    assert (a.measured_ms, a.budget.nccl_ib_timeout, a.status) == (
        4.0, 14, BudgetStatus.within_one_timeout,
    )  # fmt: skip
    assert a.summary.startswith("failover 4 ms = 6% of one RC timeout at NCCL_IB_TIMEOUT=14")
    # tenant b declared nothing: NCCL's default 20 (~4.3 s per timeout)
    assert (b.budget.nccl_ib_timeout, b.budget.nccl_ib_timeout_declared) == (20, False)
    assert b.fraction_of_rc_timeout is not None and b.fraction_of_rc_timeout < 0.001


def test_a_flip_timed_across_clocks_is_judged_unmeasured_naming_the_clocks() -> None:
    tenancy = Tenancy(fabric_of_two_tenants())
    [v] = failover_verdicts(central_flip("h1", ["h2"]), tenancy)
    assert (v.tenant, v.status, v.measured_ms) == ("a", BudgetStatus.unmeasured, None)
    assert v.unmeasured_reason == "the gap's ends were read on different clocks (spine1, h1)"


def test_an_untraced_flip_and_a_reprotection_and_a_flip_of_no_tenant() -> None:
    tenancy = Tenancy(fabric_of_two_tenants())
    local = FailoverEvent(node="h1", peers=["h3"], from_colour="blue", to_colour="red",
                          at=ms(0), reason="bfd blue to h3 down", tier="source")  # fmt: skip
    [v] = failover_verdicts(timeline([record_of(local, 1)]), tenancy)
    assert (
        v.tenant == "b"
        and v.unmeasured_reason is not None
        and "without a trace" in (v.unmeasured_reason)
    )
    replan = FailoverEvent(node="pathcomp", peers=["h1", "h2"], to_colour="planned", at=ms(9),
                           reason="re-protection: link 5", tier="reprotection",
                           trace=Trace(id="a1b2c3d4e5f60718").then("reprotected", "pathcomp",
                                                                   at=ms(9)))  # fmt: skip
    assert failover_verdicts(timeline([record_of(replan, 2)]), tenancy) == []
    assert failover_verdicts(central_flip("h2", ["h3"]), tenancy) == []


def test_each_tenants_summary_counts_only_the_failovers_that_touched_it() -> None:
    tenancy = Tenancy(fabric_of_two_tenants())
    timelines = [
        switch_repair("leaf1", ["10.0.0.2/32"], 2.0),  # toward h2: tenant a
        switch_repair("leaf1", ["10.0.0.2/32"], 4.0),
        switch_repair("leaf2", ["10.0.0.3/32"], 90.0),  # toward h3: tenant b
        central_flip("h1", ["h2"]),  # tenant a, unmeasured
    ]
    by_name = {s.tenant: s for s in tenant_summaries(timelines, tenancy)}
    assert sorted(by_name) == ["a", "b", "c", "d"]
    a, b = by_name["a"], by_name["b"]
    assert (a.failovers, a.measured, a.p50_ms, a.p99_ms) == (3, 2, 2.0, 4.0)
    assert a.warning is None and a.status is BudgetStatus.within_one_timeout
    assert (b.failovers, b.p99_ms, b.status) == (1, 90.0, BudgetStatus.within_one_timeout)
    assert by_name["d"].status is BudgetStatus.no_failovers
    [only] = tenant_summaries(timelines, tenancy, only="b")
    assert only == b


def test_a_failover_over_a_tenants_budget_warns_in_its_summary() -> None:
    fabric = fabric_of_two_tenants()
    fabric.update_tenant("a", TenantUpdate(nccl_ib_timeout=4, nccl_ib_retry_cnt=1))
    tenancy = Tenancy(fabric)  # one timeout 65.5 us, one retry: 2 ms fails the QPs
    [a] = tenant_summaries([switch_repair("leaf1", ["10.0.0.2/32"], 2.0)], tenancy, only="a")
    assert a.status is BudgetStatus.exceeds_retry_budget
    assert a.warning is not None and a.warning.startswith("budget tighter than the measured p99")


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_the_gauges_follow_the_summaries_and_a_deleted_tenants_series_go() -> None:
    fabric = fabric_of_two_tenants()
    tenancy = Tenancy(fabric)
    timelines = [switch_repair("leaf1", ["10.0.0.2/32"], 4.0), central_flip("h1", ["h2"])]
    exported = export_metrics(tenant_summaries(timelines, tenancy), set())
    assert exported == {"a", "b", "c", "d"}
    assert gauge("thorn_health_tenant_rc_timeout_seconds", tenant="a") == pytest.approx(0.0671089)
    assert gauge("thorn_health_tenant_failover_seconds", tenant="a", quantile="0.99") == 4e-3
    assert gauge("thorn_health_tenant_failovers", tenant="a", measured="true") == 1
    assert gauge("thorn_health_tenant_failovers", tenant="a", measured="false") == 1
    assert gauge("thorn_health_tenant_rc_budget_warning", tenant="a") == 0
    ratio = gauge("thorn_health_tenant_failover_p99_rc_timeout_ratio", tenant="a")
    assert ratio is not None and abs(ratio - 4 / 67.108864) < 1e-6

    fabric.delete_workload("w5")
    fabric.delete_vni(300)
    fabric.delete_tenant("c")
    later = export_metrics(tenant_summaries(timelines, Tenancy(fabric)), exported)
    assert later == {"a", "b", "d"}
    assert gauge("thorn_health_tenant_rc_timeout_seconds", tenant="c") is None
    assert gauge("thorn_health_tenant_failover_seconds", tenant="c", quantile="0.5") is None
