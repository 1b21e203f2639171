"""Failovers against tenants' RC budgets (pure, over timelines): which tenants each failover
touched, its verdict for each, and each tenant's p50/p99 over a window. The arithmetic is
`thorn.rcbudget`'s; this only reads timelines.

A failover's measured time is its timeline's gap: from the detection to the last flip applied,
when one clock read both (`gap_ms_upper_bound`). The time from the failure to its detection is
not in it (carrier: ~1-3 ms; BFD: up to interval x multiplier). Tenants are found through the
topology as it is now, not as it was at the failover.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import Gauge

from thorn.health_records import FailoverRecord
from thorn.rcbudget import (
    BudgetStatus,
    Move,
    RcVerdict,
    Tenancy,
    TenantBudgetSummary,
    summarise,
    verdict,
)
from thorn_health.failovers import REPROTECTION, Timeline, timeline

RC_TIMEOUT = Gauge(
    "thorn_health_tenant_rc_timeout_seconds",
    "One RC timeout of the tenant's jobs: 4.096 us x 2^NCCL_IB_TIMEOUT (declared or default)",
    ["tenant"],
)
RETRY_BUDGET = Gauge(
    "thorn_health_tenant_rc_retry_budget_seconds",
    "(NCCL_IB_RETRY_CNT + 1) RC timeouts: when a lost packet's queue pair fails",
    ["tenant"],
)
FAILOVER_QUANTILE = Gauge(
    "thorn_health_tenant_failover_seconds",
    "Measured failover time (detection to the last flip, one clock) over the failovers that "
    "touched the tenant in the window, by quantile (0.5, 0.99, 1 = max)",
    ["tenant", "quantile"],
)
P99_RATIO = Gauge(
    "thorn_health_tenant_failover_p99_rc_timeout_ratio",
    "p99 failover time / one RC timeout of the tenant (above 1: failovers cost retransmissions)",
    ["tenant"],
)
FAILOVERS = Gauge(
    "thorn_health_tenant_failovers",
    "Failovers in the window that touched the tenant, by measured (true: one clock) or not",
    ["tenant", "measured"],
)
WARNING = Gauge(
    "thorn_health_tenant_rc_budget_warning",
    "0: p99 within one RC timeout (or nothing measured); 1: p99 costs several retransmissions;"
    " 2: p99 fails the queue pairs (IBV_WC_RETRY_EXC_ERR)",
    ["tenant"],
)
_LEVEL = {BudgetStatus.retransmits: 1, BudgetStatus.exceeds_retry_budget: 2}


def moves(t: Timeline) -> list[Move]:
    return [Move(node=m.node, tier=m.tier, peers=m.peers) for m in t.moved]


def why_unmeasured(t: Timeline) -> str:
    if not t.traced:
        return "an event without a trace has no hops to measure"
    if t.gap_clocks_differ:
        return f"the gap's ends were read on different clocks ({', '.join(t.gap_clocks)})"
    return "no hops to measure"


def tenants_touched(t: Timeline, tenancy: Tenancy) -> set[str]:
    """Tenants whose pairs the failover moved (none for a re-protection: it moved none)."""
    if t.tier == REPROTECTION:
        return set()
    found = tenancy.tenants_of_once((t.id, t.pairs_moved, len(t.moved)), moves(t))
    return {name for name in found if name in tenancy.budgets}


def failover_verdicts(t: Timeline, tenancy: Tenancy) -> list[RcVerdict]:
    """The failover against each touched tenant's budget, by tenant name."""
    reason = why_unmeasured(t) if t.gap_ms_upper_bound is None else ""
    return [
        verdict(name, tenancy.budgets[name], t.gap_ms_upper_bound, reason)
        for name in sorted(tenants_touched(t, tenancy))
    ]


def summaries_of_traces(
    traces: Iterable[Sequence[FailoverRecord]], tenancy: Tenancy, only: str | None = None
) -> list[TenantBudgetSummary]:
    """`tenant_summaries` over stored traces (each trace's records, as the store gives them)."""
    return tenant_summaries((timeline(t) for t in traces), tenancy, only)


def tenant_summaries(
    timelines: Iterable[Timeline], tenancy: Tenancy, only: str | None = None
) -> list[TenantBudgetSummary]:
    """Every tenant (or `only` that one) against the failovers that touched it."""
    gaps: dict[str, list[float | None]] = {
        name: [] for name in tenancy.budgets if only is None or name == only
    }
    for t in timelines:
        for name in tenants_touched(t, tenancy):
            if name in gaps:
                gaps[name].append(t.gap_ms_upper_bound)
    return [summarise(name, tenancy.budgets[name], gaps[name]) for name in sorted(gaps)]


def export_metrics(summaries: Sequence[TenantBudgetSummary], previous: set[str]) -> set[str]:
    """Set the per-tenant gauges; drop the series of tenants gone since `previous`. Returns
    the tenants exported now."""
    now = {s.tenant for s in summaries}
    for gone in previous - now:
        for gauge in (RC_TIMEOUT, RETRY_BUDGET, P99_RATIO, WARNING):
            gauge.remove(gone)
        for quantile in ("0.5", "0.99", "1"):
            FAILOVER_QUANTILE.remove(gone, quantile)
        for measured in ("true", "false"):
            FAILOVERS.remove(gone, measured)
    for s in summaries:
        RC_TIMEOUT.labels(s.tenant).set(s.budget.rc_timeout_ms / 1000)
        RETRY_BUDGET.labels(s.tenant).set(s.budget.retry_budget_ms / 1000)
        for quantile, value in (("0.5", s.p50_ms), ("0.99", s.p99_ms), ("1", s.max_ms)):
            FAILOVER_QUANTILE.labels(s.tenant, quantile).set(
                float("nan") if value is None else value / 1000
            )
        ratio = s.p99_fraction_of_rc_timeout
        P99_RATIO.labels(s.tenant).set(float("nan") if ratio is None else ratio)
        FAILOVERS.labels(s.tenant, "true").set(s.measured)
        FAILOVERS.labels(s.tenant, "false").set(s.failovers - s.measured)
        WARNING.labels(s.tenant).set(_LEVEL.get(s.status, 0))
    return now
