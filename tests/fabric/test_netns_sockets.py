"""Agents serving nodes in namespaces open their rtnetlink sockets there without forking
(pyroute2's own `netns=` forks a child per socket, which once hung a fabric test: a lock
held by another thread at the fork). The socket lives in the namespace it was made in."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from thorn import netns
from thorn_programmer.drivers.netlink import rtnl

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def children() -> set[int]:
    """This process's child processes, from every thread's list (a thread that ends
    between the listing and the read had none left to count: found in CI)."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            text = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        found |= {int(pid) for pid in text}
    return found


async def test_rtnl_in_a_namespace_works_there_and_forks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forks: list[str] = []
    real_fork = os.fork

    def counted_fork() -> int:
        forks.append("fork")
        return real_fork()

    monkeypatch.setattr(os, "fork", counted_fork)
    name = f"nssock{uuid.uuid4().hex[:6]}"
    netns.create(name)
    try:
        before = children()
        async with await rtnl(name) as ip:
            await ip.link("add", ifname="ns0", kind="veth", peer="ns1")
            inside = {link.get("ifname") async for link in await ip.link("dump")}
        assert forks == [] and children() - before == set(), "a child process was started"
        assert {"lo", "ns0", "ns1"} <= inside
        async with await rtnl(None) as ip:
            here = {link.get("ifname") async for link in await ip.link("dump")}
        assert "ns0" not in here  # made in the namespace, not in ours
    finally:
        netns.remove(name)
