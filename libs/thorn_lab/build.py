"""Bring a lab up (or repair it) from a plan, and take it down. Needs root.

`up` is idempotent: every step first looks at what exists and only makes what is missing
or wrong (a namespace, a veth pair, a MAC, an address, an admin state), so running it on a
healthy lab changes nothing, and on a damaged one repairs it. It never undoes a recorded
fault: ports a fault holds admin down stay down (`thorn_lab.faults.restore` does that).

`down` removes every namespace whose name starts with ``<prefix>-`` (whether or not the
description lists it), the description and the faults. Veth ends live only inside lab
namespaces (each end is created directly where it belongs), so removing the namespaces
removes every veth; nothing is ever created in the caller's namespace.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from thorn import netns
from thorn.desired import TEP_LABEL
from thorn.model import FabricDocument
from thorn_lab import names, state
from thorn_lab.blueprint import EndPlan, LabPlan, plan_lab
from thorn_lab.rtnl import LinkState, Rtnl

__all__ = ["DownResult", "LabConflict", "UpResult", "down", "up"]

Progress = Callable[[str, int, int], None]  # (phase, done, total)
# The a end of veth pair n gets ifindex VETH_INDEX_BASE + n; the b end a small one from the
# kernel. Two ends with the same ifindex look like a physical port to linkwatch, which then
# reports their carrier changes up to 1 s late (measured: 0.3 ms with distinct indexes).
VETH_INDEX_BASE = 100_000
OPER_WAIT_S = 10.0  # a new veth reports operstate UP within about 1 s (linkwatch)
POLL_S = 0.02


class LabConflict(RuntimeError):
    """A lab with this prefix exists with another fabric."""


@dataclass
class UpResult:
    prefix: str
    namespaces: int
    veths: int
    created_namespaces: int = 0
    created_veths: int = 0
    repairs: list[str] = field(default_factory=list)
    not_up: list[str] = field(default_factory=list)  # ends still not operstate UP
    held_down: int = 0  # ends a recorded fault keeps down
    unlinked_ports: list[str] = field(default_factory=list)
    existed: bool = False
    seconds: float = 0.0


@dataclass
class DownResult:
    prefix: str
    namespaces: int = 0
    state_removed: bool = False
    held_by: list[int] = field(default_factory=list)  # pids still inside removed namespaces
    seconds: float = 0.0


def _quiet(phase: str, done: int, total: int) -> None:
    del phase, done, total


def _write_sysctls(namespace: str, values: dict[str, str]) -> None:
    with netns.entered(namespace):  # /proc/sys/net shows the opening thread's namespace
        for key, value in values.items():
            Path("/proc/sys", key).write_text(value)


class _Builder:
    def __init__(self, plan: LabPlan, held: set[tuple[str, str]], progress: Progress) -> None:
        self.plan = plan
        self.held = held
        self.progress = progress
        self.rtnl: dict[str, Rtnl] = {}
        self.links: dict[str, dict[str, LinkState]] = {}
        self.result = UpResult(
            plan.prefix,
            len(plan.namespaces),
            len(plan.veths),
            unlinked_ports=list(plan.unlinked_ports),
        )

    def close(self) -> None:
        for handle in self.rtnl.values():
            handle.close()

    def namespaces(self) -> None:
        total = len(self.plan.namespaces)
        for done, ns in enumerate(self.plan.namespaces, 1):
            path = netns.path(ns.name)
            if path.exists() and not os.path.ismount(path):
                netns.remove(ns.name)  # a name left behind by an interrupted create
                self.result.repairs.append(f"stale namespace name {ns.name}")
            if not path.exists():
                netns.create(ns.name)
                self.result.created_namespaces += 1
                self._note(f"created namespace {ns.name}")
            _write_sysctls(ns.name, ns.sysctls)
            self.rtnl[ns.name] = Rtnl.open(ns.name)
            self.progress("namespaces", done, total)

    def loopbacks(self) -> None:
        for ns in self.plan.namespaces:
            handle = self.rtnl[ns.name]
            lo = handle.links()[names.LOOPBACK]
            if not lo.admin_up:
                handle.set_admin(lo.index, True)
            have = handle.addresses().get(lo.index, set())
            for cidr in ns.loopback:
                if cidr not in have:
                    # Labelled as the programmer labels the TEPs it owns: an agent started
                    # on this lab finds them in place and changes nothing.
                    handle.add_address(lo.index, cidr, TEP_LABEL)
                    self._note(f"added TEP {cidr} on {ns.name}:lo")

    def _note(self, what: str) -> None:
        """Record a repair: something an existing lab was missing."""
        if self.result.existed:
            self.result.repairs.append(what)

    def veths(self) -> None:
        for ns in self.plan.namespaces:
            self.links[ns.name] = self.rtnl[ns.name].links()
        total = len(self.plan.veths)
        fds: dict[str, int] = {}
        try:
            with Rtnl.open() as root:
                for done, veth in enumerate(self.plan.veths, 1):
                    a = self.links[veth.a.namespace].get(veth.a.ifname)
                    b = self.links[veth.b.namespace].get(veth.b.ifname)
                    if a and b and a.kind == "veth" and b.kind == "veth":
                        self.progress("veth pairs", done, total)
                        continue
                    for end, found in ((veth.a, a), (veth.b, b)):
                        if found is not None:  # half a pair, or a device of another kind
                            self.rtnl[end.namespace].delete_link(found.index)
                            self._note(f"removed half pair {end.namespace}:{end.ifname}")
                    for end in (veth.a, veth.b):
                        if end.namespace not in fds:
                            fds[end.namespace] = netns.open_fd(end.namespace)
                    root.add_veth(
                        (veth.a.ifname, fds[veth.a.namespace], veth.a.mac),
                        (veth.b.ifname, fds[veth.b.namespace], veth.b.mac),
                        a_index=VETH_INDEX_BASE + done,
                    )
                    self.result.created_veths += 1
                    self._note(f"created veth pair {veth.name}")
                    self.progress("veth pairs", done, total)
        finally:
            for fd in fds.values():
                os.close(fd)

    def ends(self) -> None:
        for ns in self.plan.namespaces:
            self.links[ns.name] = self.rtnl[ns.name].links()
        addresses = {ns: handle.addresses() for ns, handle in self.rtnl.items()}
        for veth in self.plan.veths:
            for end in (veth.a, veth.b):
                self._configure(end, addresses[end.namespace])
                if veth.kind == "link":
                    # Grafting a qdisc on a live device stalls its transmit queue for a few
                    # ms (dev_deactivate): add the fault hook now, never at fault time.
                    link = self.links[end.namespace][end.ifname]
                    self.rtnl[end.namespace].ensure_clsact(link.index)
        for wl in self.plan.workloads:
            if wl.subnet is not None:
                handle = self.rtnl[wl.namespace]
                handle.add_route(wl.subnet, oif=self.links[wl.namespace][wl.vf].index)

    def _configure(self, end: EndPlan, addresses: dict[int, set[str]]) -> None:
        handle = self.rtnl[end.namespace]
        link = self.links[end.namespace][end.ifname]
        if end.mac is not None and (link.mac or "").lower() != end.mac:
            handle.set_mac(link.index, end.mac)
            self._note(f"set MAC of {end.namespace}:{end.ifname}")
        have = addresses.get(link.index, set())
        for cidr in end.addresses:
            if cidr not in have:
                handle.add_address(link.index, cidr)
                self._note(f"added {cidr} on {end.namespace}:{end.ifname}")
        want_up = (end.namespace, end.ifname) not in self.held
        if not want_up:
            self.result.held_down += 1
        if link.admin_up != want_up:
            handle.set_admin(link.index, want_up)
            self._note(f"set {end.namespace}:{end.ifname} admin {'up' if want_up else 'down'}")

    def wait_oper_up(self, timeout: float) -> None:
        """Wait until every end that should carry traffic reports operstate UP."""
        pending: dict[str, set[str]] = {}
        for veth in self.plan.veths:
            ends = [(veth.a.namespace, veth.a.ifname), (veth.b.namespace, veth.b.ifname)]
            if any(e in self.held for e in ends):
                continue
            for ns, ifname in ends:
                pending.setdefault(ns, set()).add(ifname)
        total = sum(len(v) for v in pending.values())
        deadline = time.monotonic() + timeout
        while pending:
            for ns in list(pending):
                links = self.rtnl[ns].links()
                pending[ns] = {i for i in pending[ns] if links[i].operstate != "UP"}
                if not pending[ns]:
                    del pending[ns]
            left = sum(len(v) for v in pending.values())
            self.progress("links operationally up", total - left, total)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        self.result.not_up = sorted(f"{ns}:{i}" for ns, ifs in pending.items() for i in ifs)


def up(
    doc: FabricDocument,
    prefix: str = names.DEFAULT_PREFIX,
    *,
    replace: bool = False,
    progress: Progress | None = None,
    wait_s: float = OPER_WAIT_S,
) -> UpResult:
    """Build lab `prefix` from `doc`, or repair it if it exists with the same layout.

    Raises PlanError for a fabric that cannot be laid out, LabConflict if the lab exists
    with another layout (unless `replace`: then it is taken down first).
    """
    started = time.perf_counter()
    plan = plan_lab(doc, prefix)
    with state.lock(prefix):
        existing = state.load_description(prefix)
        if existing is not None and existing.plan != plan:
            if not replace:
                raise LabConflict(
                    f"lab '{prefix}' exists with another fabric; take it down first "
                    "(thornctl lab down) or replace it (--replace)"
                )
            _down_locked(prefix, DownResult(prefix))
            existing = None
        faults = state.load_faults(prefix) if existing is not None else state.FaultBook()
        held = {(d.namespace, d.ifname) for f in faults.faults for d in f.admin_down}
        created_at = existing.created_at if existing is not None else state.now()
        # Saved first, so an interrupted build can still be found and taken down.
        state.save_description(
            state.LabDescription(prefix=prefix, created_at=created_at, fabric=doc, plan=plan)
        )
        builder = _Builder(plan, held, progress or _quiet)
        builder.result.existed = existing is not None
        try:
            builder.namespaces()
            builder.loopbacks()
            builder.veths()
            builder.ends()
            builder.wait_oper_up(wait_s)
        finally:
            builder.close()
    builder.result.seconds = time.perf_counter() - started
    return builder.result


def _holders(inodes: set[tuple[int, int]]) -> list[int]:
    """Processes whose network namespace is one of `inodes` ((st_dev, st_ino) pairs)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            info = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (info.st_dev, info.st_ino) in inodes:
            pids.append(int(entry))
    return sorted(pids)


def _down_locked(prefix: str, result: DownResult) -> None:
    described = state.load_description(prefix)
    found = {n for n in netns.listed() if names.is_lab_namespace(prefix, n)}
    if described is not None:
        found |= {n.name for n in described.plan.namespaces if netns.exists(n.name)}
    inodes = set()
    for name in found:
        try:
            info = os.stat(netns.path(name))
            inodes.add((info.st_dev, info.st_ino))
        except OSError:
            pass
    result.held_by = _holders(inodes)
    for name in sorted(found):
        if netns.remove(name):
            result.namespaces += 1
    result.state_removed = state.remove_state(prefix)


def down(prefix: str = names.DEFAULT_PREFIX) -> DownResult:
    """Remove lab `prefix` completely; a lab that is not there is not an error."""
    names.check_prefix(prefix)
    started = time.perf_counter()
    result = DownResult(prefix)
    with state.lock(prefix, forget=True):
        _down_locked(prefix, result)
    result.seconds = time.perf_counter() - started
    return result
