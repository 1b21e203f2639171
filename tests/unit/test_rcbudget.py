"""RC budgets (thorn.rcbudget, pure): the timeout arithmetic at the issue's anchors, the
verdict of one failover, a tenant's p50/p99 with its warning, the tenant fields' ranges, and
which tenants a failover's pairs carry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from rc_tenants import fabric_of_two_tenants

from thorn.fabric import Fabric
from thorn.model import FabricDocument, Tenant, TenantUpdate
from thorn.rcbudget import (
    BudgetStatus,
    Move,
    RcBudget,
    Tenancy,
    last_retransmission_ms,
    percentile,
    rc_timeout_ms,
    retransmissions,
    retry_budget_ms,
    status_of,
    summarise,
    verdict,
)

# --- the arithmetic ------------------------------------------------------------------------------


def test_one_rc_timeout_at_14_is_about_67_ms_and_seven_retries_make_about_537_ms() -> None:
    assert rc_timeout_ms(14) == pytest.approx(67.108864)
    assert retry_budget_ms(14, 7) == pytest.approx(536.870912)
    assert last_retransmission_ms(14, 7) == pytest.approx(469.762048)


def test_ncclS_default_timeout_20_with_seven_retries_is_about_34_s() -> None:
    assert rc_timeout_ms(20) == pytest.approx(4294.967296)
    assert retry_budget_ms(20, 7) == pytest.approx(34_359.738368)
    assert retry_budget_ms(18, 7) == pytest.approx(8589.934592)  # NCCL before 2.23


def test_each_step_of_the_timeout_doubles_it() -> None:
    assert rc_timeout_ms(1) == pytest.approx(0.008192)
    assert all(rc_timeout_ms(t + 1) == 2 * rc_timeout_ms(t) for t in range(1, 31))


@pytest.mark.parametrize(
    ("gap_ms", "needed"), [(0.0, 0), (0.001, 1), (67.0, 1), (67.2, 2), (134.2, 2), (470.0, 8)]
)
def test_a_lost_packet_needs_one_retransmission_per_timeout_the_path_stays_broken(
    gap_ms: float, needed: int
) -> None:
    assert retransmissions(gap_ms, 14) == needed


def test_an_undeclared_budget_is_ncclS_default_and_says_so() -> None:
    budget = RcBudget.of(None, None)
    assert (budget.nccl_ib_timeout, budget.nccl_ib_retry_cnt) == (20, 7)
    assert not budget.nccl_ib_timeout_declared and not budget.nccl_ib_retry_cnt_declared
    half = RcBudget.of(14, None)
    assert (half.nccl_ib_timeout, half.nccl_ib_timeout_declared) == (14, True)
    assert (half.nccl_ib_retry_cnt, half.nccl_ib_retry_cnt_declared) == (7, False)
    assert half.rc_timeout_ms == pytest.approx(67.108864)


# --- one failover --------------------------------------------------------------------------------


def test_a_4_ms_failover_at_timeout_14_is_6_percent_of_one_rc_timeout() -> None:
    v = verdict("team-a", RcBudget.of(14, 7), 4.0, "")
    assert v.status is BudgetStatus.within_one_timeout
    assert v.fraction_of_rc_timeout == pytest.approx(4.0 / 67.108864, abs=1e-6)
    assert v.fraction_of_retry_budget == pytest.approx(4.0 / 536.870912, abs=1e-6)
    assert (v.retransmissions, v.within_rc_timeout, v.within_retry_budget) == (1, True, True)
    assert v.summary == (
        "failover 4 ms = 6% of one RC timeout at NCCL_IB_TIMEOUT=14 (at most one retransmission)"
    )


def test_a_failover_longer_than_one_timeout_costs_retransmissions_but_the_qps_survive() -> None:
    v = verdict("team-a", RcBudget.of(14, 7), 150.0, "")
    assert v.status is BudgetStatus.retransmits
    assert (v.retransmissions, v.within_rc_timeout, v.within_retry_budget) == (3, False, True)
    assert v.summary.endswith("(3 retransmissions of 7)")


def test_a_failover_past_the_last_retransmission_fails_the_queue_pairs() -> None:
    budget = RcBudget.of(14, 7)
    # inside (retry + 1) x T, but after the 7th and last retransmission left at 7 x T
    v = verdict("team-a", budget, 500.0, "")
    assert v.status is BudgetStatus.exceeds_retry_budget and v.within_retry_budget is False
    assert v.fraction_of_retry_budget is not None and v.fraction_of_retry_budget < 1
    assert "IBV_WC_RETRY_EXC_ERR" in v.summary


def test_with_no_retries_any_lost_packet_fails_the_queue_pair() -> None:
    budget = RcBudget.of(14, 0)
    assert status_of(1.0, budget) is BudgetStatus.exceeds_retry_budget
    assert status_of(0.0, budget) is BudgetStatus.within_one_timeout  # nothing was lost


def test_a_failover_without_a_measured_time_says_why() -> None:
    v = verdict("team-a", RcBudget.of(14, 7), None, "clocks differ")
    assert v.status is BudgetStatus.unmeasured and v.measured_ms is None
    assert v.fraction_of_rc_timeout is None and v.within_retry_budget is None
    assert (v.unmeasured_reason, v.summary) == ("clocks differ", "not measured: clocks differ")


# --- a tenant over a window ----------------------------------------------------------------------


def test_percentiles_are_nearest_rank_values_that_were_measured() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (
        50.0, 99.0, 100.0,
    )  # fmt: skip
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


@given(st.lists(st.floats(0.001, 1e6), min_size=1, max_size=200))
def test_p50_never_exceeds_p99_and_both_were_measured(values: list[float]) -> None:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    assert p50 <= p99 and p50 in values and p99 in values


def test_a_tenant_whose_failovers_fit_one_timeout_gets_the_sentence_and_no_warning() -> None:
    s = summarise("team-a", RcBudget.of(14, 7), [1.0, 2.0, 4.0, None])
    assert (s.failovers, s.measured, s.p50_ms, s.p99_ms, s.max_ms) == (4, 3, 2.0, 4.0, 4.0)
    assert s.status is BudgetStatus.within_one_timeout and s.warning is None
    assert s.summary.startswith("p99 failover 4 ms = 6% of one RC timeout at NCCL_IB_TIMEOUT=14")
    assert (s.over_rc_timeout, s.over_retry_budget) == (0, 0)


def test_a_budget_tighter_than_the_measured_p99_gets_a_warning() -> None:
    tight = RcBudget.of(10, 7)  # one timeout ~4.2 ms
    s = summarise("team-b", tight, [3.0, 9.0])
    assert s.status is BudgetStatus.retransmits
    assert s.warning is not None and "tighter than the measured p99" in s.warning
    assert "NCCL_IB_TIMEOUT=10" in s.warning and "3 retransmissions" in s.warning
    assert (s.over_rc_timeout, s.over_retry_budget) == (1, 0)


def test_a_p99_past_the_retry_budget_warns_that_the_queue_pairs_fail() -> None:
    s = summarise("team-c", RcBudget.of(4, 1), [1.0, 2.0])  # T = 65.5 us, one retry
    assert s.status is BudgetStatus.exceeds_retry_budget and s.over_retry_budget == 2
    assert s.warning is not None and "IBV_WC_RETRY_EXC_ERR" in s.warning


def test_a_tenant_with_no_or_only_unmeasured_failovers_has_no_percentiles_and_no_warning() -> None:
    none = summarise("t", RcBudget.of(None, None), [])
    assert none.status is BudgetStatus.no_failovers and none.p99_ms is None
    unmeasured = summarise("t", RcBudget.of(None, None), [None, None])
    assert unmeasured.status is BudgetStatus.unmeasured and unmeasured.failovers == 2
    assert none.warning is None and unmeasured.warning is None


# --- the tenant fields ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("nccl_ib_timeout", 0), ("nccl_ib_timeout", 32), ("nccl_ib_timeout", -1),
        ("nccl_ib_timeout", "soon"), ("nccl_ib_retry_cnt", 8), ("nccl_ib_retry_cnt", -1),
    ],
)  # fmt: skip
def test_an_out_of_range_nccl_value_is_refused_naming_the_field(field: str, value: object) -> None:
    for model in (Tenant, TenantUpdate):
        body = {"name": "t", field: value} if model is Tenant else {field: value}
        with pytest.raises(ValidationError) as caught:
            model.model_validate(body)
        assert [e["loc"] for e in caught.value.errors()] == [(field,)]


def test_a_tenant_update_changes_only_the_given_fields_and_null_undeclares() -> None:
    fabric = Fabric()
    fabric.add_tenant(Tenant(name="t", description="d", nccl_ib_timeout=14, nccl_ib_retry_cnt=5))
    changes = fabric.update_tenant("t", TenantUpdate.model_validate({"nccl_ib_timeout": 16}))
    assert fabric.tenant("t") == Tenant(
        name="t", description="d", nccl_ib_timeout=16, nccl_ib_retry_cnt=5
    )
    assert [(c.kind, c.op) for c in changes] == [("tenant", "update")]
    fabric.update_tenant("t", TenantUpdate.model_validate({"nccl_ib_retry_cnt": None}))
    assert fabric.tenant("t").nccl_ib_retry_cnt is None
    assert fabric.update_tenant("t", TenantUpdate.model_validate({})) == []
    with pytest.raises(ValidationError):
        TenantUpdate.model_validate({"description": None})  # a description is never null


def test_the_fabric_document_round_trips_declared_and_undeclared_values() -> None:
    doc = FabricDocument(
        tenants=[Tenant(name="a", nccl_ib_timeout=14, nccl_ib_retry_cnt=7), Tenant(name="b")]
    )
    again = Fabric.from_document(FabricDocument.model_validate_json(doc.model_dump_json()))
    assert again.to_document().tenants == doc.tenants
    assert again.tenant("b").nccl_ib_timeout is None  # undeclared stays undeclared


# --- which tenants a failover touched ------------------------------------------------------------


def test_a_hosts_flip_touches_the_tenants_whose_vnis_both_hosts_share() -> None:
    tenancy = Tenancy(fabric_of_two_tenants())
    assert tenancy.tenants_of([Move("h1", "central", ["h2"])]) == {"a"}
    assert tenancy.tenants_of([Move("h1", "source", ["h2", "h3"])]) == {"a", "b"}
    assert tenancy.tenants_of([Move("h2", "central", ["h3"])]) == set()  # nothing shared
    assert tenancy.tenants_of([Move("h9", "central", ["h1"])]) == set()  # gone from the fabric
    assert tenancy.budgets["b"] == RcBudget.of(None, None)
    assert tenancy.budgets["a"].nccl_ib_timeout == 14 and "d" in tenancy.budgets


def test_a_switch_repair_touches_tenants_with_traffic_toward_the_hosts_in_its_prefixes() -> None:
    tenancy = Tenancy(fabric_of_two_tenants())
    # toward h2 (a /32 of its red TEP): tenant a (h1 <-> h2); not c, which has no other host
    assert tenancy.tenants_of([Move("leaf1", "switch", ["10.0.0.2/32"])]) == {"a"}
    # a collapsed prefix covering h1..h3's blue TEPs
    assert tenancy.tenants_of([Move("spine1", "switch", ["10.0.1.0/30"])]) == {"a", "b"}
    assert tenancy.hosts_in("10.0.1.0/30") == {"h1", "h2", "h3"}
    assert tenancy.hosts_in("10.9.0.0/16") == set() and tenancy.hosts_in("not-a-prefix") == set()


# --- the API's contract --------------------------------------------------------------------------


def test_the_openapi_document_has_the_budget_fields_ranges_and_routes() -> None:
    # The committed document (test_openapi_document checks it is exactly what the code serves).
    document = json.loads((Path(__file__).parents[2] / "openapi/openapi.json").read_text())
    schemas = document["components"]["schemas"]
    for model in ("Tenant", "TenantUpdate"):
        fields = schemas[model]["properties"]
        timeout = fields["nccl_ib_timeout"]["anyOf"][0]
        retry = fields["nccl_ib_retry_cnt"]["anyOf"][0]
        assert (timeout["minimum"], timeout["maximum"]) == (1, 31), model
        assert (retry["minimum"], retry["maximum"]) == (0, 7), model
    assert "rc_budget" in schemas["TenantOut"]["properties"]
    assert "rc_budget" in schemas["FailoverOut"]["properties"]
    assert {"p99_ms", "warning", "summary"} <= set(schemas["TenantBudgetSummary"]["properties"])
    assert {"/api/v1/failovers/budget", "/api/v1/failovers/budget/{tenant}"} <= set(
        document["paths"]
    )
