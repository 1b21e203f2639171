"""`LeaderElection`: candidates racing for one lease key, renewing, stepping down, and
telling every `TransitionStream` and callback when leadership changes hands."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, Self

import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from thorn.bus import Bus
from thorn.bus.errors import _ERR_WRONG_LAST_SEQUENCE
from thorn.bus.streams import ensure, server_view
from thorn.events import KeyValueSpec
from thorn.leader.lease import (
    DEFAULT_TTL,
    LEASES_KV,
    Clock,
    Lease,
    LeaseConfigError,
    Transition,
    _Record,
    make_candidate_id,
)
from thorn.leader.metrics import LEADER, TRANSITIONS

log = structlog.get_logger("thorn.leader")

# What a KV operation raises when the server is slow, gone or refuses: never fatal here.
_TRANSIENT: tuple[type[BaseException], ...] = (nats.errors.Error, TimeoutError, OSError)


async def _stop_task(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait until it is done.

    The cancellation is repeated: on Python 3.11 `asyncio.wait_for` (which nats-py's requests
    use) can swallow a cancellation that arrives as its result does.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    if not task.cancelled() and task.exception() is not None:
        log.error("leader_task_failed", task=task.get_name(), error=repr(task.exception()))


class TransitionStream:
    """Async iterator of this candidate's `Transition`s from its creation on; ends at close."""

    def __init__(self, election: LeaderElection) -> None:
        self._election = election
        self._queue: asyncio.Queue[Transition | None] = asyncio.Queue()
        election._streams.add(self._queue)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Transition:
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)  # stay ended
            raise StopAsyncIteration
        return item

    def close(self) -> None:
        self._election._streams.discard(self._queue)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LeaderElection:
    """One candidate in the election `name`; see the module docstring for the protocol.

    `conn` is a `Bus` or a nats-py client (the election makes its own JetStream context, whose
    requests time out after `op_timeout`, default ttl/3). If the bucket already exists with
    another max_age, that max_age is the lease duration (`ttl` is corrected, with a warning).
    Candidate ids must be unique: the default is `make_candidate_id()`.
    """

    def __init__(
        self,
        conn: Bus | NatsClient,
        name: str,
        candidate_id: str | None = None,
        *,
        ttl: float = DEFAULT_TTL,
        bucket: KeyValueSpec = LEASES_KV,
        replicas: int | None = None,
        op_timeout: float | None = None,
        on_transition: Callable[[Transition], Awaitable[None]] | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if not name or not all(c.isalnum() or c in "-_=/" for c in name):
            raise ValueError(f"election name {name!r} is not a valid KV key")
        self._nc: NatsClient = conn.nc if isinstance(conn, Bus) else conn
        self.name = name
        self.candidate_id = candidate_id or make_candidate_id()
        self.bucket = bucket
        # The bus's replica count (THORN_NATS_REPLICAS), like every other bucket of THORN.
        if isinstance(conn, Bus):
            bus_replicas, self._connection = conn.replicas, conn.name
        else:
            bus_replicas, self._connection = 1, f"election-{name}"
        self._replicas = replicas if replicas is not None else bus_replicas
        self._clock = clock
        self._lease = Lease(ttl, clock)
        self._op_timeout_arg = op_timeout
        self._js: JetStreamContext = self._nc.jetstream(timeout=self.op_timeout)
        self._record = _Record(self.candidate_id, secrets.token_hex(8))
        self._on_transition = on_transition

        self._kv: KeyValue | None = None
        self._lock = asyncio.Lock()  # one KV write at a time: acquire, renew, release
        self._announced = False  # a became_leader was emitted and no lost_leadership since
        self._epoch = 0  # bumped by every step-down (and resign/close, which step down)
        self._written: int | None = None  # revision of our latest write that may be current
        # When the first renewal whose answer has not come was sent (None: none outstanding).
        self._late_since: float | None = None
        self._hold_off_until = 0.0
        self._nudge = asyncio.Event()
        self._leader_event = asyncio.Event()
        self._follower_event = asyncio.Event()
        self._follower_event.set()
        self._streams: set[asyncio.Queue[Transition | None]] = set()
        self._callbacks: asyncio.Queue[Transition] = asyncio.Queue()
        self._campaign_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._watch_reconnects = -1
        self._dispatch_task: asyncio.Task[None] | None = None
        self._closed = False
        LEADER.labels(name, self.candidate_id).set(0)

    # ------------------------------------------------------------------------------- state

    @property
    def ttl(self) -> float:
        """The lease duration in seconds (the bucket's max_age)."""
        return self._lease.ttl

    @property
    def op_timeout(self) -> float:
        return self._op_timeout_arg if self._op_timeout_arg is not None else self.ttl / 3

    @property
    def poll_interval(self) -> float:
        return self.ttl / 3

    @property
    def is_leader(self) -> bool:
        """True while this candidate holds a lease it may act on (checked against the clock)."""
        return self._announced and self._lease.valid

    @property
    def term(self) -> int | None:
        """The KV revision at which the current term began (a fencing token), None if follower."""
        return self._lease.term if self.is_leader else None

    async def wait_leader(self) -> None:
        """Wait until this candidate is leader. Bound it with `asyncio.timeout`."""
        await self._leader_event.wait()

    async def wait_follower(self) -> None:
        """Wait until this candidate is not leader (returns at once if it is not)."""
        await self._follower_event.wait()

    async def leader_id(self) -> str | None:
        """The current holder's candidate id as stored in the KV (None: nobody holds it).

        A lease that has just expired may still be reported for up to ~0.25 s (the server's
        expiry granularity). Raises nats-py errors / TimeoutError if NATS does not answer.
        """
        kv = await self._bucket()
        try:
            async with asyncio.timeout(self.op_timeout):
                entry = await kv.get(self.name)
        except nats.js.errors.KeyNotFoundError:
            return None
        record = _Record.decode(entry.value)
        return record.candidate if record is not None else None

    def transitions(self) -> TransitionStream:
        """A stream of this candidate's transitions from now on (ends when the election closes).

        ::

            async with election.transitions() as stream:
                async for t in stream: ...
        """
        return TransitionStream(self)

    # ---------------------------------------------------------------------------- lifecycle

    async def start(self) -> Self:
        """Make sure the lease bucket exists and start campaigning in the background.

        Raises `LeaseConfigError` for an unusable bucket, TimeoutError / nats-py errors if
        NATS does not answer.
        """
        if self._closed:
            raise RuntimeError("this election was closed; create a new LeaderElection")
        if self._campaign_task is None:
            await self._bucket()
            self._dispatch_task = asyncio.create_task(
                self._dispatch(), name=f"leader-dispatch-{self.name}"
            )
            self._campaign_task = asyncio.create_task(
                self._campaign(), name=f"leader-campaign-{self.name}"
            )
        return self

    async def run(self) -> None:
        """Campaign until cancelled.

        Cancellation is treated like a crash: leadership is dropped locally at once but the
        lease is *not* released (another candidate takes over when it expires, after `ttl`).
        For a prompt hand-over use `async with election:` or call `close()`.
        """
        await self.start()
        assert self._campaign_task is not None
        try:
            await asyncio.shield(self._campaign_task)
        finally:
            await self.close(resign=False)

    async def close(self, *, resign: bool = True) -> None:
        """Stop campaigning; step down; with `resign`, release the lease for a prompt takeover.

        Waits at most about `op_timeout` for a write in flight and `ttl` for `on_transition`.
        """
        if self._closed:
            return
        self._closed = True  # from here on the campaign starts no write
        self._step_down("resigned" if resign else "closed")
        async with self._lock:
            pass  # let a write in flight finish, so that its revision is known for the release
        for task in (self._campaign_task, self._watch_task):
            if task is not None:
                await _stop_task(task)
        if resign:
            async with self._lock:
                await self._release()
        for queue in list(self._streams):
            queue.put_nowait(None)
        if self._dispatch_task is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ttl):
                    await self._callbacks.join()
            await _stop_task(self._dispatch_task)
        LEADER.labels(self.name, self.candidate_id).set(0)

    async def resign(self, *, hold_off: float | None = None) -> bool:
        """Step down and release the lease so another candidate takes over at once.

        This candidate stays in the election but does not try to acquire for `hold_off`
        seconds (default: ttl). Returns whether it was leader.
        """
        was_leader = self.is_leader
        self._step_down("resigned")
        self._hold_off_until = self._clock() + (self.ttl if hold_off is None else hold_off)
        async with self._lock:
            await self._release()
        return was_leader

    async def run_as_leader(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `work()` whenever this candidate becomes leader; cancel it when leadership goes.

        Runs until cancelled (start the election first). If `work()` returns while still
        leader it is not restarted before the next term; if it raises, the error propagates.
        """
        while True:
            await self.wait_leader()
            term = self.term
            job = asyncio.create_task(work(), name=f"leader-work-{self.name}")
            lost = asyncio.create_task(self.wait_follower())
            returned = False
            try:
                await asyncio.wait({job, lost}, return_when=asyncio.FIRST_COMPLETED)
                returned = job.done() and not lost.done()
            finally:
                lost.cancel()
                if not job.done():
                    job.cancel()
                    log.info("leader_work_cancelled", election=self.name, term=term)
                with contextlib.suppress(asyncio.CancelledError):
                    await job  # a failure of work() propagates
            if returned:
                await self.wait_follower()  # done for this term: not again before the next
            # Otherwise the term ended; if this candidate already leads again (the lease was
            # reclaimed while the work was winding down), the next term's work starts at once.

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------------------ bucket

    async def _bucket(self) -> KeyValue:
        """The lease bucket, created with max_age = ttl if missing; adopts an existing max_age."""
        if self._kv is not None:
            return self._kv
        spec = self.bucket
        async with asyncio.timeout(self.op_timeout * 3):
            # Created, or brought to the spec and replica count (an existing max_age stays).
            await ensure(
                self._js, streams=(), buckets=(spec,), replicas=self._replicas,
                connection=self._connection, server=server_view(self._nc),
                ttls={spec.bucket: self.ttl},
            )  # fmt: skip
            kv = await self._js.key_value(spec.bucket)
            status = await kv.status()
        max_age = status.ttl
        if not max_age:
            raise LeaseConfigError(
                f"KV bucket {spec.bucket} has no max_age: its entries never expire, so it "
                "cannot hold leases; delete it or use another bucket"
            )
        if abs(max_age - self.ttl) > 1e-6:
            log.warning(
                "lease_ttl_from_bucket",
                election=self.name,
                bucket=spec.bucket,
                requested=self.ttl,
                bucket_max_age=max_age,
            )
            self._lease = Lease(max_age, self._clock)
            self._js = self._nc.jetstream(timeout=self.op_timeout)
            kv = await self._js.key_value(spec.bucket)
        self._kv = kv
        return kv

    # ---------------------------------------------------------------------------- campaign

    async def _campaign(self) -> None:
        while not self._closed:
            try:
                if self._lease.held:
                    await self._lead_once()
                else:
                    await self._follow_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("leader_election_error", election=self.name)
                self._step_down("error")
                await asyncio.sleep(self.poll_interval)

    async def _lead_once(self) -> None:
        if not self._lease.valid:
            self._step_down("lease_expired")  # no successful renewal within 0.8 * ttl
            return
        wait = min(self._lease.renew_at, self._lease.deadline) - self._clock()
        if wait > 0:
            await asyncio.sleep(wait)
            return
        await self._renew()

    async def _renew(self) -> None:
        async with self._lock:
            if not self._lease.valid:
                return  # resigned meanwhile, or lapsed: the next round steps down
            assert self._kv is not None and self._lease.revision is not None
            sent = self._clock()
            if self._late_since is None:
                self._late_since = sent
            try:
                async with asyncio.timeout(min(self.op_timeout, self._lease.remaining())):
                    revision = await self._kv.update(
                        self.name, self._record.encode(), last=self._lease.revision
                    )
            except nats.js.errors.KeyWrongLastSequenceError:
                self._written = None
                self._step_down("renewal_conflict")
                return
            except (TimeoutError, nats.errors.TimeoutError) as exc:
                # The answer is late, not necessarily the write (a busy replica's loop stalled
                # past op_timeout): while the lease lasts, see whether a renewal landed and
                # else renew again, rather than give up the term at once.
                if not await self._renewal_landed() and not self._lease.valid:
                    self._step_down("renewal_failed", error=f"{type(exc).__name__}: {exc}")
                return
            except _TRANSIENT as exc:
                self._step_down("renewal_failed", error=f"{type(exc).__name__}: {exc}")
                return
            self._take_renewal(revision, sent)

    def _take_renewal(self, revision: int, sent: float) -> None:
        """A renewal sent at `sent` was written at `revision`."""
        self._written, self._late_since = revision, None
        if not self._lease.held:
            return  # stepped down while the renewal was in flight; close/resign deletes
        if not self._lease.grant(revision, sent, new_term=False):
            self._step_down("lease_expired")

    async def _renewal_landed(self) -> bool:
        """After renewals whose answers were late: whether one was written (the key holds
        this very record at a newer revision); if so the lease counts from the first of
        them that was sent (it was written no earlier). False when unknown too."""
        assert self._kv is not None and self._lease.revision is not None
        try:
            async with asyncio.timeout(min(self.op_timeout, self._lease.remaining())):
                entry = await self._kv.get(self.name)
        except _TRANSIENT:  # KeyNotFoundError too: expired, or never ours
            return False
        if (
            entry.revision is None
            or entry.revision <= self._lease.revision
            or _Record.decode(entry.value) != self._record
        ):
            return False
        assert self._late_since is not None
        log.info("lease_renewal_answered_late", election=self.name, revision=entry.revision)
        self._take_renewal(entry.revision, self._late_since)
        return True

    async def _follow_once(self) -> None:
        if self._announced:
            self._step_down("lease_expired")
        now = self._clock()
        if now < self._hold_off_until:
            await self._wait_nudge(self._hold_off_until - now)
            return
        try:
            await self._bucket()
        except _TRANSIENT as exc:
            log.debug("lease_bucket_unavailable", election=self.name, error=repr(exc))
            await asyncio.sleep(self.poll_interval)
            return
        await self._ensure_watch()
        if not await self._try_acquire():
            await self._wait_nudge(self.poll_interval)

    async def _wait_nudge(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._nudge.wait()
        self._nudge.clear()

    async def _try_acquire(self) -> bool:
        """One attempt to become leader: create the key, or reclaim a lease we wrote."""
        async with self._lock:
            if self._closed:
                return False
            assert self._kv is not None
            value = self._record.encode()
            epoch = self._epoch
            sent = self._clock()
            reason = "acquired"
            try:
                async with asyncio.timeout(self.op_timeout):
                    revision = await self._kv.create(self.name, value)
            except nats.js.errors.KeyWrongLastSequenceError:
                reclaimed = await self._reclaim(value)
                if reclaimed is None:
                    return False
                revision, sent = reclaimed
                reason = "reclaimed"
            except _TRANSIENT as exc:
                log.debug("lease_acquire_failed", election=self.name, error=repr(exc))
                if isinstance(exc, nats.js.errors.NoStreamResponseError):
                    self._kv = None  # the bucket is gone: re-create it next round
                return False
            self._written = revision
            if epoch != self._epoch:
                return False  # resign() or close() began meanwhile: they release this write
            if not self._lease.grant(revision, sent, new_term=True):
                self._nudge.set()  # acknowledged too late to act on: reclaim it next round
                return False
            self._became_leader(reason)
            return True

    async def _reclaim(self, value: bytes) -> tuple[int, float] | None:
        """The key is held: if by this very object (a write whose answer was lost), renew it."""
        assert self._kv is not None
        try:
            async with asyncio.timeout(self.op_timeout):
                entry = await self._kv.get(self.name)
            record = _Record.decode(entry.value)
            if record is None or record != self._record or entry.revision is None:
                return None
            sent = self._clock()
            async with asyncio.timeout(self.op_timeout):
                revision: int = await self._kv.update(self.name, value, last=entry.revision)
        except nats.js.errors.KeyNotFoundError:
            self._nudge.set()  # expired or deleted in between: try again at once
            return None
        except _TRANSIENT as exc:
            log.debug("lease_reclaim_failed", election=self.name, error=repr(exc))
            return None
        return revision, sent

    async def _release(self) -> None:
        """Delete our lease key if it is still at the revision we wrote (call under the lock)."""
        revision, self._written = self._written, None
        if revision is None or self._kv is None:
            return
        try:
            async with asyncio.timeout(self.op_timeout):
                await self._kv.delete(self.name, last=revision)
            log.info("leader_lease_released", election=self.name, candidate=self.candidate_id)
        except nats.js.errors.APIError as exc:
            if exc.err_code not in _ERR_WRONG_LAST_SEQUENCE:
                log.warning("leader_release_failed", election=self.name, error=repr(exc))
            # else: the lease had expired or moved on already
        except _TRANSIENT as exc:
            log.warning(
                "leader_release_failed",
                election=self.name,
                error=f"{type(exc).__name__}: {exc}",
                note="the lease expires by itself",
            )

    # ------------------------------------------------------------------------------- watch

    async def _ensure_watch(self) -> None:
        """Keep a KV watch on the key; re-create it after a reconnect (its consumer is gone)."""
        reconnects = int(self._nc.stats["reconnects"])
        task = self._watch_task
        if task is not None and not task.done() and reconnects == self._watch_reconnects:
            return
        if task is not None:
            await _stop_task(task)
        self._watch_reconnects = reconnects
        self._watch_task = asyncio.create_task(self._watch(), name=f"leader-watch-{self.name}")

    async def _watch(self) -> None:
        assert self._kv is not None
        try:
            async with asyncio.timeout(self.op_timeout):
                watcher = await self._kv.watch(self.name)
        except _TRANSIENT as exc:
            log.debug("lease_watch_failed", election=self.name, error=repr(exc))
            return
        try:
            while True:
                entry = await watcher.__anext__()  # type: ignore[no-untyped-call]
                if entry is not None and entry.operation in (KV_DEL, KV_PURGE):
                    self._nudge.set()  # released: try to acquire now
        except StopAsyncIteration:
            pass
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.op_timeout):
                    await watcher.stop()  # type: ignore[no-untyped-call]

    # -------------------------------------------------------------------------- transitions

    def _became_leader(self, reason: str) -> None:
        self._announced = True
        self._follower_event.clear()
        self._leader_event.set()
        term = self._lease.term
        assert term is not None
        now = self._clock()
        LEADER.labels(self.name, self.candidate_id).set(1)
        TRANSITIONS.labels(self.name, self.candidate_id, "became_leader").inc()
        log.info(
            "leader_elected",
            election=self.name,
            candidate=self.candidate_id,
            term=term,
            reason=reason,
            ttl=self.ttl,
        )
        self._emit(Transition("became_leader", self.name, self.candidate_id, term, reason, now))

    def _step_down(self, reason: str, **details: str) -> None:
        self._epoch += 1  # a write in flight now must not make this candidate leader
        self._late_since = None
        term = self._lease.drop()
        if not self._announced:
            return
        self._announced = False
        self._leader_event.clear()
        self._follower_event.set()
        LEADER.labels(self.name, self.candidate_id).set(0)
        TRANSITIONS.labels(self.name, self.candidate_id, "lost_leadership").inc()
        level = log.info if reason in ("resigned", "closed") else log.warning
        level(
            "leader_lost",
            election=self.name,
            candidate=self.candidate_id,
            term=term,
            reason=reason,
            **details,
        )
        self._emit(
            Transition(
                "lost_leadership", self.name, self.candidate_id, term or 0, reason, self._clock()
            )
        )

    def _emit(self, transition: Transition) -> None:
        for queue in self._streams:
            queue.put_nowait(transition)
        if self._on_transition is not None:
            self._callbacks.put_nowait(transition)

    async def _dispatch(self) -> None:
        """Call `on_transition` in order, outside the campaign loop (a slow callback must not
        delay renewals)."""
        while True:
            transition = await self._callbacks.get()
            try:
                if self._on_transition is not None:
                    await self._on_transition(transition)
            except Exception:
                log.exception("leader_transition_callback_failed", election=self.name)
            finally:
                self._callbacks.task_done()
