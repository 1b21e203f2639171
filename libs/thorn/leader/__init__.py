"""Leader election among replicas of a service, on a JetStream KV lease.

::

    async with await Bus.connect(url, name="pathcomp") as bus:
        async with LeaderElection(bus, "pathcomp") as election:
            await election.run_as_leader(compute_paths_forever)   # cancelled when leadership goes

One key per election (`pathcomp`) in the lease bucket (`thorn-leases`), whose entries expire
`ttl` seconds (the bucket's max_age) after they were written. A candidate becomes leader by
`create` (succeeds only while the key is absent: never written, deleted, or expired), renews
with a compare-and-set `update(last=revision)` every ttl/3, and steps down on a renewal that
conflicts or loses the connection. A renewal whose answer is late (a busy replica's loop
stalled past the operation timeout) is not given up at once: while the lease lasts, the
holder reads the key (its own record at a newer revision: the write landed, and the lease
counts from when the first unanswered renewal was sent) or renews again. Followers try
`create` every ttl/3 and at once when a KV watch shows the key deleted (a leader that
resigns). A graceful `close()`/`resign()` deletes the key with `last=revision`, so another
candidate takes over within milliseconds; a crashed leader's key expires at most `ttl` after
the crash (plus the server's expiry lag, up to 0.25 s for file storage), and a follower's
next poll, ttl/3 later at most, takes over.

Safety (never two leaders acting at once):

* the server stamps a lease write no earlier than the moment the holder *sent* it, and removes
  it no earlier than max_age = ttl after that stamp (measured: 0-250 ms late, never early);
  while it exists every rival `create` fails, and the holder's own CAS renewals fail as soon
  as anybody else wrote the key;
* the holder counts its lease from the send time of its last successful write (not from the
  acknowledgement) and is leader only until send + 0.8 * ttl; `is_leader` evaluates that
  deadline itself, so a stalled event loop or a renewal stuck in flight cannot stretch it;
* so an old leader stops at least 0.2 * ttl before any rival can acquire. Assumed: clock rates
  of the candidates and the server agree within that margin over one ttl, the server's wall
  clock is not stepped forward, and acknowledged writes survive a server restart (the bucket
  is file-backed, with the bus's THORN_NATS_REPLICAS replicas: 3 in a cluster). Downstream
  writers can fence on `term` (the KV revision at which leadership was acquired, increasing
  across terms).

Transitions are logged (`leader_elected` / `leader_lost`), exported as the Prometheus gauge
`thorn_leader{election,candidate}` (1 while leader) and counter
`thorn_leader_transitions_total{election,candidate,transition}`, passed to an optional
`on_transition` callback and to every `transitions()` stream.

The package: `lease` (the timing rules, no I/O), `election` (`LeaderElection`, transitions),
`metrics`.
"""

from thorn.leader.election import LeaderElection, TransitionStream
from thorn.leader.lease import (
    DEFAULT_TTL,
    LEASES_KV,
    STEP_DOWN_AT,
    Lease,
    LeaseConfigError,
    Transition,
    make_candidate_id,
)
from thorn.leader.metrics import LEADER, TRANSITIONS

__all__ = [
    "DEFAULT_TTL",
    "LEADER",
    "LEASES_KV",
    "STEP_DOWN_AT",
    "TRANSITIONS",
    "LeaderElection",
    "Lease",
    "LeaseConfigError",
    "Transition",
    "TransitionStream",
    "make_candidate_id",
]
