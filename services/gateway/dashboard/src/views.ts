// The side panel's views: paths, what-if, failovers, link health and node. Each renders
// into the panel from the API and returns; live events ask the shell to render again.
import { api, ApiError, everything, must, type Schemas } from "./api";
import { badge, h, ms, replace, table, when } from "./dom";
import type { FabricMap, Selection } from "./map";

export interface Ctx {
  map: FabricMap;
  nodes: Map<string, Schemas["Node"]>;
  links: Map<number, Schemas["Link"]>;
  health: Map<number, Schemas["LinkHealthOut"]>;
  selection: Selection | null;
  pair: { src: string; dst: string } | null;
  whatIf: Selection[];
  say(text: string, ok?: boolean): void;
  select(what: Selection | null): void;
  can(role: "operator" | "admin"): boolean;
}

export function linkName(ctx: Ctx, id: number): string {
  const l = ctx.links.get(id);
  return l ? `${l.a.node}:${l.a.port} – ${l.b.node}:${l.b.port}` : `link ${id}`;
}

function loading(panel: HTMLElement, what: string): void {
  replace(panel, h("p", { class: "hint" }, `Loading ${what}…`));
}

/** A view that waits for the API draws into a container of its own: when the user has
 * moved on before the answer comes (another tab, another node), the late answer lands in
 * a container no longer on the page instead of over the view drawn since. */
function ownContainer(panel: HTMLElement): HTMLElement {
  const view = h("div", { class: "view" });
  replace(panel, view);
  return view;
}

async function guarded(ctx: Ctx, panel: HTMLElement, work: () => Promise<void>): Promise<void> {
  try {
    await work();
  } catch (err) {
    const text = err instanceof ApiError ? err.message : `Something went wrong: ${String(err)}`;
    replace(panel, h("p", { class: "error" }, text));
    ctx.say(text);
  }
}

// --- paths -------------------------------------------------------------------------------

export async function pathsView(ctx: Ctx, panel: HTMLElement): Promise<void> {
  const hosts = [...ctx.nodes.values()].filter((n) => n.role === "host").map((n) => n.name);
  const src = h("input", { name: "src", list: "hosts", placeholder: "source host",
    value: ctx.pair?.src ?? hosts[0] ?? "" });
  const dst = h("input", { name: "dst", list: "hosts", placeholder: "destination host",
    value: ctx.pair?.dst ?? hosts[hosts.length - 1] ?? "" });
  const result = h("div", { id: "path-result" });
  const summary = h("div", { id: "protection" });
  const form = h("form", { class: "inline", onsubmit: (e: Event) => {
    e.preventDefault();
    ctx.pair = { src: src.value.trim(), dst: dst.value.trim() };
    void showPair(ctx, result);
  } }, h("label", {}, "From ", src), h("label", {}, "to ", dst),
    h("button", { type: "submit" }, "Show paths"));
  replace(panel, h("h2", {}, "Red and blue paths"),
    h("datalist", { id: "hosts" }, ...hosts.slice(0, 5000).map((n) => h("option", { value: n }))),
    form, result, h("h3", {}, "Protection of every pair"), summary);
  await guarded(ctx, summary, async () => {
    const plan = await must(api.GET("/api/v1/plan"));
    replace(summary,
      h("div", { class: "counts" },
        h("div", {}, h("b", {}, plan.protected_pairs), badge("protected")),
        h("div", {}, h("b", {}, plan.shared_risk_pairs), badge("shared risk")),
        h("div", {}, h("b", {}, plan.unprotected_pairs), badge("unprotected"))),
      h("p", { class: "hint" }, `${plan.pairs} host pairs in plan ${plan.revision} ` +
        `(topology ${plan.topology_revision}); ${plan.unreachable_pairs} unreachable; ` +
        `${plan.pairs_sharing_switches} share a switch, ${plan.pairs_sharing_srlgs} an SRLG.`));
  });
  if (ctx.pair) await showPair(ctx, result);
}

async function showPair(ctx: Ctx, out: HTMLElement): Promise<void> {
  const pair = ctx.pair;
  if (!pair) return;
  loading(out, "paths");
  await guarded(ctx, out, async () => {
    const p = await must(api.GET("/api/v1/paths", { params: { query: pair } }));
    // The source sends red; it has flipped to blue when a red link is out of service.
    const broken = (links: number[]) => links.some((id) =>
      ["down", "flapping", "drained"].includes(ctx.map.linkState(id)));
    const active = p.red && broken(p.red.links) && p.blue && !broken(p.blue.links) ? "blue" : "red";
    ctx.map.showPaths(p.red?.links ?? [], p.blue?.links ?? [], p.red?.nodes ?? [],
      p.blue?.nodes ?? [], active);
    const route = (colour: "red" | "blue", r: Schemas["RouteOut"] | null | undefined) =>
      h("p", {}, h("span", { class: `route-${colour}` }, colour), active === colour ? " (active) " : " ",
        r ? r.nodes.join(" → ") : "no path", r ? h("span", { class: "hint" }, ` ${r.hops} hops`) : null);
    const risks = [
      ...p.shared.links.map((id) => `link ${linkName(ctx, id)}`),
      ...p.shared.switches.map((s) => `switch ${s}`),
      ...p.shared.srlgs.map((s) => `SRLG ${s}`),
    ];
    replace(out, h("p", {}, badge(p.status), ` plan ${p.plan_revision}`),
      route("red", p.red), route("blue", p.blue),
      h("p", {}, risks.length ? `Shared risks: ${risks.join("; ")}` : "Shared risks: none"));
  });
}

// --- what-if -----------------------------------------------------------------------------

export async function whatIfView(ctx: Ctx, panel: HTMLElement): Promise<void> {
  const chosen = ctx.whatIf;
  const names = chosen.map((s) => (s.kind === "node" ? s.name : linkName(ctx, s.id)));
  const selected = ctx.selection && (ctx.selection.kind === "node" ? ctx.selection.name
    : linkName(ctx, ctx.selection.id));
  // Drawn again only when what it shows changed: a refresh (a topology event, a stream
  // overflow) keeps the buttons under the user's pointer and a simulation's answer.
  const key = JSON.stringify([names, selected]);
  if (panel.querySelector<HTMLElement>("#whatif-heading")?.dataset.key === key) return;
  const result = h("div", { id: "whatif-result" });
  const add = ctx.selection && !chosen.some((s) => JSON.stringify(s) === JSON.stringify(ctx.selection))
    ? h("button", { type: "button", onclick: () => { ctx.whatIf = [...chosen, ctx.selection!];
        void whatIfView(ctx, panel); } },
      `Add ${selected}`)
    : null;
  replace(panel, h("h2", { id: "whatif-heading", "data-key": key }, "What if…"),
    h("p", { class: "hint" }, "Select links or switches on the map and add them. The " +
      "simulation runs on a copy of the plan: nothing in the fabric changes."),
    h("p", {}, names.length ? `Fail: ${names.join(", ")}` : "Nothing chosen yet."),
    h("div", { class: "inline" }, add,
      h("button", { type: "button", id: "simulate", disabled: !chosen.length,
        onclick: () => void simulate(ctx, result) }, "Simulate"),
      h("button", { type: "button", disabled: !chosen.length,
        onclick: () => { ctx.whatIf = []; ctx.map.clearMarks(); void whatIfView(ctx, panel); } },
        "Clear")),
    result);
}

async function simulate(ctx: Ctx, out: HTMLElement): Promise<void> {
  loading(out, "the simulation");
  await guarded(ctx, out, async () => {
    const link = ctx.whatIf.flatMap((s) => (s.kind === "link" ? [s.id] : []));
    const node = ctx.whatIf.flatMap((s) => (s.kind === "node" ? [s.name] : []));
    const r = await must(api.GET("/api/v1/plan/what-if", { params: { query: { link, node } } }));
    ctx.map.showFailed(r.links, r.nodes);
    const after = (k: string) => r.after[k] ?? 0;
    replace(out,
      h("div", { class: "counts" },
        h("div", {}, h("b", { id: "whatif-flip" }, r.flip), badge("flip"), h("br"), "active path cut: flip to blue"),
        h("div", {}, h("b", { id: "whatif-lose" }, r.lose_protection), badge("lose_protection"), h("br"), "backup lost"),
        h("div", {}, h("b", { id: "whatif-cut" }, r.cut), badge("cut"), h("br"), "both paths cut")),
      h("p", { class: "hint" }, `of ${r.pairs} pairs; ${r.links.length} links fail; ` +
        `computed in ${(r.compute_seconds * 1000).toFixed(0)} ms on plan ${r.plan_revision}.`),
      h("h3", {}, "After re-protection, the affected pairs are"),
      h("div", { class: "counts" }, ...["protected", "degraded", "unprotected", "unreachable"]
        .map((k) => h("div", {}, h("b", {}, after(k)), badge(k === "degraded" ? "shared risk" : k, k)))),
      h("h3", {}, "Some affected pairs"),
      table(["from", "to", "now", "after re-protection"],
        r.examples.map((e) => [e.src, e.dst, badge(e.verdict), badge(e.after)])));
  });
}

// --- failovers ---------------------------------------------------------------------------

export async function failoversView(ctx: Ctx, shell: HTMLElement): Promise<void> {
  const panel = ownContainer(shell);
  const detail = h("div", { id: "failover-detail" });
  loading(panel, "failovers");
  await guarded(ctx, panel, async () => {
    const page = await must(api.GET("/api/v1/failovers", { params: { query: { limit: 50 } } }));
    const rows = page.items.map((f) => {
      const verdicts = (f.rc_budget ?? []).map((b) => `${b.tenant}: ${b.status}`).join(", ");
      const row = h("tr", { class: "clickable", "data-failover": f.id,
        onclick: () => void failoverDetail(ctx, f.id, detail) },
        h("td", {}, when(f.started)), h("td", {}, badge(f.tier)),
        h("td", {}, f.link_id !== null && f.link_id !== undefined ? linkName(ctx, f.link_id) : "-"),
        h("td", {}, ms(f.gap_ms_upper_bound)), h("td", {}, ms(f.reprotected_ms)),
        h("td", {}, f.pairs_moved), h("td", {}, verdicts || "-"));
      return row;
    });
    replace(panel, h("h2", {}, `Failovers (${page.total})`),
      h("p", { class: "hint" }, "Newest first. Gap: upper bound of the traffic gap. " +
        "Click one for its hops and moved pairs."),
      h("table", { id: "failovers" },
        h("thead", {}, h("tr", {}, ...["started", "tier", "link", "gap", "re-protected",
          "pairs", "RC budget"].map((t) => h("th", {}, t)))),
        h("tbody", {}, ...rows)),
      detail);
  });
}

async function failoverDetail(ctx: Ctx, id: string, out: HTMLElement): Promise<void> {
  loading(out, "the failover");
  await guarded(ctx, out, async () => {
    const f = await must(api.GET("/api/v1/failovers/{failover_id}",
      { params: { path: { failover_id: id } } }));
    replace(out, h("h3", {}, `Failover ${f.id}`),
      h("p", {}, `${f.reason}; repaired by the ${f.tier} tier at ${f.sources.join(", ")}.`),
      h("h3", {}, "Hops"),
      table(["step", "at", "after", "clock"], f.hops.map((s) => [s.step, when(s.at), ms(s.ms),
        s.clocks_differ ? `${s.clock} (other clock)` : s.clock])),
      h("h3", {}, "Pairs moved"),
      table(["node", "peers", "from → to", "tier", "kernel"], f.moved.map((m) => [m.node,
        m.peers.join(", "), `${m.from_colour ?? "-"} → ${m.to_colour}`, m.tier, ms(m.kernel_ms)])),
      h("h3", {}, "RC budget"),
      f.rc_budget?.length ? table(["tenant", "verdict", "measured", "retry budget", ""],
        f.rc_budget.map((b) => [b.tenant, badge(b.status), ms(b.measured_ms),
          ms(b.budget.retry_budget_ms), b.summary])) : h("p", { class: "hint" },
        "No tenant's RC budget applies yet."));
  });
}

// --- link health -------------------------------------------------------------------------

export async function linksView(ctx: Ctx, panel: HTMLElement): Promise<void> {
  const sel = ctx.selection;
  if (sel?.kind === "link") return linkDetail(ctx, panel, sel.id);
  const bad = [...ctx.health.values()].filter((l) => l.state !== "up" || l.drained);
  replace(panel, h("h2", {}, "Link health"),
    h("p", { class: "hint" }, "Click a link on the map for its history and BFD sessions."),
    bad.length ? table(["link", "state", "since", "loss", "flap penalty"], bad.map((l) => [
      linkName(ctx, l.link_id), badge(l.drained ? "drained" : l.state), when(l.since),
      `${(l.loss * 100).toFixed(1)} %`, l.penalty.toFixed(0)])) :
      h("p", {}, `All ${ctx.health.size} links health knows of are up.`));
}

async function linkDetail(ctx: Ctx, shell: HTMLElement, id: number): Promise<void> {
  const panel = ownContainer(shell);
  loading(panel, "the link");
  await guarded(ctx, panel, async () => {
    const [health, events, sessions] = await Promise.all([
      must(api.GET("/api/v1/health/links/{link_id}", { params: { path: { link_id: id } } })),
      must(api.GET("/api/v1/health/events", { params: { query: { link_id: id, limit: 20 } } })),
      everything((offset, limit) => api.GET("/api/v1/health/sessions",
        { params: { query: { offset, limit } } })),
    ]);
    const own = sessions.filter((s) => s.link_id === id);
    replace(panel, h("h2", {}, `Link ${linkName(ctx, id)}`),
      h("dl", {},
        h("dt", {}, "state"), h("dd", { id: "link-state" }, badge(health.drained ? "drained" : health.state)),
        h("dt", {}, "since"), h("dd", {}, when(health.since)),
        h("dt", {}, "loss"), h("dd", {}, `${(health.loss * 100).toFixed(1)} %`),
        h("dt", {}, "flap penalty"), h("dd", {}, `${health.penalty.toFixed(0)}${health.suppressed
          ? ` (suppressed, reuse in ${health.reuse_in_s?.toFixed(0)} s)` : ""}`),
        h("dt", {}, "sources"), h("dd", {}, Object.entries(health.sources)
          .map(([k, v]) => `${k}: ${String(v)}`).join(", ") || "-"),
        h("dt", {}, "open failure"), h("dd", {}, health.open_failure ?? "-")),
      drainControls(ctx, "link", String(id), ctx.links.get(id)?.admin_state ?? "up"),
      h("h3", {}, "Drops and errors over time"),
      countersChart(health.counters),
      h("h3", {}, "Failures over time"),
      events.items.length ? table(["state", "source", "started", "detected in", "lasted"],
        events.items.map((e) => [badge(e.state), e.source, when(e.started_at),
          ms(e.detection_latency_ms), e.duration_s === null || e.duration_s === undefined
            ? "ongoing" : `${e.duration_s.toFixed(2)} s`])) : h("p", { class: "hint" }, "None recorded."),
      h("h3", {}, "BFD sessions"),
      own.length ? table(["node", "local → peer", "state", "diag", "timers (negotiated)"],
        own.map((s) => [s.node, `${s.local} → ${s.peer}`, badge(s.state), s.diag,
          s.tx_interval_ms ? `${s.tx_interval_ms} ms × ${Math.round((s.detect_time_ms ?? 0) /
            s.tx_interval_ms)}, detects in ${s.detect_time_ms} ms` : "-"]))
        : h("p", { class: "hint" }, "No agent reports a BFD session on this link."));
  });
}

/** Drops and errors per report interval, per end: one bar each, newest on the right. */
function countersChart(samples: Schemas["CounterSampleOut"][]): HTMLElement {
  if (!samples.length) return h("p", { class: "hint" }, "No counter reports yet.");
  const bad = (c: Schemas["CounterSampleOut"]) => c.rx_dropped + c.tx_dropped + c.rx_errors + c.tx_errors;
  const top = Math.max(1, ...samples.map(bad));
  const width = 400, height = 60, step = width / samples.length;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", "100%");
  svg.setAttribute("id", "counters-chart");
  const ports = [...new Set(samples.map((c) => c.port))];
  samples.forEach((c, i) => {
    const bar = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const tall = Math.max(bad(c) ? 2 : 0, (bad(c) / top) * (height - 4));
    bar.setAttribute("x", String(i * step));
    bar.setAttribute("y", String(height - tall));
    bar.setAttribute("width", String(Math.max(1, step - 1)));
    bar.setAttribute("height", String(tall));
    bar.setAttribute("fill", ports.indexOf(c.port) ? "#1d4ed8" : "#e76f51");
    const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
    title.textContent = `${c.port} ${when(c.at)}: ${c.rx_dropped + c.tx_dropped} dropped, ` +
      `${c.rx_errors + c.tx_errors} errors of ${c.rx_packets + c.tx_packets} packets in ${c.seconds.toFixed(0)} s`;
    bar.append(title);
    svg.append(bar);
  });
  const total = samples.reduce((s, c) => s + bad(c), 0);
  return h("div", {}, svg, h("p", { class: "hint" }, `${total} drops and errors in the last ` +
    `${samples.length} report intervals (${ports.map((p, i) => `${p} ${i ? "blue" : "orange"}`)
      .join(", ")}); the highest bar is ${top}.`));
}

// --- node --------------------------------------------------------------------------------

export async function nodeView(ctx: Ctx, shell: HTMLElement): Promise<void> {
  const sel = ctx.selection;
  if (sel?.kind !== "node") {
    replace(shell, h("h2", {}, "Node"), h("p", { class: "hint" }, "Click a node on the map."));
    return;
  }
  const panel = ownContainer(shell);
  loading(panel, sel.name);
  await guarded(ctx, panel, async () => {
    const o = await must(api.GET("/api/v1/nodes/{name}/observed",
      { params: { path: { name: sel.name } } }));
    const a = o.applied;
    const off = a?.offload;
    replace(panel, h("h2", {}, `${o.declared.role} ${o.node}`),
      h("dl", {},
        h("dt", {}, "admin state"), h("dd", {}, badge(o.declared.admin_state)),
        h("dt", {}, "agent"), h("dd", { id: "agent-status" }, o.registered
          ? badge(`registered ${when(o.received_at)}`, "ok") : badge("not registered", "error")),
        h("dt", {}, "driver"), h("dd", {}, a?.driver ?? "-"),
        h("dt", {}, "applied"), h("dd", { id: "applied" }, a ? `plan ${a.plan_revision}, key ` +
          `${a.key_revision}, ${a.changes} changes in ${(a.seconds * 1000).toFixed(0)} ms at ${when(a.at)}` : "-"),
        h("dt", {}, "errors"), h("dd", {}, a?.errors?.length ? a.errors.join("; ") : "none"),
        h("dt", {}, "offload"), h("dd", {}, off ? `${off.mode} (policy ${off.policy})` +
          `${off.reason ? `: ${off.reason}` : ""}; ${off.filters} filters, ${off.in_hw} in hardware` : "-"),
        h("dt", {}, "mismatches"), h("dd", {}, o.mismatches.length
          ? o.mismatches.map((m) => m.message).join("; ") : "none")),
      drainControls(ctx, "node", o.node, o.declared.admin_state));
  });
}

// --- drain and undrain -------------------------------------------------------------------

const WATCH_MS = 500;
const WATCH_FOR_MS = 120_000;

function drainControls(ctx: Ctx, kind: "link" | "node", element: string, admin: string): HTMLElement {
  const status = h("p", { id: "drain-status" });
  const act = async (drain: boolean) => {
    try {
      if (kind === "link") {
        const path = { link_id: Number(element) };
        await must(drain ? api.POST("/api/v1/links/{link_id}/drain", { params: { path } })
          : api.POST("/api/v1/links/{link_id}/undrain", { params: { path } }));
      } else {
        const path = { name: element };
        await must(drain ? api.POST("/api/v1/nodes/{name}/drain", { params: { path } })
          : api.POST("/api/v1/nodes/{name}/undrain", { params: { path } }));
      }
      ctx.say(`${drain ? "Draining" : "Undraining"} ${kind} ${element}.`, true);
      void watchDrain(kind, element, status);
    } catch (err) {
      ctx.say(err instanceof ApiError ? err.message : String(err));
    }
  };
  const allowed = ctx.can("operator");
  const why = allowed ? undefined : "needs an operator or admin token";
  void watchDrain(kind, element, status);
  return h("div", {},
    h("h3", {}, "Maintenance"),
    h("div", { class: "inline" },
      h("button", { type: "button", id: "drain", "data-needs": "operator", disabled: !allowed || admin === "drained",
        title: why, onclick: () => void act(true) }, `Drain ${kind}`),
      h("button", { type: "button", id: "undrain", "data-needs": "operator", disabled: !allowed || admin !== "drained",
        title: why, onclick: () => void act(false) }, `Undrain ${kind}`)),
    status);
}

/** Show whether it carries traffic, polling while a drain or undrain is under way; stops
 * when it settles (drained and empty, or up and in service) or leaves the panel. */
async function watchDrain(kind: "link" | "node", element: string, out: HTMLElement): Promise<void> {
  for (let i = 0; i < WATCH_FOR_MS / WATCH_MS; i++) {
    if (i > 0 && !out.isConnected) return;
    try {
      const s = kind === "link"
        ? await must(api.GET("/api/v1/drains/links/{link_id}", { params: { path: { link_id: Number(element) } } }))
        : await must(api.GET("/api/v1/drains/nodes/{name}", { params: { path: { name: element } } }));
      replace(out, "Carries traffic: ", h("b", { id: "carries-traffic" }, s.carries_traffic ? "yes" : "no"),
        h("span", { class: "hint" }, ` (${s.routes_through.total} routes cross it; plan ` +
          `${s.plan_revision}${s.agents_pending.length ? `; waiting for ${s.agents_pending.length} agents`
            : ""}${s.replanning ? "; replanning" : ""})`));
      if (!s.carries_traffic && s.admin_state === "drained") return;
      if (s.in_service && s.admin_state === "up") return;
    } catch (err) {
      replace(out, err instanceof ApiError ? err.message : String(err));
      return;
    }
    await new Promise((r) => setTimeout(r, WATCH_MS));
  }
}
