"""Leader election on a JetStream KV lease, against a real nats-server (no mocks).

Every candidate has a NATS connection of its own, as separate replicas would. Leases are 1 s
here; a sampler checks every 2 ms that no two candidates ever report `is_leader` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from thorn.bus import Bus
from thorn.events import KeyValueSpec
from thorn.leader import (
    LEADER,
    LEASES_KV,
    LeaderElection,
    Lease,
    LeaseConfigError,
    Transition,
    make_candidate_id,
)
from thorn.natsd import EmbeddedNats

pytestmark = pytest.mark.nats

TTL = 1.0
WAIT = 5.0  # upper bound for anything that should take milliseconds
_buckets = itertools.count()


def fresh_bucket() -> KeyValueSpec:
    """A bucket of its own per test: no lease or max_age leaks from one test to the next."""
    return KeyValueSpec(
        bucket=f"test-leases-{next(_buckets)}",
        description="test leases",
        history=1,
        max_value_size=1024,
        max_bytes=1 << 20,
    )


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(store_dir=tmp_path_factory.mktemp("js")) as server:
        yield server


async def connect(url: str, name: str) -> Bus:
    return await Bus.connect(url, name=name, reconnect_time_wait=0.05)


@contextlib.asynccontextmanager
async def candidates(
    url: str,
    count: int,
    *,
    on_transition: Callable[[Transition], Awaitable[None]] | None = None,
) -> AsyncIterator[tuple[list[Bus], list[LeaderElection]]]:
    """`count` elections of one name, each on its own connection; all closed at the end."""
    spec = fresh_bucket()
    buses = [await connect(url, f"cand-{i}") for i in range(count)]
    elections = [
        LeaderElection(
            bus,
            "pathcomp",
            make_candidate_id(f"c{i}"),
            ttl=TTL,
            bucket=spec,
            on_transition=on_transition,
        )
        for i, bus in enumerate(buses)
    ]
    try:
        yield buses, elections
    finally:
        for election in elections:
            await election.close()
        for bus in buses:
            await bus.close()


async def until(predicate: Callable[[], bool], what: str, within: float = WAIT) -> float:
    """Poll every 5 ms until `predicate()`; returns the seconds it took, fails after `within`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > within:
            pytest.fail(f"{what}: not seen within {within:g} s")
        await asyncio.sleep(0.005)
    return time.monotonic() - start


def leaders(elections: Sequence[LeaderElection]) -> list[LeaderElection]:
    return [e for e in elections if e.is_leader]


class Sampler:
    """Samples every candidate's `is_leader` every 2 ms; remembers any overlap."""

    def __init__(self, elections: Sequence[LeaderElection]) -> None:
        self.elections = elections
        self.samples = 0
        self.overlaps: list[list[str]] = []

    async def _run(self) -> None:
        while True:
            now = leaders(self.elections)
            self.samples += 1
            if len(now) > 1:
                self.overlaps.append([e.candidate_id for e in now])
            await asyncio.sleep(0.002)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Sampler]:
        task = asyncio.create_task(self._run())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert self.samples > 0
        assert self.overlaps == [], f"two leaders at once: {self.overlaps[:3]}"


def gauge(election: LeaderElection) -> float:
    value = LEADER.labels(election.name, election.candidate_id)._value.get()
    assert isinstance(value, float)
    return value


# ------------------------------------------------------------------- the timing rules (no I/O)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_lease_is_acted_on_until_four_fifths_of_the_ttl_after_the_write_was_sent() -> None:
    clock = FakeClock()
    lease = Lease(3.0, clock)
    assert not lease.valid and not lease.held
    sent = clock.now
    clock.now += 0.5  # the acknowledgement took 0.5 s: the lease still counts from `sent`
    assert lease.grant(7, sent, new_term=True)
    assert lease.valid and lease.term == 7
    assert lease.renew_at == pytest.approx(sent + 1.0)
    clock.now = sent + 2.39
    assert lease.valid and lease.remaining() == pytest.approx(0.01)
    clock.now = sent + 2.4
    assert not lease.valid and lease.held  # lapsed, not yet dropped


def test_a_renewal_keeps_the_term_and_moves_the_deadline() -> None:
    clock = FakeClock()
    lease = Lease(3.0, clock)
    assert lease.grant(7, clock.now, new_term=True)
    clock.now += 1.0
    assert lease.grant(9, clock.now, new_term=False)
    assert (lease.term, lease.revision) == (7, 9)
    assert lease.deadline == pytest.approx(clock.now + 2.4)
    assert lease.drop() == 7
    assert not lease.held and not lease.valid


def test_a_write_acknowledged_after_its_own_deadline_grants_nothing() -> None:
    clock = FakeClock()
    lease = Lease(1.0, clock)
    sent = clock.now
    clock.now += 0.8  # a stuck request: by now a rival may be about to acquire
    assert not lease.grant(3, sent, new_term=True)
    assert not lease.held


def test_lease_timing_must_leave_time_to_renew() -> None:
    with pytest.raises(ValueError, match="positive"):
        Lease(0.0)
    with pytest.raises(ValueError, match="renew_every"):
        Lease(1.0, renew_every=0.9)


# ---------------------------------------------------------------------------------- election


async def test_exactly_one_of_three_candidates_leads(nats_server: EmbeddedNats) -> None:
    async with candidates(nats_server.url, 3) as (_, elections):
        for election in elections:
            await election.start()
        async with Sampler(elections).running():
            await until(lambda: len(leaders(elections)) == 1, "a leader")
            [leader] = leaders(elections)
            # across several renewals (every ttl/3), the same single leader
            await asyncio.sleep(TTL * 1.5)
            assert leaders(elections) == [leader]
        for election in elections:
            assert await election.leader_id() == leader.candidate_id
            assert gauge(election) == (1.0 if election is leader else 0.0)
        assert leader.term is not None
        assert [e.term for e in elections if e is not leader] == [None, None]


async def test_a_resigning_leader_hands_over_within_a_second(nats_server: EmbeddedNats) -> None:
    seen: list[Transition] = []

    async def record(transition: Transition) -> None:
        seen.append(transition)

    async with candidates(nats_server.url, 3, on_transition=record) as (_, elections):
        first = elections[0]
        stream = first.transitions()
        await first.start()
        await until(lambda: first.is_leader, "the first candidate leads")
        first_term = first.term
        for election in elections[1:]:
            await election.start()
        await asyncio.sleep(0.1)  # the others are following now
        assert leaders(elections) == [first]

        async with Sampler(elections).running():
            start = time.monotonic()
            assert await first.resign()
            assert not first.is_leader
            took = await until(lambda: len(leaders(elections)) == 1, "a new leader", 1.0)
            await asyncio.sleep(0.1)  # and nobody else follows suit
        [second] = leaders(elections)
        assert second is not first
        # faster than a follower's poll (ttl/3): the KV watch saw the delete
        assert took < min(1.0, TTL / 3), f"hand-over took {took:.3f} s"
        assert time.monotonic() - start < 1.0
        assert second.term is not None and first_term is not None and second.term > first_term

        got = [await anext(stream), await anext(stream)]
        assert [(t.kind, t.reason) for t in got] == [
            ("became_leader", "acquired"),
            ("lost_leadership", "resigned"),
        ]
        assert got[0].term == got[1].term == first_term

        def mine() -> list[Transition]:
            return [t for t in seen if t.candidate == first.candidate_id]

        await until(lambda: len(mine()) >= 2, "the callback saw both transitions")
        assert mine() == got
        stream.close()


async def test_a_killed_leader_is_replaced_within_the_lease_and_never_overlaps(
    nats_server: EmbeddedNats,
) -> None:
    async with candidates(nats_server.url, 3) as (_, elections):
        tasks = {e: asyncio.create_task(e.run()) for e in elections}
        await until(lambda: len(leaders(elections)) == 1, "a leader")
        [old] = leaders(elections)
        # renewals keep it in office past one ttl
        await asyncio.sleep(TTL * 1.2)
        assert leaders(elections) == [old]

        async with Sampler(elections).running():
            killed_at = time.monotonic()
            tasks[old].cancel()  # a crash: no resign, the lease must expire
            with contextlib.suppress(asyncio.CancelledError):
                await tasks[old]
            assert not old.is_leader
            await until(lambda: len(leaders(elections)) == 1, "a new leader", TTL * 2.5)
            took = time.monotonic() - killed_at
        [new] = leaders(elections)
        assert new is not old
        # not before the old lease (renewed at most ttl/3 before the kill) could expire
        assert TTL * 0.5 < took < TTL * 2.5, f"takeover after {took:.3f} s"
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


async def test_a_leader_whose_connection_is_closed_steps_down_and_is_replaced(
    nats_server: EmbeddedNats,
) -> None:
    async with candidates(nats_server.url, 2) as (buses, elections):
        await elections[0].start()
        await until(lambda: elections[0].is_leader, "the first candidate leads")
        await elections[1].start()
        old, new = elections

        async with Sampler(elections).running():
            closed_at = time.monotonic()
            await buses[0].close()  # the process lost its connection, lease not released
            await until(lambda: not old.is_leader, "the old leader steps down", TTL)
            await until(lambda: new.is_leader, "the other candidate leads", TTL * 2.5)
            took = time.monotonic() - closed_at
        assert took < TTL * 2.5, f"takeover after {took:.3f} s"
        assert await new.leader_id() == new.candidate_id
        assert gauge(old) == 0.0 and gauge(new) == 1.0


async def test_run_as_leader_cancels_the_work_when_leadership_is_lost(
    nats_server: EmbeddedNats,
) -> None:
    async with candidates(nats_server.url, 2) as (_, elections):
        working: dict[str, int] = {}
        cancelled: list[str] = []

        def work_for(election: LeaderElection) -> Callable[[], Coroutine[Any, Any, None]]:
            async def work() -> None:
                working[election.candidate_id] = working.get(election.candidate_id, 0) + 1
                try:
                    await asyncio.Event().wait()  # lead forever
                except asyncio.CancelledError:
                    cancelled.append(election.candidate_id)
                    raise

            return work

        first, second = elections
        await first.start()
        await until(lambda: first.is_leader, "the first candidate leads")
        await second.start()
        runners = [asyncio.create_task(e.run_as_leader(work_for(e))) for e in elections]
        await until(lambda: first.candidate_id in working, "the leader's work started")

        await first.resign(hold_off=10.0)
        await until(lambda: second.candidate_id in working, "the new leader's work started")
        assert cancelled == [first.candidate_id]
        assert working == {first.candidate_id: 1, second.candidate_id: 1}
        for runner in runners:
            runner.cancel()
        await asyncio.gather(*runners, return_exceptions=True)


async def test_a_leader_steps_down_when_its_server_dies_and_elections_resume_after(
    tmp_path: Path,
) -> None:
    server = EmbeddedNats(store_dir=tmp_path / "js")
    await server.astart()
    try:
        async with candidates(server.url, 2) as (buses, elections):
            for election in elections:
                await election.start()
            await until(lambda: len(leaders(elections)) == 1, "a leader")

            async with Sampler(elections).running():
                await asyncio.to_thread(server.kill)
                died_at = time.monotonic()
                took = await until(lambda: not leaders(elections), "the leader steps down", TTL)
                assert took < TTL
                # nobody may claim leadership while the server is away
                await asyncio.sleep(TTL * 0.5)
                assert leaders(elections) == []

                await server.astart()  # same port, same store: the old lease expires by age
                await until(lambda: all(b.is_connected for b in buses), "reconnected")
                await until(lambda: len(leaders(elections)) == 1, "a leader again", TTL * 3)
            assert time.monotonic() - died_at < 6.0
            [leader] = leaders(elections)
            assert await elections[0].leader_id() == leader.candidate_id
    finally:
        await server.astop()


# ----------------------------------------------------------------------------- the bucket


async def test_the_lease_bucket_is_created_with_the_ttl_as_max_age(
    nats_server: EmbeddedNats,
) -> None:
    spec = fresh_bucket()
    async with await connect(nats_server.url, "bucket") as bus:
        election = LeaderElection(bus, "bucket-test", ttl=1.5, bucket=spec)
        async with election:
            status = await (await bus.js.key_value(spec.bucket)).status()
            assert status.ttl == pytest.approx(1.5)
            assert status.history == 1
        assert LEASES_KV.bucket == "thorn-leases" and LEASES_KV.storage == "file"


async def test_an_existing_bucket_dictates_the_lease_duration(nats_server: EmbeddedNats) -> None:
    spec = fresh_bucket()
    async with await connect(nats_server.url, "bucket") as bus:
        await bus.js.create_key_value(bucket=spec.bucket, history=1, ttl=2.0)
        async with LeaderElection(bus, "adopt", ttl=1.0, bucket=spec) as election:
            assert election.ttl == pytest.approx(2.0)
            await until(lambda: election.is_leader, "the only candidate leads")


async def test_a_bucket_whose_entries_never_expire_is_refused(nats_server: EmbeddedNats) -> None:
    spec = fresh_bucket()
    async with await connect(nats_server.url, "bucket") as bus:
        await bus.js.create_key_value(bucket=spec.bucket, history=1)
        with pytest.raises(LeaseConfigError, match="max_age"):
            await LeaderElection(bus, "never", bucket=spec).start()


async def test_an_election_name_must_be_a_valid_key(nats_server: EmbeddedNats) -> None:
    async with await connect(nats_server.url, "bucket") as bus:
        with pytest.raises(ValueError, match="valid KV key"):
            LeaderElection(bus, "path.comp")


async def test_work_starts_again_when_a_lost_lease_is_reclaimed(
    nats_server: EmbeddedNats,
) -> None:
    """A leader whose process stalls past its lease loses it (its work is cancelled) and, if
    nobody took over, reclaims it: the new term's work must run, not wait for yet another
    term (found when health stayed passive after a stall under load)."""
    async with candidates(nats_server.url, 1) as (_, elections):
        [election] = elections
        starts: list[int | None] = []

        async def work() -> None:
            starts.append(election.term)
            try:
                await asyncio.Event().wait()
            finally:  # winding down takes a while (health flushes its writes): meanwhile
                await asyncio.sleep(TTL)  # the candidate reclaims the lease

        await election.start()
        runner = asyncio.create_task(election.run_as_leader(work))
        try:
            await until(lambda: len(starts) == 1, "the first term's work started")
            time.sleep(TTL * 1.2)  # noqa: ASYNC251  (on purpose: the process stalls past its lease)
            await until(lambda: len(starts) == 2, "the reclaimed term's work started", TTL * 5)
            assert election.is_leader and starts[1] != starts[0]
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)


@pytest.mark.parametrize("landed", [True, False], ids=["answer-late", "request-lost"])
async def test_a_renewal_whose_answer_is_late_keeps_the_term(
    nats_server: EmbeddedNats, landed: bool
) -> None:
    """A busy replica's loop can stall past the operation timeout while a renewal is in
    flight. That used to cost the term at once (at k=32 health then lost it 32 times in a
    row). Now, while the lease lasts, the leader reads the key: its own record at a newer
    revision means the write landed; else it renews again. Either way no rival could have
    taken the key, and the term goes on."""
    async with candidates(nats_server.url, 2) as (_, elections):
        first, second = elections
        await first.start()
        await until(lambda: first.is_leader, "the first candidate leads")
        await second.start()
        term = first.term
        kv = first._kv  # the real bucket, its answers held back once
        assert kv is not None
        update, held = kv.update, []

        async def late(*args: Any, **kwargs: Any) -> int:
            if not held:
                held.append(True)
                if landed:
                    await update(*args, **kwargs)  # written, and the answer comes too late
                await asyncio.sleep(first.op_timeout * 3)
            return await update(*args, **kwargs)

        kv.update = late  # type: ignore[method-assign]
        lost: list[Transition] = []
        stream = first.transitions()
        watcher = asyncio.create_task(_collect(stream, lost))
        await until(lambda: bool(held), "a renewal held back")
        await asyncio.sleep(3 * TTL)
        watcher.cancel()
        stream.close()
        assert lost == [] and first.is_leader and first.term == term
        assert not second.is_leader


async def _collect(stream: Any, into: list[Transition]) -> None:
    async for transition in stream:
        into.append(transition)
