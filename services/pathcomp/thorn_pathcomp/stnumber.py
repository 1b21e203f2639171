"""Disjoint trees for any topology: st-numberings of biconnected blocks.

The colour partition in `trees.py` gives shortest disjoint paths on Clos fabrics; this module
is the general method it falls back to when a source switch has no neighbour of one colour.

For a destination, add a virtual root R joined to its attachment switches (a single-homed
group's one switch is the root itself). Split that graph into biconnected blocks. In each
block, number the vertices s = the block's vertex nearest the root, ..., t = a neighbour of s,
so that every other vertex has a lower and a higher neighbour (an st-numbering, built here by
adding open ears). Red follows lower neighbours down to s; blue follows higher neighbours up
to t and then the edge t-s. A red path only visits numbers below its source and a blue path
only numbers above it, so within a block they are node-disjoint; between blocks they meet
only at cut vertices, which no topology can avoid and the plan reports.
"""

from __future__ import annotations

from collections import deque

from thorn_pathcomp.graph import FabricGraph, Group
from thorn_pathcomp.trees import HOST, NextHop

Adj = list[list[tuple[int, int]]]  # vertex -> (neighbour, edge key); negative keys: host links
_NO_EDGE = -(1 << 40)  # "arrived by no edge" (the DFS root)


def _blocks(adj: Adj, root: int) -> list[list[tuple[int, int, int]]]:
    """Biconnected blocks as lists of edges (u, v, key), found by an iterative DFS."""
    n = len(adj)
    disc = [-1] * n
    low = [0] * n
    blocks: list[list[tuple[int, int, int]]] = []
    stack: list[tuple[int, int, int]] = []
    counter = 0
    disc[root] = low[root] = counter
    # frames: (vertex, key of the edge we came in by, iterator position)
    frames: list[list[int]] = [[root, _NO_EDGE, 0]]
    while frames:
        frame = frames[-1]
        v, via, i = frame
        if i < len(adj[v]):
            frame[2] += 1
            u, key = adj[v][i]
            if key == via:
                continue  # the edge we arrived by (parallel edges have other keys)
            if disc[u] == -1:
                counter += 1
                disc[u] = low[u] = counter
                stack.append((v, u, key))
                frames.append([u, key, 0])
            elif disc[u] < disc[v]:
                stack.append((v, u, key))
                low[v] = min(low[v], disc[u])
            continue
        frames.pop()
        if frames:
            parent = frames[-1][0]
            low[parent] = min(low[parent], low[v])
            if low[v] >= disc[parent]:
                block: list[tuple[int, int, int]] = []
                while True:
                    edge = stack.pop()
                    block.append(edge)
                    if edge[0] == parent and edge[1] == v and edge[2] == via:
                        break
                blocks.append(block)
    return blocks


def _st_order(
    vertices: set[int], adj: dict[int, list[tuple[int, int]]], s: int, t: int
) -> list[int]:
    """An st-numbering of one biconnected block in O(V + E) (Tarjan's streamlined form).

    A depth-first search from s takes the edge s-t first. Then, in preorder, each vertex v is
    put just before or just after its DFS parent in a list that starts as [s, t], depending on
    the sign of the vertex its lowpoint reaches (Tarjan 1986, "Two streamlined depth-first
    search algorithms"). Returns [] when the block turns out not to be biconnected.
    """
    pre: dict[int, int] = {s: 0}
    parent: dict[int, int] = {}
    low: dict[int, int] = {s: s}  # the lowpoint *vertex*
    preorder = [s]
    # Iterative DFS; t is s's first child so that s-t is a tree edge.
    first = [(t, key) for t_, key in adj[s] if t_ == t][:1]
    rest = [item for item in adj[s] if item[0] != t or item[1] != first[0][1]]
    stack: list[tuple[int, int, list[tuple[int, int]], int]] = [(s, -1, first + rest, 0)]
    while stack:
        v, via, neighbours, i = stack[-1]
        if i < len(neighbours):
            stack[-1] = (v, via, neighbours, i + 1)
            u, key = neighbours[i]
            if key == via:
                continue
            if u not in pre:
                pre[u] = len(preorder)
                preorder.append(u)
                parent[u] = v
                low[u] = u
                stack.append((u, key, adj[u], 0))
            elif pre[u] < pre[low[v]]:
                low[v] = u
            continue
        stack.pop()
        if v in parent:
            p = parent[v]
            if pre[low[v]] < pre[low[p]]:
                low[p] = low[v]
    if len(preorder) != len(vertices):
        return []
    after: dict[int, int | None] = {s: t, t: None}
    before: dict[int, int | None] = {s: None, t: s}
    minus = {s: True}  # sign of each placed vertex: True is '-'
    for v in preorder[2:]:
        p = parent[v]
        if pre[low[v]] >= pre[p]:
            return []  # p is a cut vertex: not biconnected
        if minus.get(low[v], False):
            prev = before[p]  # insert v before p
            before[v], after[v] = prev, p
            before[p] = v
            if prev is not None:
                after[prev] = v
            minus[p] = False
        else:
            nxt = after[p]  # insert v after p
            before[v], after[v] = p, nxt
            after[p] = v
            if nxt is not None:
                before[nxt] = v
            minus[p] = True
    order: list[int] = []
    node: int | None = s
    while node is not None:
        order.append(node)
        node = after[node]
    return order


def st_next_hops(
    graph: FabricGraph, group: Group
) -> tuple[list[NextHop | None], list[NextHop | None]]:
    """Red and blue next hops toward `group` for every switch, by blocks and st-numberings."""
    n = len(graph.switches)
    adj: Adj = [list(nbrs) for nbrs in graph.adjacency]
    if len(group) == 1:
        root = group[0]
    else:
        root = n  # the virtual destination, joined to each attachment switch
        adj.append([])
        for s in group:
            adj[s].append((root, -1 - s))  # one key per attachment: -1-s
            adj[root].append((s, -1 - s))
    red: list[NextHop | None] = [None] * n
    blue: list[NextHop | None] = [None] * n
    if root < n:
        red[root] = blue[root] = NextHop(HOST, -1)
    # Blocks, and each block's vertex nearest the root (BFS over the block-cut structure).
    blocks = _blocks(adj, root)
    vertex_blocks: dict[int, list[int]] = {}
    for b, block in enumerate(blocks):
        for u, v, _ in block:
            for w in (u, v):
                vertex_blocks.setdefault(w, [])
                if not vertex_blocks[w] or vertex_blocks[w][-1] != b:
                    vertex_blocks[w].append(b)
    block_root: dict[int, int] = {}
    seen_vertices = {root}
    queue: deque[int] = deque([root])
    while queue:
        w = queue.popleft()
        for b in vertex_blocks.get(w, []):
            if b in block_root:
                continue
            block_root[b] = w
            for u, v, _ in blocks[b]:
                for x in (u, v):
                    if x not in seen_vertices:
                        seen_vertices.add(x)
                        queue.append(x)

    def hop(to: int, key: int) -> NextHop:
        return NextHop(HOST, -1) if to >= n else NextHop(to, key)

    for b, block in enumerate(blocks):
        s = block_root[b]
        vertices = {w for u, v, _ in block for w in (u, v)}
        badj: dict[int, list[tuple[int, int]]] = {w: [] for w in vertices}
        for u, v, key in block:
            badj[u].append((v, key))
            badj[v].append((u, key))
        for w in vertices:
            badj[w].sort(key=lambda item: (item[0], _link(graph, item[1])))
        s_edges = sorted(badj[s], key=lambda item: (item[0], _link(graph, item[1])))
        if len(vertices) == 2:  # one edge, or parallel edges between two vertices
            (v,) = vertices - {s}
            links = [key for u, key in s_edges if u == v]
            red[v] = hop(s, links[0])
            blue[v] = hop(s, links[-1])  # a second parallel link if there is one
            continue
        t, t_key = s_edges[-1]  # the virtual root's last attachment; else any neighbour
        order = _st_order(vertices, badj, s, t)
        if not order:
            continue
        rank = {v: i for i, v in enumerate(order)}
        dist_red = {s: 0}
        for v in order[1:]:
            options = [
                (dist_red[u], u, key)
                for u, key in badj[v]
                if rank[u] < rank[v] and not (v == t and u == s and key == t_key)
            ]
            d, u, key = min(options, key=lambda o: (o[0], o[1], _link(graph, o[2])))
            dist_red[v] = d + 1
            if v < n:
                red[v] = hop(u, key)
        dist_blue = {s: 0, t: 1}
        if t < n:
            blue[t] = hop(s, t_key)
        for v in reversed(order[1:-1]):
            options = [(dist_blue[u], u, key) for u, key in badj[v] if rank[u] > rank[v]]
            d, u, key = min(options, key=lambda o: (o[0], o[1], _link(graph, o[2])))
            dist_blue[v] = d + 1
            if v < n:
                blue[v] = hop(u, key)
    return red, blue


def _link(graph: FabricGraph, key: int) -> int:
    return graph.edges[key].link_id if key >= 0 else -1


__all__ = ["st_next_hops"]
