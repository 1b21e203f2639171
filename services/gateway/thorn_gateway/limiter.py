"""Who a request comes from, and how many failed authentications that client may make.

Pure: no I/O, time is an argument. The entry point (guard.py) applies it to every request
under /api/.

- The client's address is the TCP peer's. Only a peer in the trusted proxies (e.g. a load
  balancer in front of the entry point) may name another in X-Forwarded-For; then the
  client is the rightmost address of that chain which is not itself a trusted proxy. Anyone
  else's X-Forwarded-For is ignored, so a client cannot pick the address it is counted as.
- Failures are counted per client key: an IPv4 address, or an IPv6 address's /64 (one
  host usually holds a whole /64, and could otherwise step through it).
- A sliding window: a client whose last `limit` failures all fall within `window_s` is
  refused until the oldest of them leaves the window. Its successes do not reset the count
  (a guesser holding one good token could otherwise clear it), and another client's failures
  never count against it.
"""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPV6_CLIENT_PREFIX = 64
MAX_CLIENTS = 100_000  # clients with recent failures remembered; the least recent go first


def parse_networks(text: str, variable: str) -> list[IPNetwork]:
    """Addresses or networks, comma-separated ("10.0.0.5, 10.1.0.0/16"; "*": any). ValueError
    naming `variable` and the bad item."""
    networks: list[IPNetwork] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item == "*":
            networks += [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(
                f"{variable}: {item!r} is not an IP address or network (e.g. 10.0.0.5 or "
                "10.1.0.0/16)"
            ) from None
    return networks


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
             proxies: Sequence[IPNetwork]) -> bool:  # fmt: skip
    return address is not None and any(address in network for network in proxies)


def client_address(peer: str | None, forwarded_for: Iterable[str],
                   proxies: Sequence[IPNetwork]) -> str | None:  # fmt: skip
    """The client's address: `peer`, unless `peer` is a trusted proxy that forwarded the
    request, then the rightmost X-Forwarded-For address that is not a trusted proxy.
    `forwarded_for`: each X-Forwarded-For header's value, in order."""
    peer_address = _address(peer) if peer is not None else None
    if not _trusted(peer_address, proxies):
        return str(peer_address) if peer_address is not None else peer
    chain = [hop.strip() for value in forwarded_for for hop in value.split(",") if hop.strip()]
    client = str(peer_address)
    for hop in reversed(chain):
        address = _address(hop)
        if address is None:
            break  # not an address: the hop before it (already trusted) is what we know
        client = str(address)
        if not _trusted(address, proxies):
            break
    return client


def client_key(client: str | None) -> str:
    """What failures are counted by: the IPv4 address, or the IPv6 address's /64."""
    address = _address(client) if client is not None else None
    if address is None:
        return client or "unknown"
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, IPV6_CLIENT_PREFIX), strict=False))
    return str(address)


class FailureLimiter:
    """At most `limit` failed authentications per client key within any `window_s`."""

    def __init__(self, limit: int, window_s: float, max_clients: int = MAX_CLIENTS) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError("the limit must be at least 1 and the window positive")
        self.limit = limit
        self.window_s = window_s
        self.max_clients = max_clients
        # Per client, its most recent failures (at most `limit`), oldest first.
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, key: str, now: float) -> deque[float] | None:
        failures = self._failures.get(key)
        if failures is None:
            return None
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        if not failures:
            del self._failures[key]
            return None
        return failures

    def retry_after(self, key: str, now: float) -> int | None:
        """Whole seconds until `key` may try again, or None when it may now."""
        failures = self._recent(key, now)
        if failures is None or len(failures) < self.limit:
            return None
        return max(1, math.ceil(failures[0] + self.window_s - now))

    def failed(self, key: str, now: float) -> bool:
        """Count one failure of `key`; True when it has now reached the limit."""
        failures = self._recent(key, now)
        if failures is None:
            failures = self._failures[key] = deque(maxlen=self.limit)
        failures.append(now)
        self._failures.move_to_end(key)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)
        return len(failures) >= self.limit

    @property
    def clients(self) -> int:
        """Clients with failures remembered (some may have aged out of the window)."""
        return len(self._failures)
