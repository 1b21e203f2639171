// The fabric map's layout: tiers, not a force-directed hairball. Pure: names in, positions out.
//
// Hosts are tier 0; a switch's tier is one more than its hop distance from the nearest
// host-facing switch (leaves 1, spines or aggregation 2, cores 3, ...). Leaves sit in a row
// in name order with their hosts in a small grid below; each upper switch sits over the
// mean position of its neighbours one tier down, spread so none overlap.

export interface LayoutNode {
  name: string;
  role: string; // "host" | "switch"
}
export interface LayoutLink {
  a: string;
  b: string;
}
export interface Placed {
  tier: number;
  x: number;
  y: number;
}

const natural = new Intl.Collator(undefined, { numeric: true }).compare;
const TIER_GAP = 220;
const HOST_GAP = 26;
const HOSTS_PER_ROW = 4;
const MIN_SWITCH_GAP = 44;

export function tiers(nodes: LayoutNode[], links: LayoutLink[]): Map<string, number> {
  const role = new Map(nodes.map((n) => [n.name, n.role]));
  const near = new Map<string, string[]>(nodes.map((n) => [n.name, []]));
  for (const { a, b } of links) {
    near.get(a)?.push(b);
    near.get(b)?.push(a);
  }
  const tier = new Map<string, number>();
  let frontier: string[] = [];
  for (const n of nodes) {
    if (n.role === "host") tier.set(n.name, 0);
  }
  for (const n of nodes) {
    if (n.role !== "host" && (near.get(n.name) ?? []).some((m) => role.get(m) === "host")) {
      tier.set(n.name, 1);
      frontier.push(n.name);
    }
  }
  for (let level = 2; frontier.length; level++) {
    const next: string[] = [];
    for (const v of frontier) {
      for (const m of near.get(v) ?? []) {
        if (!tier.has(m)) {
          tier.set(m, level);
          next.push(m);
        }
      }
    }
    frontier = next;
  }
  const top = Math.max(1, ...tier.values());
  for (const n of nodes) if (!tier.has(n.name)) tier.set(n.name, top + 1); // islands on top
  return tier;
}

export function layout(nodes: LayoutNode[], links: LayoutLink[]): Map<string, Placed> {
  const tier = tiers(nodes, links);
  const top = Math.max(1, ...tier.values());
  const near = new Map<string, string[]>(nodes.map((n) => [n.name, []]));
  for (const { a, b } of links) {
    near.get(a)?.push(b);
    near.get(b)?.push(a);
  }
  const placed = new Map<string, Placed>();
  const y = (t: number) => (top - t) * TIER_GAP;
  const byTier = (t: number) =>
    nodes.filter((n) => tier.get(n.name) === t).map((n) => n.name).sort(natural);

  // Leaves and their hosts: each leaf gets a column as wide as its host grid.
  const leaves = byTier(1);
  const hostOf = new Map<string, string[]>(leaves.map((l) => [l, []]));
  const orphans: string[] = [];
  for (const h of byTier(0)) {
    const leaf = (near.get(h) ?? []).filter((m) => tier.get(m) === 1).sort(natural)[0];
    if (leaf) hostOf.get(leaf)?.push(h);
    else orphans.push(h);
  }
  let x = 0;
  for (const leaf of leaves) {
    const hosts = hostOf.get(leaf) ?? [];
    const cols = Math.min(HOSTS_PER_ROW, Math.max(1, hosts.length));
    const width = Math.max(MIN_SWITCH_GAP, cols * HOST_GAP + 18);
    const centre = x + width / 2;
    placed.set(leaf, { tier: 1, x: centre, y: y(1) });
    hosts.forEach((h, i) => {
      const row = Math.floor(i / cols);
      const col = i % cols;
      placed.set(h, {
        tier: 0,
        x: centre + (col - (cols - 1) / 2) * HOST_GAP,
        y: y(1) + 80 + row * HOST_GAP,
      });
    });
    x += width;
  }
  orphans.forEach((h, i) => placed.set(h, { tier: 0, x: x + i * HOST_GAP, y: y(1) + 80 }));
  const width = Math.max(x, MIN_SWITCH_GAP);

  // Upper tiers: over their neighbours below (barycentre), then spread apart.
  for (let t = 2; t <= top; t++) {
    const names = byTier(t);
    const wanted = names.map((n) => {
      const below = (near.get(n) ?? []).map((m) => placed.get(m)).filter((p) => p && p.tier < t);
      const mean = below.length ? below.reduce((s, p) => s + p!.x, 0) / below.length : width / 2;
      return { n, x: mean };
    });
    wanted.sort((p, q) => p.x - q.x || natural(p.n, q.n));
    const gap = Math.max(MIN_SWITCH_GAP, Math.min(width / Math.max(1, names.length), 120));
    // Keep order, keep them apart, and centre the row over what it serves.
    let last = -Infinity;
    const xs = wanted.map((w) => (last = Math.max(w.x, last + gap)));
    const shift = (xs.reduce((s, v) => s + v, 0) / Math.max(1, xs.length)) -
      (wanted.reduce((s, w) => s + w.x, 0) / Math.max(1, wanted.length));
    wanted.forEach((w, i) => placed.set(w.n, { tier: t, x: xs[i] - shift, y: y(t) }));
  }
  return placed;
}
