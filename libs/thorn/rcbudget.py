"""RC retry budgets (pure): how long a failover may take before a tenant's RDMA queue pairs
notice, from the `NCCL_IB_TIMEOUT` and `NCCL_IB_RETRY_CNT` its jobs run with.

An RC queue pair waits one local ACK timeout, 4.096 us x 2^NCCL_IB_TIMEOUT (the IB spec's
minimum: an HCA may wait longer, never shorter), for a packet's ACK; then it sends the packet
again, up to NCCL_IB_RETRY_CNT times, and then fails with IBV_WC_RETRY_EXC_ERR:

- a packet lost when the path failed is sent again after one timeout T: a failover that ends
  within T costs that one retransmission and nothing else;
- one that ends within k x T costs k retransmissions; the last of `retry_cnt` leaves
  `retry_cnt` x T after the loss, so the queue pair survives a failover shorter than that;
- the error itself surfaces (retry_cnt + 1) x T after the loss: the retry budget (~0.54 s at
  timeout 14, ~34 s at NCCL's default 20 with 7 retries).

`Tenancy` maps what a failover moved ((source, peer) host pairs; a switch's destination
prefixes) to the tenants whose workloads those pairs carry, through the VNIs they share.
"""

from __future__ import annotations

import bisect
import ipaddress
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import Field

from thorn.model import NCCL_DEFAULT_IB_RETRY_CNT, NCCL_DEFAULT_IB_TIMEOUT, Strict

if TYPE_CHECKING:
    from thorn.fabric import Fabric

IB_TIME_UNIT_US = 4.096  # the IB spec's unit of the local ACK timeout
MEMO_MAX = 100_000  # failovers whose tenants a `Tenancy` remembers


def rc_timeout_ms(timeout: int) -> float:
    """One RC local ACK timeout, in ms: 4.096 us x 2^timeout."""
    return IB_TIME_UNIT_US * float(1 << timeout) / 1000


def retry_budget_ms(timeout: int, retry_cnt: int) -> float:
    """From a lost packet to IBV_WC_RETRY_EXC_ERR: one timeout, then one per retry."""
    return rc_timeout_ms(timeout) * (retry_cnt + 1)


def last_retransmission_ms(timeout: int, retry_cnt: int) -> float:
    """When the last retransmission leaves after a lost packet: a failover must end by then."""
    return rc_timeout_ms(timeout) * retry_cnt


def retransmissions(gap_ms: float, timeout: int) -> int:
    """Retransmissions a packet lost at the failure needs when its path is back `gap_ms`
    later: the first one that leaves after the repair gets through."""
    if gap_ms <= 0:
        return 0
    return max(1, math.ceil(gap_ms / rc_timeout_ms(timeout)))


class RcBudget(Strict):
    """A tenant's effective budget: what it declared, else NCCL's default, and what that
    allows a failover."""

    nccl_ib_timeout: int = Field(description="the value in effect (declared, or NCCL's 20)")
    nccl_ib_timeout_declared: bool = Field(description="false: not declared, NCCL's default")
    nccl_ib_retry_cnt: int = Field(description="the value in effect (declared, or NCCL's 7)")
    nccl_ib_retry_cnt_declared: bool = Field(description="false: not declared, NCCL's default")
    rc_timeout_ms: float = Field(description="one RC timeout: 4.096 us x 2^nccl_ib_timeout")
    last_retransmission_ms: float = Field(
        description="nccl_ib_retry_cnt x one timeout: the last retransmission leaves this long "
        "after a lost packet; a longer failover fails the queue pairs"
    )
    retry_budget_ms: float = Field(
        description="(nccl_ib_retry_cnt + 1) x one timeout: when IBV_WC_RETRY_EXC_ERR surfaces"
    )

    @classmethod
    def of(cls, timeout: int | None, retry_cnt: int | None) -> RcBudget:
        """The budget of declared values (None: not declared, NCCL's default)."""
        t = NCCL_DEFAULT_IB_TIMEOUT if timeout is None else timeout
        r = NCCL_DEFAULT_IB_RETRY_CNT if retry_cnt is None else retry_cnt
        return cls(
            nccl_ib_timeout=t,
            nccl_ib_timeout_declared=timeout is not None,
            nccl_ib_retry_cnt=r,
            nccl_ib_retry_cnt_declared=retry_cnt is not None,
            rc_timeout_ms=round(rc_timeout_ms(t), 6),
            last_retransmission_ms=round(last_retransmission_ms(t, r), 6),
            retry_budget_ms=round(retry_budget_ms(t, r), 6),
        )


class BudgetStatus(StrEnum):
    """How a failover (or a tenant's p99) compares with the budget."""

    within_one_timeout = "within_one_timeout"  # at most one retransmission
    retransmits = "retransmits"  # several retransmissions; the queue pairs survive
    exceeds_retry_budget = "exceeds_retry_budget"  # the queue pairs fail
    unmeasured = "unmeasured"  # no measured time to compare
    no_failovers = "no_failovers"  # (summary only) none in the window touched the tenant


def status_of(gap_ms: float, budget: RcBudget) -> BudgetStatus:
    needed = retransmissions(gap_ms, budget.nccl_ib_timeout)
    if needed > budget.nccl_ib_retry_cnt:
        return BudgetStatus.exceeds_retry_budget
    return BudgetStatus.within_one_timeout if needed <= 1 else BudgetStatus.retransmits


def format_ms(value: float) -> str:
    """A duration for a sentence: three significant figures, seconds from 1 s."""
    if value >= 1000:
        return f"{_figures(value / 1000)} s"
    return f"{_figures(value)} ms"


def format_percent(fraction: float) -> str:
    percent = fraction * 100
    if percent >= 10 or percent == 0:
        return f"{percent:.0f}%"
    return f"{percent:.2g}%"


def _figures(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _consequence(status: BudgetStatus, needed: int, budget: RcBudget) -> str:
    if status is BudgetStatus.exceeds_retry_budget:
        return (
            f"over the retry budget: {needed} retransmissions needed, "
            f"NCCL_IB_RETRY_CNT={budget.nccl_ib_retry_cnt} allows "
            f"{budget.nccl_ib_retry_cnt}; the queue pairs fail (IBV_WC_RETRY_EXC_ERR)"
        )
    if status is BudgetStatus.retransmits:
        return f"{needed} retransmissions of {budget.nccl_ib_retry_cnt}"
    return "at most one retransmission"


def sentence(label: str, gap_ms: float, budget: RcBudget) -> str:
    """`p99 failover 4 ms = 6% of one RC timeout at NCCL_IB_TIMEOUT=14 (at most one
    retransmission)`."""
    status = status_of(gap_ms, budget)
    needed = retransmissions(gap_ms, budget.nccl_ib_timeout)
    return (
        f"{label} {format_ms(gap_ms)} = {format_percent(gap_ms / budget.rc_timeout_ms)} of one"
        f" RC timeout at NCCL_IB_TIMEOUT={budget.nccl_ib_timeout}"
        f" ({_consequence(status, needed, budget)})"
    )


# --- one failover ------------------------------------------------------------------------------


class RcVerdict(Strict):
    """One failover against one affected tenant's budget."""

    tenant: str
    budget: RcBudget
    measured_ms: float | None = Field(
        description="the failover's gap (detection to the last flip applied, one clock); null:"
        " not measured (`unmeasured_reason`)"
    )
    status: BudgetStatus
    fraction_of_rc_timeout: float | None = Field(description="measured_ms / rc_timeout_ms")
    fraction_of_retry_budget: float | None = Field(description="measured_ms / retry_budget_ms")
    retransmissions: int | None = Field(
        description="retransmissions a packet lost at the failure needs (the queue pairs "
        "survive while this is at most nccl_ib_retry_cnt)"
    )
    within_rc_timeout: bool | None = Field(description="ended within one RC timeout")
    within_retry_budget: bool | None = Field(
        description="ended before the last retransmission: the queue pairs survive"
    )
    summary: str = Field(description="the verdict in one sentence")
    unmeasured_reason: str | None = None


def verdict(tenant: str, budget: RcBudget, gap_ms: float | None, why_not: str) -> RcVerdict:
    """One failover (`gap_ms`, or None and `why_not`) against `tenant`'s budget."""
    if gap_ms is None:
        return RcVerdict(
            tenant=tenant, budget=budget, measured_ms=None, status=BudgetStatus.unmeasured,
            fraction_of_rc_timeout=None, fraction_of_retry_budget=None, retransmissions=None,
            within_rc_timeout=None, within_retry_budget=None,
            summary=f"not measured: {why_not}", unmeasured_reason=why_not,
        )  # fmt: skip
    status = status_of(gap_ms, budget)
    return RcVerdict(
        tenant=tenant, budget=budget, measured_ms=gap_ms, status=status,
        fraction_of_rc_timeout=round(gap_ms / budget.rc_timeout_ms, 6),
        fraction_of_retry_budget=round(gap_ms / budget.retry_budget_ms, 6),
        retransmissions=retransmissions(gap_ms, budget.nccl_ib_timeout),
        within_rc_timeout=gap_ms <= budget.rc_timeout_ms,
        within_retry_budget=status is not BudgetStatus.exceeds_retry_budget,
        summary=sentence("failover", gap_ms, budget),
    )  # fmt: skip


# --- a tenant over many failovers --------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (a value that was measured, never an interpolation)."""
    if not values:
        raise ValueError("a percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


class TenantBudgetSummary(Strict):
    """A tenant's budget against the failovers that touched its workloads in a window."""

    tenant: str
    budget: RcBudget
    failovers: int = Field(description="failovers in the window that moved the tenant's pairs")
    measured: int = Field(description="of those, with a measured time (one clock)")
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    status: BudgetStatus = Field(description="the p99's status")
    p99_fraction_of_rc_timeout: float | None
    p99_fraction_of_retry_budget: float | None
    over_rc_timeout: int = Field(description="measured failovers longer than one RC timeout")
    over_retry_budget: int = Field(description="measured failovers that fail the queue pairs")
    summary: str = Field(description="the verdict in one sentence")
    warning: str | None = Field(
        description="set when the budget is tighter than the measured p99: its failovers "
        "cost several retransmissions, or fail the queue pairs"
    )


def summarise(tenant: str, budget: RcBudget, gaps: Sequence[float | None]) -> TenantBudgetSummary:
    """`gaps`: the measured time of each failover that touched the tenant (None: unmeasured)."""
    measured = [g for g in gaps if g is not None]
    if not measured:
        status = BudgetStatus.unmeasured if gaps else BudgetStatus.no_failovers
        text = (
            f"{len(gaps)} failovers, none measured on one clock"
            if gaps
            else "no failover touched this tenant in the window"
        )
        return TenantBudgetSummary(
            tenant=tenant, budget=budget, failovers=len(gaps), measured=0, p50_ms=None,
            p99_ms=None, max_ms=None, status=status, p99_fraction_of_rc_timeout=None,
            p99_fraction_of_retry_budget=None, over_rc_timeout=0, over_retry_budget=0,
            summary=text, warning=None,
        )  # fmt: skip
    p50, p99 = percentile(measured, 50), percentile(measured, 99)
    status = status_of(p99, budget)
    return TenantBudgetSummary(
        tenant=tenant, budget=budget, failovers=len(gaps), measured=len(measured),
        p50_ms=p50, p99_ms=p99, max_ms=max(measured), status=status,
        p99_fraction_of_rc_timeout=round(p99 / budget.rc_timeout_ms, 6),
        p99_fraction_of_retry_budget=round(p99 / budget.retry_budget_ms, 6),
        over_rc_timeout=sum(1 for g in measured if g > budget.rc_timeout_ms),
        over_retry_budget=sum(1 for g in measured
                              if status_of(g, budget) is BudgetStatus.exceeds_retry_budget),
        summary=sentence("p99 failover", p99, budget),
        warning=_warning(p99, budget, status),
    )  # fmt: skip


def _warning(p99: float, budget: RcBudget, status: BudgetStatus) -> str | None:
    declared = "declared" if budget.nccl_ib_timeout_declared else "NCCL's default"
    if status is BudgetStatus.exceeds_retry_budget:
        return (
            f"budget tighter than the measured p99: p99 failover {format_ms(p99)} is longer "
            f"than the {budget.nccl_ib_retry_cnt} retransmissions of NCCL_IB_TIMEOUT="
            f"{budget.nccl_ib_timeout} ({declared}) allow "
            f"({format_ms(budget.last_retransmission_ms)}): this tenant's queue pairs would "
            "fail with IBV_WC_RETRY_EXC_ERR; raise NCCL_IB_TIMEOUT or NCCL_IB_RETRY_CNT, or "
            "shorten detection"
        )
    if status is BudgetStatus.retransmits:
        needed = retransmissions(p99, budget.nccl_ib_timeout)
        return (
            f"budget tighter than the measured p99: p99 failover {format_ms(p99)} is longer "
            f"than one RC timeout at NCCL_IB_TIMEOUT={budget.nccl_ib_timeout} ({declared}, "
            f"{format_ms(budget.rc_timeout_ms)}): failovers cost up to {needed} "
            f"retransmissions of {budget.nccl_ib_retry_cnt}"
        )
    return None


# --- which tenants a failover touched ----------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """What one node moved: a host's peer hosts, or a switch's destination prefixes."""

    node: str
    tier: str
    peers: Sequence[str]


class Tenancy:
    """Tenants' budgets and which tenants' workloads a (source, peer) pair carries, from one
    topology revision."""

    def __init__(self, fabric: Fabric | None = None) -> None:
        self.budgets: dict[str, RcBudget] = {}
        self._tenant_of_vni: dict[int, str] = {}
        self._vnis_of_host: dict[str, set[int]] = {}
        self._hosts_of_vni: dict[int, set[str]] = {}
        self._teps: dict[int, list[tuple[int, str]]] = {4: [], 6: []}  # (address, host)
        self._reachable: frozenset[str] = frozenset()
        self._memo: dict[Hashable, frozenset[str]] = {}
        if fabric is not None:
            self._index(fabric)

    def _index(self, fabric: Fabric) -> None:
        for t in fabric.tenants.values():
            self.budgets[t.name] = RcBudget.of(t.nccl_ib_timeout, t.nccl_ib_retry_cnt)
        self._tenant_of_vni = {v.vni: v.tenant for v in fabric.vnis.values()}
        for w in fabric.workloads.values():
            self._vnis_of_host.setdefault(w.node, set()).add(w.vni)
            self._hosts_of_vni.setdefault(w.vni, set()).add(w.node)
        for tep in fabric.teps.values():
            self._teps[tep.address.version].append((int(tep.address), tep.node))
        for points in self._teps.values():
            points.sort()
        # Tenants with a VNI on two hosts or more: no failover can touch any other.
        self._reachable = frozenset(
            self._tenant_of_vni[v]
            for v, hosts in self._hosts_of_vni.items()
            if len(hosts) > 1 and v in self._tenant_of_vni
        )

    def tenants_of_pair(self, source: str, peer: str) -> set[str]:
        """Tenants with a VNI on both hosts: the pair carries their traffic."""
        shared = self._vnis_of_host.get(source, set()) & self._vnis_of_host.get(peer, set())
        return {self._tenant_of_vni[v] for v in shared if v in self._tenant_of_vni}

    def tenants_toward(self, host: str) -> set[str]:
        """Tenants with a workload on `host` and another on some other host: traffic toward
        `host` carries theirs."""
        return {
            self._tenant_of_vni[v]
            for v in self._vnis_of_host.get(host, set())
            if v in self._tenant_of_vni and len(self._hosts_of_vni.get(v, ())) > 1
        }

    def hosts_in(self, prefix: str) -> set[str]:
        """Hosts with a TEP inside `prefix` (a switch's route toward them)."""
        try:
            net = ipaddress.ip_network(prefix, strict=False)
        except ValueError:
            return set()
        points = self._teps[net.version]
        low = bisect.bisect_left(points, (int(net.network_address), ""))
        high = bisect.bisect_right(points, (int(net.broadcast_address), "\U0010ffff"))
        return {host for _, host in points[low:high]}

    def tenants_of_once(self, key: Hashable, moves: Iterable[Move]) -> frozenset[str]:
        """`tenants_of`, remembered under `key` (a failover and how much it moved) for as long
        as this topology revision is in use: the gauges ask about the same failovers again
        every refresh."""
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= MEMO_MAX:
                self._memo.clear()
            found = self._memo[key] = frozenset(self.tenants_of(moves))
        return found

    def tenants_of(self, moves: Iterable[Move]) -> set[str]:
        """Tenants whose workloads' pairs these moves carried."""
        found: set[str] = set()
        for move in moves:
            if move.tier == "switch":  # peers are destination prefixes, from any source
                hosts = (h for prefix in move.peers for h in self.hosts_in(prefix))
                touched = (self.tenants_toward(h) for h in hosts)
            else:
                touched = (self.tenants_of_pair(move.node, peer) for peer in move.peers)
            for tenants in touched:
                found |= tenants
                if len(found) == len(self._reachable):  # all there are: a big flip stops early
                    return found
        return found
