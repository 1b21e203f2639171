"""BFD sessions a node's agent runs, derived from what it was told to program.

- *links* (RFC 5881 single-hop): one session per fabric port that carries (or once carried)
  underlay routes or a route's backup, to the neighbour's address on that link (`Route.via`).
  A silent failure of the link (carrier up, packets lost) shows here; health maps it to the
  link by (node, port). The session stays when traffic moves off the link, so its recovery
  is seen too. On a switch, a link session going from Up to Down also withdraws the primaries
  through that port at once (`withdraw`: repair.LocalRepair), leaving their backups to carry
  the traffic; Up again for the up hold (`restore_after_hold`), or the session removed
  (`restore`), restores them.
- *peers* (RFC 5883 multihop): on a host, one session per peer host and colour, from this
  host's TEP of that colour to the peer's. A TEP's prefix is routed along its colour's tree,
  so each session watches exactly the path its colour's traffic takes. When the session of
  the colour a peer is using goes down, and the other colour's is up, the agent flips that
  peer to the other colour at once (`NodeAgent.flip`), without waiting for the controller.

Every session change is reported to health (`Reporter.bfd`). A session the agent removes
says AdminDown first (RFC 5880 §6.8.16), and a peer's AdminDown is reported as
`admin_down`, not `down`: health withdraws the source instead of failing the link.

`wanted_sessions` is the pure part; `BfdSessions` is the shell that keeps one node's sessions
in a shared `BfdManager` (one thread serves every node of the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import structlog
from prometheus_client import Counter

from thorn.events import BfdReport
from thorn.model import Colour
from thorn_programmer.bfd import BfdAuth, BfdEvent, Diag, SessionConfig, SessionStatus, State
from thorn_programmer.bfd.policy import AuthPolicy
from thorn_programmer.intent import HostIntent, Intent

log = structlog.get_logger("thorn.programmer.bfd")

BFD_FLIPS = Counter(
    "thorn_programmer_bfd_failovers_total",
    "Local failovers started by a peer's BFD session going down",
    ["node"],
)

Mode = Literal["off", "links", "peers", "all"]
# Peer TEP sessions cross several routers (leaf, spine, leaf: 3; a 3-tier fat tree: 5; a
# stretched backup path a few more): accept up to 8, where FRR's multihop default takes 1.
PEER_MIN_TTL = 255 - 8
_OTHER: dict[Colour, Colour] = {Colour.red: Colour.blue, Colour.blue: Colour.red}
_STATE_NAMES: dict[State, Literal["admin_down", "down", "init", "up"]] = {
    State.ADMIN_DOWN: "admin_down", State.DOWN: "down", State.INIT: "init", State.UP: "up",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class WantedSession:
    peer: str  # the far end's address
    local: str | None  # our address (multihop: our TEP); None: the kernel's choice
    ifname: str | None  # single-hop: the port it runs on
    multihop: bool
    peer_host: str | None = None  # multihop: the host at the far end
    colour: Colour | None = None  # multihop: the colour whose path it watches


def peers_to_watch(node: str, members: Mapping[int, set[str]], limit: int | None) -> list[str]:
    """The peer hosts a host runs multihop sessions toward: all of them, or about `limit`
    of them per VNI (`members`: each of its VNIs' hosts). A full mesh does not scale (N
    hosts: N x (N-1) x 2 sessions; 1,024 hosts: ~2,000 per host), and the fabric's own link
    sessions (switches) plus pathcomp's urgent flips cover every link anyway; the peer
    sessions add an end-to-end check of a few paths.

    The choice must be symmetric: a multihop session comes Up only if the peer runs the
    same session back (a packet for a session the other end does not run is dropped as
    unknown). A per-host pick (a hash of (host, peer)) was not: on `make run`'s lab not one
    of 64 peer sessions ever came Up. So each VNI's hosts stand on a ring in a stable
    hash order that every member computes alike, and a host watches the `limit` hosts
    nearest it on the ring (half each way): B is A's neighbour exactly when A is B's. Hash
    order spreads a host's neighbours over the fabric's racks."""
    everyone = set().union(*members.values()) - {node} if members else set()
    if limit is None:
        return sorted(everyone)
    reach = (limit + 1) // 2
    out: set[str] = set()
    for hosts in members.values():
        ring = sorted(hosts | {node}, key=_ring_key)
        n, at = len(ring), ring.index(node)
        for step in range(1, min(reach, n // 2) + 1):
            out.update((ring[(at + step) % n], ring[(at - step) % n]))
    out.discard(node)
    return sorted(out)


def _ring_key(host: str) -> tuple[bytes, str]:
    return hashlib.blake2b(host.encode(), digest_size=8).digest(), host


def wanted_sessions(
    intent: Intent | None, mode: Mode, peer_limit: int | None = None
) -> frozenset[WantedSession]:
    if intent is None or mode == "off":
        return frozenset()
    wanted: set[WantedSession] = set()
    if mode in ("links", "all"):
        # A backup's link is watched too: a backup that fails silently would only be found
        # when the primary fails.
        hops = [(r.dev, r.via) for r in intent.routes]
        hops += [(r.backup.dev, r.backup.via) for r in intent.routes if r.backup is not None]
        wanted |= {
            WantedSession(peer=via, local=None, ifname=dev, multihop=False)
            for dev, via in hops
            if via is not None
        }
    if mode in ("peers", "all") and isinstance(intent, HostIntent):
        members: dict[int, set[str]] = {w.vni: set() for w in intent.local}
        for p in intent.peers:
            members.setdefault(p.vni, set()).add(p.host)
        watched = set(peers_to_watch(intent.node, members, peer_limit))
        for peer in intent.peers:
            if peer.host not in watched:
                continue
            for colour, tep in peer.teps.items():
                ours = intent.teps.get(colour)
                if ours is not None and peer.host != intent.node:
                    wanted.add(WantedSession(tep, ours, None, True, peer.host, colour))
    return frozenset(wanted)


class SessionRunner(Protocol):
    """What `BfdSessions` needs of a `BfdManager` (thread-safe, blocking calls)."""

    def add(
        self, config: SessionConfig, *, ifname: str | None = None, netns: str | None = None
    ) -> None: ...

    def remove(self, local_discriminator: int, *, admin_down: bool = True) -> None: ...

    def arm(self, local_discriminator: int, messages: Iterable[bytes]) -> None: ...

    def set_auth(self, local_discriminator: int, auth: BfdAuth | None) -> None: ...

    def sessions(self) -> list[SessionStatus]: ...


# After Up, the Poll sequences that leave BFD's slow start (RFC 5880 6.8.3: at least 1 s
# between packets while not Up) are over by then: the timers are restated once settled.
TIMERS_SETTLE_S = 3.0


def _ms(us: int) -> float | None:
    return us / 1000 if us else None


class Discriminators:
    """Local discriminators unique within one manager (RFC 5880 §6.8.1: nonzero)."""

    def __init__(self) -> None:
        self._next: Iterator[int] = itertools.count(1)

    def take(self) -> int:
        return next(self._next)


# What the agent offers the sessions: the colour a peer uses now, and the fast failover.
ColourOf = Callable[[str], Colour | None]
Flip = Callable[[str, Colour, str], None]
# A switch's local repair: (port, reason); see repair.LocalRepair.
PortRepair = Callable[[str, str], None]
# (port, reason, routes the BFD runtime deleted, its ms from detection to the kernel's answer,
# its errors): an armed withdraw already done
RuntimeRepair = Callable[[str, str, int, float, tuple[str, ...]], None]
# A host's path session toward (peer host, colour) came Up (True) or went Down (False).
PathChange = Callable[[str, Colour, bool], None]


def _nothing(_port: str, _reason: str) -> None:
    pass


def _no_path(_peer: str, _colour: Colour, _up: bool) -> None:
    pass


def _no_record(
    _port: str, _reason: str, _routes: int, _ms: float, _errors: tuple[str, ...]
) -> None:
    pass


class BfdSessions:
    """One node's sessions in a shared manager: `update` follows each applied intent;
    `event` (on the agent's loop) reports a change and may start a local failover (a host's
    `flip`) or a local repair (a switch's `withdraw` and `restore`; hosts' are no-ops)."""

    def __init__(
        self,
        node: str,
        netns: str | None,
        manager: SessionRunner,
        discriminators: Discriminators,
        *,
        mode: Mode,
        interval_ms: int,
        peer_limit: int | None = None,
        multiplier: int,
        report: Callable[[BfdReport], None],
        colour_of: ColourOf,
        flip: Flip,
        withdraw: PortRepair = _nothing,
        restore: PortRepair = _nothing,
        restore_after_hold: PortRepair = _nothing,
        path: PathChange = _no_path,
        withdrawn: RuntimeRepair = _no_record,
        auth_policy: AuthPolicy | None = None,
    ) -> None:
        self.node = node
        self.netns = netns
        self.manager = manager
        self.discriminators = discriminators
        self.mode = mode
        self.peer_limit = peer_limit
        self.interval_us = interval_ms * 1000
        self.multiplier = multiplier
        self.report = report
        self.colour_of = colour_of
        self.flip = flip
        self.withdraw = withdraw
        self.restore = restore
        self.restore_after_hold = restore_after_hold
        self.path = path
        self.withdrawn = withdrawn
        # Which sessions authenticate, with which keys (THORN_BFD_AUTH_FILE), and what each
        # running session was given, by discriminator.
        self.auth_policy = auth_policy
        self._auth: dict[int, BfdAuth | None] = {}
        # Per port, the route deletes its link session fires itself on going Down (`arm`),
        # and what each session was last armed with.
        self._armed: dict[str, tuple[bytes, ...]] = {}
        self._pushed: dict[int, tuple[bytes, ...]] = {}
        self.sessions: dict[WantedSession, int] = {}  # -> local discriminator
        self.states: dict[int, State] = {}
        self._by_disc: dict[int, WantedSession] = {}
        self._lock = asyncio.Lock()
        # Sessions that came Up, by discriminator: (when to read their timers, key, the Up).
        self._settling: dict[int, tuple[float, WantedSession, BfdEvent]] = {}
        self._restater: asyncio.Task[None] | None = None

    def owns(self, discriminator: int) -> bool:
        return discriminator in self._by_disc

    async def update(self, intent: Intent | None) -> None:
        """Start the sessions the intent calls for and stop the others (AdminDown first).
        With the BFD child gone this does nothing: the watchdog starts a new child and
        calls `restart`."""
        async with self._lock:
            await self._update(intent)

    async def restart(self, intent: Intent | None) -> None:
        """The BFD child was replaced: every session went with the old one. Start again
        from nothing (under the lock: no update runs half against the old child)."""
        async with self._lock:
            kept = frozenset(self.sessions)  # kept links too (see _kept_links)
            self.sessions.clear()
            self.states.clear()
            self._by_disc.clear()
            self._pushed.clear()
            self._auth.clear()
            await self._update(intent, also=kept)

    async def _update(
        self, intent: Intent | None, also: frozenset[WantedSession] = frozenset()
    ) -> None:
        try:
            await self._apply_wanted(intent, also)
            await self._push_armed()
        except RuntimeError as exc:  # the BFD child is gone (not this agent's fault)
            log.warning("bfd_unavailable", node=self.node, error=str(exc))

    async def arm(self, batches: Mapping[str, tuple[bytes, ...]]) -> None:
        """A switch's link sessions carry, per port, the route deletes that leave its
        protected primaries to their backups (`SwitchRouteDriver.armed`): the BFD runtime
        sends them itself on Up -> Down, and `withdrawn` then records what it did."""
        async with self._lock:
            self._armed = dict(batches)
            try:
                await self._push_armed()
            except RuntimeError as exc:
                log.warning("bfd_unavailable", node=self.node, error=str(exc))

    async def _push_armed(self) -> None:
        for key, disc in self.sessions.items():
            if key.multihop or key.ifname is None:
                continue
            want = self._armed.get(key.ifname, ())
            if self._pushed.get(disc, ()) != want:
                with contextlib.suppress(KeyError):  # removed meanwhile
                    await asyncio.to_thread(self.manager.arm, disc, want)
                self._pushed[disc] = want

    async def _apply_wanted(
        self, intent: Intent | None, also: frozenset[WantedSession] = frozenset()
    ) -> None:
        """The lock is held by the caller; `also`: sessions to run whatever the intent says
        (after a restart of the BFD child: what ran before it)."""
        wanted = wanted_sessions(intent, self.mode, self.peer_limit)
        if intent is not None:
            wanted |= self._kept_links(wanted) | also
        for key in set(self.sessions) - wanted:
            disc = self.sessions.pop(key)
            self._pushed.pop(disc, None)
            with contextlib.suppress(KeyError):
                await asyncio.to_thread(self.manager.remove, disc)
            self._by_disc.pop(disc, None)
            self.states.pop(disc, None)
            self._auth.pop(disc, None)
            if not key.multihop and key.ifname is not None:
                # Nothing watches that neighbour any more: no reason to keep its port's
                # primaries withdrawn (a no-op if they were not).
                self.restore(key.ifname, f"bfd session to {key.peer} removed")
        for key in sorted(wanted - set(self.sessions), key=repr):
            disc = self.discriminators.take()
            auth = self._auth_for(key)
            config = SessionConfig(
                local_discriminator=disc, peer=key.peer, local_address=key.local,
                desired_min_tx_us=self.interval_us, required_min_rx_us=self.interval_us,
                detect_mult=self.multiplier, multihop=key.multihop,
                min_ttl=PEER_MIN_TTL if key.multihop else None, auth=auth,
            )  # fmt: skip
            # Known before it starts: its first events may arrive before `add` returns.
            self._by_disc[disc], self.states[disc] = key, State.DOWN
            try:
                await asyncio.to_thread(
                    self.manager.add, config, ifname=key.ifname, netns=self.netns
                )
            except (OSError, ValueError) as exc:
                # e.g. the port is gone already: the next intent tries again
                del self._by_disc[disc], self.states[disc]
                log.warning("bfd_session_not_started", node=self.node, peer=key.peer,
                            port=key.ifname, error=str(exc))  # fmt: skip
                continue
            self.sessions[key] = disc
            self._auth[disc] = auth

    def _auth_for(self, key: WantedSession) -> BfdAuth | None:
        if self.auth_policy is None:
            return None
        return self.auth_policy.for_session(self.node, key.peer, key.ifname, key.multihop)

    async def set_auth_policy(self, policy: AuthPolicy | None) -> int:
        """New rules or keys (the file changed): running sessions take them in place, so a
        key rotation restarts nothing. Returns how many sessions changed."""
        async with self._lock:
            self.auth_policy = policy
            changed = 0
            for key, disc in list(self.sessions.items()):
                auth = self._auth_for(key)
                if self._auth.get(disc) == auth:
                    continue
                try:
                    await asyncio.to_thread(self.manager.set_auth, disc, auth)
                except KeyError:  # removed meanwhile
                    continue
                except RuntimeError as exc:  # the BFD child is gone: its restart re-adds
                    log.warning("bfd_unavailable", node=self.node, error=str(exc))
                    continue
                self._auth[disc] = auth
                changed += 1
            return changed

    def _kept_links(self, wanted: frozenset[WantedSession]) -> frozenset[WantedSession]:
        """Single-hop sessions outlive the routes that started them: a link watched only
        while it carries routes would vanish from BFD when pathcomp moves traffic off it
        (a BFD failure, a drain), and its Down would then never be cleared. A session goes
        when its port is given to another neighbour, or the node leaves the fabric."""
        repointed = {k.ifname for k in wanted if not k.multihop}
        return frozenset(k for k in self.sessions if not k.multihop and k.ifname not in repointed)

    async def close(self) -> None:
        if self._restater is not None:
            self._restater.cancel()
        await self.update(None)

    def _restate_timers_later(self, key: WantedSession, event: BfdEvent) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not on the agent's loop (a caller outside the agent)
        self._settling[event.local_discriminator] = (loop.time() + TIMERS_SETTLE_S, key, event)
        if self._restater is None or self._restater.done():
            self._restater = loop.create_task(
                self._restate_timers(), name=f"bfd-timers-{self.node}"
            )

    async def _restate_timers(self) -> None:
        """Report the timers sessions settled on after their Up (the same Up, restated), so
        health shows the negotiated ones, not slow start's. One read of the runtime's
        sessions serves every Up that is due (a lab coming up: dozens at once)."""
        loop = asyncio.get_running_loop()
        while self._settling:
            await asyncio.sleep(
                max(0.0, min(d for d, _, _ in self._settling.values()) - loop.time())
            )
            now_t = loop.time()
            due = {disc: (key, up) for disc, (d, key, up) in self._settling.items() if d <= now_t}
            for disc in due:
                del self._settling[disc]
            try:
                found = {
                    s.local_discriminator: s for s in await asyncio.to_thread(self.manager.sessions)
                }
            except Exception as exc:  # the BFD child restarting: the next Up restates them
                log.warning("bfd_timers_unread", node=self.node, error=str(exc))
                continue
            for disc, (key, up) in due.items():
                now = found.get(disc)
                if (self.states.get(disc) is not State.UP or self._by_disc.get(disc) != key
                        or now is None or now.state is not State.UP):  # fmt: skip
                    continue  # it went down again (that change was reported) or went away
                if (now.tx_interval_us, now.detection_time_us) == (
                        up.tx_interval_us, up.detection_time_us):  # fmt: skip
                    continue
                self.report(
                    BfdReport(
                        local=key.local or key.ifname or "any", peer=key.peer, port=key.ifname,
                        multihop=key.multihop, state="up", diag=int(now.diag),
                        detected_at=up.wall, tx_interval_ms=_ms(now.tx_interval_us),
                        detect_time_ms=_ms(now.detection_time_us),
                    )
                )  # fmt: skip

    def event(self, event: BfdEvent) -> None:
        key = self._by_disc.get(event.local_discriminator)
        if key is None:
            return
        self.states[event.local_discriminator] = event.new
        withdrawn = event.new is State.ADMIN_DOWN or (
            event.new is State.DOWN and event.remote_state is State.ADMIN_DOWN
        )
        self.report(
            BfdReport(
                local=key.local or key.ifname or "any",
                peer=key.peer,
                port=key.ifname,
                multihop=key.multihop,
                state="admin_down" if withdrawn else _STATE_NAMES[event.new],
                diag=int(event.diag),
                detected_at=event.wall,
                tx_interval_ms=_ms(event.tx_interval_us),
                detect_time_ms=_ms(event.detection_time_us),
            )
        )
        if event.new is State.UP:
            self._restate_timers_later(key, event)
        failed = event.old is State.UP and event.new is State.DOWN and not withdrawn
        # A Down the runtime found long after it was due: this process stalled (no packet
        # sent or read meanwhile), which the repair's log must say.
        late = f", runtime {event.timer_late_ms:.0f} ms late" if event.timer_late_ms >= 5 else ""
        if event.excused_ms >= 1:  # its own stalls forgiven: the Down came this much later
            late += f", {event.excused_ms:.0f} ms of stalls excused"
        if key.multihop and key.peer_host is not None and key.colour is not None:
            if failed:
                self._fail_over(key, event.diag, late)
            if event.new is State.UP or failed:  # a revert waits for the path to work
                self.path(key.peer_host, key.colour, event.new is State.UP)
        elif not key.multihop and key.ifname is not None:
            if failed:
                diag = event.diag.name.lower()
                reason = f"bfd to {key.peer} on {key.ifname} down ({diag}{late})"
                if event.withdrawn or event.withdraw_errors:
                    self.withdrawn(key.ifname, reason, event.withdrawn,
                                   event.withdrawn_ms or 0.0, event.withdraw_errors)  # fmt: skip
                else:
                    self.withdraw(key.ifname, reason)
            elif event.new is State.UP:
                self.restore_after_hold(key.ifname, f"bfd to {key.peer} on {key.ifname} up")

    def path_state(self, peer_host: str, colour: Colour) -> State | None:
        """The state of this host's session toward `peer_host` on `colour` (None: none)."""
        for key, disc in self.sessions.items():
            if key.multihop and key.peer_host == peer_host and key.colour == colour:
                return self.states.get(disc)
        return None

    def _fail_over(self, key: WantedSession, diag: Diag, late: str = "") -> None:
        assert key.peer_host is not None and key.colour is not None
        if self.colour_of(key.peer_host) != key.colour:
            return  # the peer does not use this colour now: nothing to move
        other = _OTHER[key.colour]
        other_key = next(
            (k for k in self.sessions if k.peer_host == key.peer_host and k.colour == other),
            None,
        )
        if other_key is not None and self.states.get(self.sessions[other_key]) is not State.UP:
            log.warning("bfd_no_failover_both_colours_down", node=self.node, peer=key.peer_host,
                        late=late.removeprefix(", "))  # fmt: skip
            return
        BFD_FLIPS.labels(self.node).inc()
        reason = f"bfd {key.colour} to {key.peer_host} down ({diag.name.lower()}{late})"
        self.flip(key.peer_host, other, reason)
