"""Netlink encoding of TC flower filters and shared tunnel_key/mirred/gact actions.

pyroute2 0.9.7 has neither cls_flower nor act_tunnel_key; this package adds them as pyroute2
nla classes (`flower.options`, `tunnel_key.options`, `messages.tcmsg/tcamsg`) and puts a small
typed API on top. Requests are plain `bytes`, built ahead of time and sent by `TcSocket`.

Models (frozen dataclasses, validated; a decoded dump compares equal to what was asked):

- `FlowerMatch`: eth_type, eth_dst/eth_src (+ masks), ip_proto, src_ip/dst_ip (IPv4/IPv6
  prefixes), src_port/dst_port (TCP or UDP by ip_proto; 4791 = RoCEv2), enc_key_id,
  enc_src_ip/enc_dst_ip, enc_dst_port. eth_type is inferred from the inner IPs.
- Actions: `TunnelKeySet(src, dst, key_id, dst_port, nocsum, tos, ttl, index)`,
  `TunnelKeyUnset()`, `Mirred.redirect(ifindex)` / `Mirred.mirror(ifindex, ingress=...)`,
  `Gact(Control.SHOT)`, and `ActionRef(kind, index)` to bind to an existing shared action.
  An action with `index=N` inside a filter also binds if N exists (the kernel then ignores
  its parameters): create shared actions first with `action_add`, then bind with `ActionRef`.
- `FlowerFilter(ifindex, priority, match, actions, handle, parent=TC_H_INGRESS, chain,
  classid, skip_sw, skip_hw)`.
- Read back: `FilterState(spec, actions, in_hw, not_in_hw, in_hw_count, unmodelled)` and
  `ActionState(action, index, refcnt, bindcnt, counters, skip_hw, skip_sw, in_hw_count)`;
  `Counters(bytes, packets, drops, overlimits, hw_bytes, hw_packets)`.

Building requests (each returns one netlink message, sequence number 0):
`filter_add`, `filter_replace`, `filter_delete`, `filter_dump`, `action_add`,
`action_replace`, `action_delete`, `action_get`, `action_dump`. The default encoder packs
bytes straight from the nla declarations (~25 us a filter); `engine="pyroute2"` runs
pyroute2's own encoder (~0.3 ms), byte-identical, kept as the reference.

Decoding: `decode_filter(msg_bytes) -> FilterState`, `decode_filters(dump_parts)` (skips
classifier heads and other kinds), `decode_action(msg_bytes) -> tuple[ActionState, ...]`, for
dump entries, replies and requests alike.

Sending: `TcSocket(netns=None)` (a raw NETLINK_ROUTE socket with extended acks):
`request(msg)` waits for the ack, `dump(msg)`, `filters(ifindex)`, `actions(kind)`,
`action(kind, index)`, and `send_batch(msgs)` for bulk installs (many messages per sendmsg,
acks collected afterwards, every refusal reported with its index).

Errors: the kernel's refusals raise `TcError` (an OSError) with `errno` and `extack` (the
kernel's own words), subclassed as `TcInvalidError` (EINVAL), `TcNotFoundError` (ENOENT,
also a missing cls_flower/act_* module), `TcExistsError` (EEXIST), `TcNotSupportedError`
(EOPNOTSUPP); a batch raises `TcBatchError(errors=[...])`. `from_netlink_error` maps
pyroute2's `NetlinkError` (open `IPRoute(ext_ack=True)` to get the extack text) the same way.
`TcDecodeError` means a message is not what the models describe.

The failover flip, prebuilt::

    red = action_replace(TunnelKeySet(src=LOCAL, dst=RED_TEP, key_id=100, dst_port=4789,
                                      index=7), skip_hw=True)
    blue = action_replace(replace(..., dst=BLUE_TEP), skip_hw=True)
    sock.request(blue)  # every filter bound to tunnel_key index 7 now encaps to blue

A shared action's skip_hw/skip_sw must equal those of the filters bound to it, or the kernel
refuses the filter ("Mismatch between action and filter offload flags").
"""

from thorn_programmer.netlink.constants import (
    ETH_P_ALL,
    ETH_P_IP,
    ETH_P_IPV6,
    IPPROTO_TCP,
    IPPROTO_UDP,
    ROCEV2_PORT,
    TC_H_EGRESS,
    TC_H_INGRESS,
    VXLAN_PORT,
    Control,
    MirredAction,
)
from thorn_programmer.netlink.decode import decode_action, decode_filter, decode_filters
from thorn_programmer.netlink.errors import (
    TcBatchError,
    TcDecodeError,
    TcError,
    TcExistsError,
    TcInvalidError,
    TcNotFoundError,
    TcNotSupportedError,
    from_netlink_error,
)
from thorn_programmer.netlink.messages import (
    action_add,
    action_delete,
    action_dump,
    action_get,
    action_replace,
    filter_add,
    filter_delete,
    filter_dump,
    filter_replace,
)
from thorn_programmer.netlink.models import (
    Action,
    ActionRef,
    ActionState,
    AnyAction,
    Counters,
    FilterState,
    FlowerFilter,
    FlowerMatch,
    Gact,
    Mirred,
    OtherAction,
    TunnelKeySet,
    TunnelKeyUnset,
)
from thorn_programmer.netlink.transport import TcSocket

__all__ = [
    "ETH_P_ALL",
    "ETH_P_IP",
    "ETH_P_IPV6",
    "IPPROTO_TCP",
    "IPPROTO_UDP",
    "ROCEV2_PORT",
    "TC_H_EGRESS",
    "TC_H_INGRESS",
    "VXLAN_PORT",
    "Action",
    "ActionRef",
    "ActionState",
    "AnyAction",
    "Control",
    "Counters",
    "FilterState",
    "FlowerFilter",
    "FlowerMatch",
    "Gact",
    "Mirred",
    "MirredAction",
    "OtherAction",
    "TcBatchError",
    "TcDecodeError",
    "TcError",
    "TcExistsError",
    "TcInvalidError",
    "TcNotFoundError",
    "TcNotSupportedError",
    "TcSocket",
    "TunnelKeySet",
    "TunnelKeyUnset",
    "action_add",
    "action_delete",
    "action_dump",
    "action_get",
    "action_replace",
    "decode_action",
    "decode_filter",
    "decode_filters",
    "filter_add",
    "filter_delete",
    "filter_dump",
    "filter_replace",
    "from_netlink_error",
]
