"""What health accepts as an agent report, and how it says what is wrong with the rest."""

from __future__ import annotations

import pytest

from thorn.events import AgentReport, CarrierReport, utcnow
from thorn_health.service import ReportRefused, parse_report


def payload(node: str = "leaf1", items: int = 1) -> bytes:
    item = CarrierReport(port="swp1", admin_up=True, carrier=True, oper_state="up",
                         detected_at=utcnow())  # fmt: skip
    report = AgentReport(node=node, seq=3, sent_at=utcnow(), items=[item] * items)
    return report.model_dump_json().encode()


def test_a_good_report_is_parsed() -> None:
    report = parse_report("agent.report.leaf1", payload(), max_items=10)
    assert report.node == "leaf1" and report.seq == 3


def test_a_dotted_node_name_matches_its_multi_token_subject() -> None:
    assert parse_report("agent.report.rack1.leaf1", payload("rack1.leaf1"), 10).node == (
        "rack1.leaf1"
    )


@pytest.mark.parametrize(
    ("subject", "data", "limit", "message"),
    [
        ("agent.report.leaf1", b"\xff\xfe", 10, "payload: Invalid JSON"),
        ("agent.report.leaf1", b"[]", 10, "payload: Input should be an object"),
        ("agent.report.leaf1", payload().replace(b'"carrier":true', b'"carrier":"maybe"'), 10,
         "items.0.carrier.carrier: Input should be a valid boolean"),
        ("agent.report.leaf1", payload().replace(b'"kind":"carrier"', b'"kind":"smoke"'), 10,
         "items.0: Input tag 'smoke' found using 'kind' does not match"),
        ("agent.report.leaf1", payload().replace(b'"seq":3', b'"seq":3,"extra":1'), 10,
         "extra: Extra inputs are not permitted"),
        ("agent.report.spine1", payload(), 10, "node: 'leaf1' does not match the subject's"),
        ("agent.report.leaf1", payload(items=3), 2, "items: 3 items, more than this health's"),
        ("agent.report.leaf1", payload(items=1).replace(b'"items":[', b'"items":[' + b"1," * 1000),
         10, "items: List should have at most 1000 items"),
    ],
    ids=["not-json", "not-an-object", "bad-field", "unknown-kind", "unknown-field",
         "subject-mismatch", "over-the-limit", "over-the-schema-limit"],
)  # fmt: skip
def test_a_malformed_report_is_refused_naming_what_is_wrong(
    subject: str, data: bytes, limit: int, message: str
) -> None:
    with pytest.raises(ReportRefused) as refused:
        parse_report(subject, data, limit)
    assert message in str(refused.value)
