"""`Lab`: how agents, tests and the CLI find a running lab's namespaces and interfaces.

    lab = Lab.open("thorn")                 # from /run/thorn-lab/thorn/lab.json
    lab.namespace("leaf1")                  # 'thorn-leaf1'  (KeyError-like LookupError)
    lab.ifname("leaf1", "swp1")             # 'swp1'
    lab.namespaces()                        # {'spine1': 'thorn-spine1', ...}
    lab.workload("host1-vf0").namespace     # 'thorn-w-host1-vf0'; .vf, .rep, .ip, .mac
    lab.run("leaf1", fn, arg)               # fn(arg) in a thread inside thorn-leaf1
    with lab.entered("leaf1"): ...          # this thread inside thorn-leaf1 for the block
    lab.link("leaf1:swp1")                  # the link with that end (also "leaf1--spine1")

The description is read once; a lab rebuilt with another fabric needs a new `Lab.open`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import ParamSpec, TypeVar

from thorn import netns
from thorn.model import FabricDocument
from thorn_lab import names, state
from thorn_lab.blueprint import EndPlan, LabPlan, NamespaceKind, VethPlan, WorkloadPlan
from thorn_lab.rtnl import Rtnl

__all__ = ["Lab", "LabNotFound", "LinkEnds", "UnknownName"]

P = ParamSpec("P")
T = TypeVar("T")


class LabNotFound(LookupError):
    def __init__(self, prefix: str) -> None:
        super().__init__(f"no lab '{prefix}' on this machine (no {names.state_dir(prefix)})")
        self.prefix = prefix


class UnknownName(LookupError):
    """A node, port, workload or link the lab does not have; the message names it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class LinkEnds:
    """A link seen from one end: `near` is the end that was named first."""

    def __init__(self, veth: VethPlan, near: EndPlan, far: EndPlan) -> None:
        self.veth = veth
        self.near = near
        self.far = far

    @property
    def name(self) -> str:
        return self.veth.name


class Lab:
    def __init__(self, description: state.LabDescription) -> None:
        self.description = description
        self.plan: LabPlan = description.plan
        self._ns = {
            n.node: n.name for n in self.plan.namespaces if n.kind is not NamespaceKind.workload
        }
        self._workloads = {w.name: w for w in self.plan.workloads}
        self._ends: dict[tuple[str, str], tuple[VethPlan, EndPlan, EndPlan]] = {}
        for veth in self.plan.links():
            assert veth.a.port is not None and veth.b.port is not None
            self._ends[(veth.a.node, veth.a.port)] = (veth, veth.a, veth.b)
            self._ends[(veth.b.node, veth.b.port)] = (veth, veth.b, veth.a)

    @classmethod
    def open(cls, prefix: str = names.DEFAULT_PREFIX) -> Lab:
        description = state.load_description(prefix)
        if description is None:
            raise LabNotFound(prefix)
        return cls(description)

    @property
    def prefix(self) -> str:
        return self.plan.prefix

    @property
    def fabric(self) -> FabricDocument:
        return self.description.fabric

    # --- names ---------------------------------------------------------------------------

    def namespaces(self) -> dict[str, str]:
        """node -> namespace, for every fabric node."""
        return dict(self._ns)

    def namespace(self, node: str) -> str:
        """The namespace of a node, or of a workload (its own namespace)."""
        if node in self._ns:
            return self._ns[node]
        if node in self._workloads:
            return self._workloads[node].namespace
        raise UnknownName(f"no node or workload '{node}' in lab '{self.prefix}'")

    def ifname(self, node: str, port: str) -> str:
        try:
            return self.plan.ports[node][port]
        except KeyError:
            raise UnknownName(f"no port '{node}:{port}' in lab '{self.prefix}'") from None

    def workload(self, name: str) -> WorkloadPlan:
        try:
            return self._workloads[name]
        except KeyError:
            raise UnknownName(f"no workload '{name}' in lab '{self.prefix}'") from None

    def node_links(self, node: str) -> list[LinkEnds]:
        """Every link with an end on `node`, seen from that end."""
        self.namespace(node)
        return [
            LinkEnds(veth, near, far)
            for (n, _), (veth, near, far) in self._ends.items()
            if n == node
        ]

    def link(self, ref: str) -> LinkEnds:
        """Resolve ``node:port`` (either end), ``nodeA--nodeB`` (one link between them) or
        the full ``a:p--b:q``; the first-named end is `near`."""
        for veth, near, far in self._ends.values():
            if ref == f"{near.node}:{near.port}--{far.node}:{far.port}":
                return LinkEnds(veth, near, far)
        if "--" in ref:
            left, _, right = ref.partition("--")
            between = [
                LinkEnds(veth, near, far)
                for (n, _), (veth, near, far) in self._ends.items()
                if n == left and far.node == right
            ]
            if len(between) > 1:
                options = ", ".join(f"{e.near.node}:{e.near.port}" for e in between)
                raise UnknownName(
                    f"{len(between)} links join {left} and {right}: name one end ({options})"
                )
            if between:
                return between[0]
            raise UnknownName(f"no link '{ref}' in lab '{self.prefix}'")
        node, sep, port = ref.partition(":")
        if not sep or (node, port) not in self._ends:
            raise UnknownName(f"no link '{ref}' in lab '{self.prefix}' (give node:port)")
        veth, near, far = self._ends[(node, port)]
        return LinkEnds(veth, near, far)

    # --- running code inside ---------------------------------------------------------------

    def run(self, node: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` in a new thread inside the namespace of `node` (or of a
        workload); returns its result, raises its exception."""
        return netns.run_in_netns(self.namespace(node), fn, *args, **kwargs)

    def entered(self, node: str) -> AbstractContextManager[None]:
        """The calling thread inside `node`'s namespace for a `with` block."""
        return netns.entered(self.namespace(node))

    def rtnl(self, node: str) -> Rtnl:
        """An rtnetlink handle bound to `node`'s namespace (close it, or use `with`)."""
        return Rtnl.open(self.namespace(node))
