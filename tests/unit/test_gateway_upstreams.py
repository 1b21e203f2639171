"""The gateway's replicas: which one takes the next request, when a failed one is left out,
and which failed requests may go to another replica."""

from __future__ import annotations

from collections import Counter

import pytest

from thorn.config import Settings
from thorn_gateway.upstreams import DOWN_S, Replica, Replicas, replayable


def test_idle_replicas_take_turns() -> None:
    pool = Replicas("topology", ["http://a", "http://b", "http://c"])
    picked = [pool.pick(0.0) for _ in range(6)]
    assert [r.url for r in picked if r is not None] == ["http://a", "http://b", "http://c"] * 2


def test_the_replica_with_fewest_outstanding_requests_is_picked() -> None:
    pool = Replicas("topology", ["http://a", "http://b", "http://c"])
    a, b, c = pool.replicas
    a.outstanding, b.outstanding, c.outstanding = 3, 1, 2
    assert all(pool.pick(0.0) is b for _ in range(5))
    b.outstanding = 5
    assert pool.pick(0.0) is c


def test_a_failed_replica_is_left_out_until_its_mark_runs_out() -> None:
    pool = Replicas("health", ["http://a", "http://b"])
    a, b = pool.replicas
    Replicas.failed(a, now=10.0)
    assert {pool.pick(10.0 + t) is b for t in (0.0, 1.0, DOWN_S - 0.1)} == {True}
    assert Counter(pool.pick(10.0 + DOWN_S) for _ in range(4)) == {a: 2, b: 2}


def test_a_healthy_answer_lifts_a_passive_mark_and_an_unhealthy_one_leaves_it_out() -> None:
    pool = Replicas("health", ["http://a", "http://b"])
    a, b = pool.replicas
    Replicas.failed(a, now=0.0)
    Replicas.checked(a, ok=True)
    assert a.up(0.0)
    Replicas.checked(b, ok=False)
    assert not b.up(100.0)
    assert all(pool.pick(1.0) is a for _ in range(3))
    assert pool.status(1.0) == "degraded"


def test_when_every_replica_is_down_all_are_still_tried_once_each() -> None:
    pool = Replicas("pathcomp", ["http://a", "http://b"])
    for replica in pool.replicas:
        Replicas.failed(replica, now=0.0)
    assert pool.status(0.0) == "down"
    first = pool.pick(0.0)
    second = pool.pick(0.0, [first] if first else [])
    assert {first, second} == set(pool.replicas)
    assert pool.pick(0.0, pool.replicas) is None


def test_a_retry_never_goes_back_to_a_replica_it_tried() -> None:
    pool = Replicas("topology", ["http://a", "http://b", "http://c"])
    tried: list[Replica] = []
    while (replica := pool.pick(0.0, tried)) is not None:
        tried.append(replica)
    assert sorted(r.url for r in tried) == ["http://a", "http://b", "http://c"]


@pytest.mark.parametrize("method", ["GET", "HEAD", "get", "OPTIONS"])
def test_a_read_may_go_to_another_replica_after_its_connection_broke(method: str) -> None:
    assert replayable(method, sent=True)


@pytest.mark.parametrize("method", ["POST", "PATCH", "PUT", "DELETE"])
def test_a_write_goes_to_another_replica_only_if_nothing_was_sent(method: str) -> None:
    assert replayable(method, sent=False)
    assert not replayable(method, sent=True)


def test_a_service_named_again_in_thorn_upstreams_gets_another_replica() -> None:
    settings = Settings(upstreams="topology=http://a:1/,health=http://h:2,topology=http://b:1")
    assert settings.upstream_urls == {"topology": ("http://a:1", "http://b:1"),
                                      "health": ("http://h:2",)}  # fmt: skip


@pytest.mark.parametrize(
    ("value", "named"),
    [("topology=http://a:1,topology=http://a:1/", "topology=http://a:1 is given twice"),
     ("topology", "expected name=http://host:port, got 'topology'")],
)  # fmt: skip
def test_a_bad_upstream_list_is_refused_naming_the_variable(value: str, named: str) -> None:
    with pytest.raises(ValueError, match="THORN_UPSTREAMS") as caught:
        Settings(upstreams=value).upstream_urls  # noqa: B018
    assert named in str(caught.value)
