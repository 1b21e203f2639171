"""Per-pair explicit paths: validity, optimality against brute force, fallbacks, SRLGs.

Every pair is checked against the Fabric itself (not the FabricGraph the code uses): each path
is a walk from the source host to the destination host over links that are up between nodes
that are up, crossing switches only, with no node twice; and the reported shared links,
switches and SRLGs are exactly what the two paths have in common. Optimality is checked by
enumerating every simple path of a small fabric and every pair of them.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thorn.fabric import Fabric
from thorn.generators import dual_plane, fat_tree, leaf_spine, rail_optimized
from thorn.model import AdminState, FabricDocument, LinkSpec, LinkUpdate, NodeSpec, PortSpec, Role
from thorn_pathcomp.explicit import NoPath, PairPaths, SharedRisks, disjoint_pair
from thorn_pathcomp.graph import FabricGraph

# --- helpers --------------------------------------------------------------------------------

Walk = tuple[tuple[int, ...], tuple[str, ...]]  # link ids, switch names


def build(
    switches: int,
    links: Iterable[tuple[int, int]],
    src: Iterable[int],
    dst: Iterable[int],
    srlgs: dict[int, list[str]] | None = None,
) -> Fabric:
    """Switches sw00.., hosts `src` and `dst`; `links` between switch numbers, then the host
    attachments (link ids: 1.. in that order); `srlgs` by 0-based position in that order."""
    names = [f"sw{i:02d}" for i in range(switches)]
    ports: dict[str, list[str]] = defaultdict(list)
    pairs: list[tuple[str, str]] = [(names[a], names[b]) for a, b in links]
    pairs += [("src", names[s]) for s in src] + [("dst", names[s]) for s in dst]
    specs = []
    for i, (a, b) in enumerate(pairs):
        ends = []
        for node in (a, b):
            port = f"p{len(ports[node]) + 1}"
            ports[node].append(port)
            ends.append(f"{node}:{port}")
        specs.append(LinkSpec(a=ends[0], b=ends[1], srlgs=(srlgs or {}).get(i, [])))
    nodes = [
        NodeSpec(
            name=name,
            role=Role.host if name in ("src", "dst") else Role.switch,
            ports=[PortSpec(name=p) for p in ports[name]],
        )
        for name in [*names, "src", "dst"]
    ]
    return Fabric.from_document(FabricDocument(nodes=nodes, links=specs))


def usable(fabric: Fabric, link_id: int) -> bool:
    link = fabric.links[link_id]
    return link.admin_state is AdminState.up and all(
        fabric.nodes[end.node].admin_state is AdminState.up for end in (link.a, link.b)
    )


def walk(fabric: Fabric, src: str, dst: str, links: tuple[int, ...]) -> tuple[str, ...]:
    """Follow `links` from `src`; assert it is a loop-free path to `dst` over usable links and
    switches; return the switches crossed."""
    node, seen = src, [src]
    for i, link_id in enumerate(links):
        assert usable(fabric, link_id), f"link {link_id} is not usable"
        link = fabric.links[link_id]
        assert node in (link.a.node, link.b.node), f"link {link_id} does not touch {node}"
        node = link.b.node if link.a.node == node else link.a.node
        assert node not in seen, f"{node} visited twice"
        seen.append(node)
        last = i == len(links) - 1
        assert (node == dst) if last else fabric.nodes[node].role is Role.switch
    assert seen[-1] == dst
    return tuple(seen[1:-1])


def link_srlgs(fabric: Fabric, links: Iterable[int]) -> set[str]:
    return {g for link_id in links for g in fabric.links[link_id].srlgs}


def check(fabric: Fabric, graph: FabricGraph, pair: PairPaths) -> None:
    """The pair is two valid paths and its report tells exactly what they share."""
    red = walk(fabric, pair.src, pair.dst, pair.red)
    blue = walk(fabric, pair.src, pair.dst, pair.blue)
    assert tuple(graph.switches[s] for s in pair.red_switches) == red
    assert tuple(graph.switches[s] for s in pair.blue_switches) == blue
    assert (pair.red_hops, pair.blue_hops) == (len(pair.red), len(pair.blue))
    index = graph.index
    expected = SharedRisks(
        links=tuple(sorted(set(pair.red) & set(pair.blue))),
        switches=tuple(sorted(index[s] for s in set(red) & set(blue))),
        srlgs=tuple(sorted(link_srlgs(fabric, pair.red) & link_srlgs(fabric, pair.blue))),
    )
    assert pair.shared == expected
    kind = "none" if expected.links else "link" if expected.switches else "node"
    assert pair.disjoint == kind
    assert pair.shortest <= min(pair.red_hops, pair.blue_hops)


def simple_paths(fabric: Fabric, src: str, dst: str) -> list[Walk]:
    """Every loop-free path from host `src` to host `dst` crossing switches only."""
    adjacent: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for link in fabric.links.values():
        if usable(fabric, link.id):
            adjacent[link.a.node].append((link.id, link.b.node))
            adjacent[link.b.node].append((link.id, link.a.node))
    out: list[Walk] = []

    def extend(node: str, links: list[int], nodes: list[str]) -> None:
        for link_id, other in adjacent[node]:
            if other == dst:
                out.append(((*links, link_id), tuple(nodes[1:])))
            elif other not in nodes and fabric.nodes[other].role is Role.switch:
                extend(other, [*links, link_id], [*nodes, other])

    extend(src, [], [src])
    return out


def score(fabric: Fabric, a: Walk, b: Walk, srlg: bool = False) -> tuple[int, ...]:
    """(shared links, [shared SRLGs,] shared switches, total hops): lower is better."""
    links = len(set(a[0]) & set(b[0]))
    switches = len(set(a[1]) & set(b[1]))
    hops = len(a[0]) + len(b[0])
    if srlg:
        srlgs = len(link_srlgs(fabric, a[0]) & link_srlgs(fabric, b[0]))
        return (links, srlgs, switches, hops)
    return (links, switches, hops)


def best_score(fabric: Fabric, src: str, dst: str, srlg: bool = False) -> tuple[int, ...] | None:
    paths = simple_paths(fabric, src, dst)
    pairs = itertools.combinations_with_replacement(paths, 2)
    return min((score(fabric, a, b, srlg) for a, b in pairs), default=None)


def pair_score(fabric: Fabric, pair: PairPaths, srlg: bool = False) -> tuple[int, ...]:
    red = (pair.red, walk(fabric, pair.src, pair.dst, pair.red))
    blue = (pair.blue, walk(fabric, pair.src, pair.dst, pair.blue))
    return score(fabric, red, blue, srlg)


def hosts_of(fabric: Fabric) -> list[str]:
    return sorted(n for n, node in fabric.nodes.items() if node.role is Role.host)


def link_between(fabric: Fabric, a: str, b: str) -> int:
    (found,) = [lk.id for lk in fabric.links.values() if {lk.a.node, lk.b.node} == {a, b}]
    return found


def shortest_hops(fabric: Fabric, src: str, dst: str) -> int:
    """Breadth-first hop count over usable links, crossing switches only."""
    frontier, seen, hops = [src], {src}, 0
    while frontier:
        hops += 1
        nxt = []
        for node in frontier:
            for link in fabric.links.values():
                if not usable(fabric, link.id) or node not in (link.a.node, link.b.node):
                    continue
                other = link.b.node if link.a.node == node else link.a.node
                if other == dst:
                    return hops
                if other not in seen and fabric.nodes[other].role is Role.switch:
                    seen.add(other)
                    nxt.append(other)
        frontier = nxt
    raise AssertionError("no path")


# --- generated fabrics ----------------------------------------------------------------------


def test_leaf_spine_single_homed_shares_only_the_host_links_and_leaves() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 2, 2))
    graph = FabricGraph.from_fabric(fabric)
    for a, b in itertools.permutations(hosts_of(fabric), 2):
        pair = disjoint_pair(graph, a, b)
        check(fabric, graph, pair)
        assert pair_score(fabric, pair) == best_score(fabric, a, b)
    pair = disjoint_pair(graph, "host1", "host3")  # leaf1 -> leaf2
    host_links = {link_between(fabric, "host1", "leaf1"), link_between(fabric, "host3", "leaf2")}
    assert set(pair.shared.links) == host_links
    assert pair.shared.switches == (graph.index["leaf1"], graph.index["leaf2"])
    assert pair.disjoint == "none"
    assert (pair.red_hops, pair.blue_hops, pair.shortest) == (4, 4, 4)
    assert {graph.switches[pair.red_switches[1]], graph.switches[pair.blue_switches[1]]} == {
        "spine1",
        "spine2",
    }


def test_hosts_on_one_leaf_share_everything_and_say_so() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 2, 2))
    graph = FabricGraph.from_fabric(fabric)
    pair = disjoint_pair(graph, "host1", "host2")
    check(fabric, graph, pair)
    assert pair.red == pair.blue  # the only loop-free path, twice
    assert len(pair.shared.links) == 2 and pair.shortest == 2


def test_leaf_spine_dual_homed_is_node_disjoint_and_minimal() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 4, 2, dual_homed=True))
    graph = FabricGraph.from_fabric(fabric)
    for a, b in itertools.permutations(hosts_of(fabric), 2):
        pair = disjoint_pair(graph, a, b)
        check(fabric, graph, pair)
        assert pair.disjoint == "node" and pair.shared.empty
        assert pair_score(fabric, pair) == best_score(fabric, a, b)
        assert pair.total_hops == 2 * pair.shortest  # both paths shortest


def test_fat_tree_pairs_meet_the_lower_bound() -> None:
    """Single-homed hosts must share their two host links and edge switches, and no pair is
    shorter than twice the shortest path: meeting all three bounds is optimal."""
    fabric = Fabric.from_document(fat_tree(4))
    graph = FabricGraph.from_fabric(fabric)
    hosts = hosts_of(fabric)
    for a, b in itertools.product(hosts[:4], hosts):
        if a == b:
            continue
        pair = disjoint_pair(graph, a, b)
        check(fabric, graph, pair)
        host_links = {pair.red[0], pair.red[-1]}
        edges = {pair.red_switches[0], pair.red_switches[-1]}
        assert set(pair.shared.links) == host_links
        assert set(pair.shared.switches) == edges
        assert pair.shortest == shortest_hops(fabric, a, b)
        assert pair.red_hops == pair.blue_hops == pair.shortest


def test_dual_plane_pairs_use_one_plane_each() -> None:
    fabric = Fabric.from_document(dual_plane(2, 4, 2))
    graph = FabricGraph.from_fabric(fabric)
    for a, b in itertools.permutations(hosts_of(fabric), 2):
        pair = disjoint_pair(graph, a, b)
        check(fabric, graph, pair)
        assert pair.disjoint == "node" and pair.shared.empty
        assert pair.total_hops == 2 * pair.shortest
        planes = [
            {fabric.nodes[graph.switches[s]].labels["plane"] for s in path}
            for path in (pair.red_switches, pair.blue_switches)
        ]
        assert planes == [{"a"}, {"b"}]


def test_dual_plane_small_matches_brute_force() -> None:
    fabric = Fabric.from_document(dual_plane(2, 2, 2))
    graph = FabricGraph.from_fabric(fabric)
    for a, b in itertools.permutations(hosts_of(fabric), 2):
        pair = disjoint_pair(graph, a, b, srlg_aware=True)
        check(fabric, graph, pair)
        assert pair_score(fabric, pair, srlg=True) == best_score(fabric, a, b, srlg=True)


def test_rail_optimized_servers_use_two_of_their_rails() -> None:
    fabric = Fabric.from_document(rail_optimized(2, 3, 1, 2))
    graph = FabricGraph.from_fabric(fabric)
    pair = disjoint_pair(graph, "host1", "host2")
    check(fabric, graph, pair)
    assert pair.disjoint == "node" and (pair.red_hops, pair.blue_hops) == (2, 2)
    assert pair_score(fabric, pair) == best_score(fabric, "host1", "host2")


def test_ties_go_to_the_lowest_switch_then_the_lowest_link_id() -> None:
    fabric = Fabric.from_document(leaf_spine(4, 2, 2))
    graph = FabricGraph.from_fabric(fabric)
    pair = disjoint_pair(graph, "host1", "host3")
    assert [graph.switches[p[1]] for p in (pair.red_switches, pair.blue_switches)] == [
        "spine1",
        "spine2",
    ]
    # Three parallel links sw00-sw01 (ids 1-3), host links after: ids 1 and 2 are used.
    fabric = build(2, [(0, 1), (0, 1), (0, 1)], src=[0], dst=[1])
    pair = disjoint_pair(FabricGraph.from_fabric(fabric), "src", "dst")
    assert (pair.red[1], pair.blue[1]) == (1, 2) and pair.shared.links == (4, 5)


def test_repeated_runs_give_identical_paths() -> None:
    doc = fat_tree(4)
    first = FabricGraph.from_fabric(Fabric.from_document(doc))
    second = FabricGraph.from_fabric(Fabric.from_document(doc))
    hosts = sorted(first.attachments)
    for a, b in zip(hosts, reversed(hosts), strict=True):
        if a != b:
            runs = {disjoint_pair(g, a, b) for g in (first, second, first)}
            assert len(runs) == 1


# --- fallbacks ------------------------------------------------------------------------------


def _two_halves(joint: str) -> Fabric:
    """Two leaf-spine halves (spines 0,1 + leaves 2,3; spines 5,6 + leaves 7,8) joined by
    switch 4 (`joint="switch"`, a cut vertex) or by one link (`joint="link"`, a bridge);
    src dual-homed to leaves 2,3 and dst to leaves 7,8."""
    links = [(2, 0), (2, 1), (3, 0), (3, 1), (7, 5), (7, 6), (8, 5), (8, 6)]
    links += [(0, 4), (1, 4), (5, 4), (6, 4)] if joint == "switch" else [(0, 5)]
    return build(9, links, src=[2, 3], dst=[7, 8])


def test_cut_vertex_falls_back_to_link_disjoint_and_reports_the_switch() -> None:
    fabric = _two_halves("switch")
    graph = FabricGraph.from_fabric(fabric)
    pair = disjoint_pair(graph, "src", "dst")
    check(fabric, graph, pair)
    assert pair.disjoint == "link"
    assert pair.shared == SharedRisks(switches=(graph.index["sw04"],))
    assert pair_score(fabric, pair) == best_score(fabric, "src", "dst")


def test_bridge_link_is_shared_and_reported() -> None:
    fabric = _two_halves("link")
    graph = FabricGraph.from_fabric(fabric)
    pair = disjoint_pair(graph, "src", "dst")
    check(fabric, graph, pair)
    bridge = link_between(fabric, "sw00", "sw05")
    assert pair.disjoint == "none"
    assert pair.shared.links == (bridge,)
    assert pair.shared.switches == (graph.index["sw00"], graph.index["sw05"])
    assert pair_score(fabric, pair) == best_score(fabric, "src", "dst")


def test_single_homed_host_reports_its_link() -> None:
    fabric = build(4, [(0, 1), (1, 2), (2, 3), (3, 0)], src=[0], dst=[1, 3])
    graph = FabricGraph.from_fabric(fabric)
    pair = disjoint_pair(graph, "src", "dst")
    check(fabric, graph, pair)
    host_link = link_between(fabric, "src", "sw00")
    assert pair.shared == SharedRisks(links=(host_link,), switches=(graph.index["sw00"],))
    assert pair.total_hops == 6  # src-sw00-sw01-dst and src-sw00-sw03-dst


# --- drained and down links, no path --------------------------------------------------------


@pytest.mark.parametrize("state", [AdminState.drained, AdminState.down])
def test_drained_and_down_links_are_never_used(state: AdminState) -> None:
    fabric = Fabric.from_document(leaf_spine(4, 2, 2))
    out = link_between(fabric, "leaf1", "spine1")
    before = disjoint_pair(FabricGraph.from_fabric(fabric), "host1", "host3")
    assert out in before.red + before.blue  # the lowest spine is preferred
    fabric.update_link(out, LinkUpdate(admin_state=state))
    graph = FabricGraph.from_fabric(fabric)
    pair = disjoint_pair(graph, "host1", "host3")
    check(fabric, graph, pair)
    assert out not in pair.red + pair.blue
    assert pair.total_hops == 8 and not set(pair.shared.links) - {pair.red[0], pair.red[-1]}


def test_drained_attachment_makes_a_dual_homed_host_single_homed() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 4, 2, dual_homed=True))
    eth2 = link_between(fabric, "host1", "leaf2")
    fabric.drain_link(eth2)
    graph = FabricGraph.from_fabric(fabric)
    pair = disjoint_pair(graph, "host1", "host3")
    check(fabric, graph, pair)
    assert pair.shared.links == (link_between(fabric, "host1", "leaf1"),)
    assert pair.disjoint == "none"


def test_a_host_without_usable_attachment_has_no_path() -> None:
    fabric = Fabric.from_document(leaf_spine(2, 2, 2))
    fabric.drain_link(link_between(fabric, "host3", "leaf2"))
    graph = FabricGraph.from_fabric(fabric)
    with pytest.raises(NoPath) as info:
        disjoint_pair(graph, "host1", "host3")
    assert (info.value.src, info.value.dst) == ("host1", "host3")
    assert "host3" in str(info.value) and "host1," not in info.value.reason
    with pytest.raises(NoPath, match="nowhere"):
        disjoint_pair(graph, "nowhere", "host1")


def test_disconnected_hosts_have_no_path() -> None:
    fabric = build(4, [(0, 1), (2, 3)], src=[0], dst=[3])
    with pytest.raises(NoPath, match="'src' to 'dst'"):
        disjoint_pair(FabricGraph.from_fabric(fabric), "src", "dst")


def test_a_host_to_itself_is_refused() -> None:
    graph = FabricGraph.from_fabric(Fabric.from_document(leaf_spine(2, 2, 2)))
    with pytest.raises(ValueError, match="same host"):
        disjoint_pair(graph, "host1", "host1")


# --- SRLGs ----------------------------------------------------------------------------------


def _leaf1_uplinks_in_one_srlg(spines: int) -> Fabric:
    fabric = Fabric.from_document(leaf_spine(spines, 2, 2))
    for spine in ("spine1", "spine2"):
        fabric.update_link(link_between(fabric, "leaf1", spine), LinkUpdate(srlgs=["conduit"]))
    return fabric


def test_srlg_that_cannot_be_avoided_is_reported() -> None:
    fabric = _leaf1_uplinks_in_one_srlg(2)
    graph = FabricGraph.from_fabric(fabric)
    for aware in (False, True):
        pair = disjoint_pair(graph, "host1", "host3", srlg_aware=aware)
        check(fabric, graph, pair)
        assert pair.shared.srlgs == ("conduit",)
        assert pair.srlg_aware is aware


def test_srlg_is_avoided_when_spines_allow() -> None:
    fabric = _leaf1_uplinks_in_one_srlg(4)
    graph = FabricGraph.from_fabric(fabric)
    plain = disjoint_pair(graph, "host1", "host3")
    assert plain.shared.srlgs == ("conduit",)  # spines 1 and 2 are the lowest
    pair = disjoint_pair(graph, "host1", "host3", srlg_aware=True)
    check(fabric, graph, pair)
    assert pair.shared.srlgs == ()
    assert pair.total_hops == 8  # no longer: a third or fourth spine is as short
    assert pair.shared.links == plain.shared.links  # the host links only
    assert pair_score(fabric, pair, srlg=True) == best_score(fabric, "host1", "host3", srlg=True)


def test_srlg_avoidance_takes_a_longer_path_when_it_must() -> None:
    """src on sw0 and sw3, dst on sw2 and sw4: sw0-sw1-sw2 (4 hops with host links),
    sw3-sw4 (3) and sw3-sw5-sw6-sw4 (5). Links sw0-sw1 and sw3-sw4 are both in SRLG g, so
    the shortest disjoint pair (7 hops) shares g and the only pair that does not has 9."""
    links = [(0, 1), (1, 2), (3, 4), (3, 5), (5, 6), (6, 4)]
    fabric = build(7, links, src=[0, 3], dst=[2, 4], srlgs={0: ["g"], 2: ["g"]})
    graph = FabricGraph.from_fabric(fabric)
    plain = disjoint_pair(graph, "src", "dst")
    assert plain.shared.srlgs == ("g",) and plain.total_hops == 7
    pair = disjoint_pair(graph, "src", "dst", srlg_aware=True)
    check(fabric, graph, pair)
    assert pair.shared.empty and pair.total_hops == 9
    assert pair_score(fabric, pair, srlg=True) == best_score(fabric, "src", "dst", srlg=True)


# --- random small fabrics (hypothesis) ------------------------------------------------------

PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def two_connected(draw: st.DrawFn) -> tuple[Fabric, bool]:
    """A ring of 3-6 switches (2-connected) plus chords (parallel links too), two hosts each
    on one or two switches; True when both hosts are dual-homed."""
    n = draw(st.integers(3, 6))
    links = [(i, (i + 1) % n) for i in range(n)]
    links += draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=4))
    links = [(a, b) for a, b in links if a != b]
    attach = st.lists(st.integers(0, n - 1), min_size=1, max_size=2, unique=True)
    src, dst = draw(attach), draw(attach)
    return build(n, links, src, dst), len(src) == 2 and len(dst) == 2


@st.composite
def connected(draw: st.DrawFn) -> Fabric:
    """A random tree of 2-7 switches plus extra links (cut vertices and bridges are common),
    hosts on one or two switches, some links with SRLGs, some drained or down."""
    n = draw(st.integers(2, 7))
    links = [(i, draw(st.integers(0, i - 1))) for i in range(1, n)]
    links += draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=5))
    links = [(a, b) for a, b in links if a != b]
    attach = st.lists(st.integers(0, n - 1), min_size=1, max_size=2, unique=True)
    src, dst = draw(attach), draw(attach)
    total = len(links) + len(src) + len(dst)
    groups = st.lists(st.sampled_from(["g1", "g2", "g3"]), max_size=2, unique=True)
    srlgs = draw(st.dictionaries(st.integers(0, total - 1), groups, max_size=total))
    fabric = build(n, links, src, dst, srlgs)
    states = st.sampled_from([AdminState.drained, AdminState.down])
    for link_id, state in draw(st.dictionaries(st.integers(1, total), states, max_size=2)).items():
        fabric.update_link(link_id, LinkUpdate(admin_state=state))
    return fabric


@PROFILE
@given(two_connected())
def test_random_two_connected_fabrics_match_brute_force(case: tuple[Fabric, bool]) -> None:
    fabric, dual_homed = case
    graph = FabricGraph.from_fabric(fabric)
    pair = disjoint_pair(graph, "src", "dst")
    check(fabric, graph, pair)
    assert pair_score(fabric, pair) == best_score(fabric, "src", "dst")
    if dual_homed:
        assert pair.disjoint == "node"
    assert disjoint_pair(graph, "src", "dst") == pair


@PROFILE
@given(connected())
def test_random_fabrics_match_brute_force_or_have_no_path(fabric: Fabric) -> None:
    graph = FabricGraph.from_fabric(fabric)
    best = best_score(fabric, "src", "dst")
    if best is None:
        with pytest.raises(NoPath):
            disjoint_pair(graph, "src", "dst")
        return
    pair = disjoint_pair(graph, "src", "dst")
    check(fabric, graph, pair)
    assert pair_score(fabric, pair) == best
    assert pair.shortest == shortest_hops(fabric, "src", "dst")


@PROFILE
@given(connected())
def test_srlg_mode_is_never_worse_and_reports_what_it_shares(fabric: Fabric) -> None:
    """The SRLG mode is a heuristic: never worse than the plain pair in its own ranking
    (shared links, shared SRLGs, shared switches, hops), never better than brute force, and
    always a valid pair with an exact report."""
    graph = FabricGraph.from_fabric(fabric)
    best = best_score(fabric, "src", "dst", srlg=True)
    if best is None:
        return
    plain = disjoint_pair(graph, "src", "dst")
    pair = disjoint_pair(graph, "src", "dst", srlg_aware=True)
    check(fabric, graph, pair)
    got = pair_score(fabric, pair, srlg=True)
    assert best <= got <= pair_score(fabric, plain, srlg=True)
    assert got[0] == best[0]  # never shares more links than needed
