// The THORN dashboard: sign in with a token, then the fabric map beside the views, kept
// live by the bus's events (GET /api/v1/events through the entry point).
import "./style.css";
import { api, ApiError, everything, must, role, setRole, token } from "./api";
import { h, replace } from "./dom";
import { follow, type Kind } from "./events";
import { FabricMap, HEALTH_COLOURS, type Selection } from "./map";
import { type Ctx, failoversView, linksView, nodeView, pathsView, whatIfView } from "./views";

type Tab = "paths" | "whatif" | "failovers" | "links" | "node";
const VIEWS: Record<Tab, (ctx: Ctx, panel: HTMLElement) => Promise<void>> = {
  paths: pathsView, whatif: whatIfView, failovers: failoversView, links: linksView, node: nodeView,
};

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const panel = $<HTMLDivElement>("panel");
const message = $<HTMLDivElement>("message");
let tab: Tab = "paths";

function say(text: string, ok = false): void {
  message.textContent = text;
  message.className = ok ? "ok" : "";
  message.hidden = false;
  if (ok) window.setTimeout(() => { if (message.textContent === text) message.hidden = true; }, 4000);
}

const RANK = ["viewer", "operator", "admin"];

const ctx: Ctx = {
  map: new FabricMap($("map"), (what) => select(what)),
  nodes: new Map(),
  links: new Map(),
  health: new Map(),
  selection: null,
  pair: null,
  whatIf: [],
  say,
  select: (what) => select(what),
  can: (needed) => RANK.indexOf(role) >= RANK.indexOf(needed),
};

function select(what: Selection | null): void {
  ctx.selection = what;
  if (what) ctx.map.select(what);
  if (what && tab !== "whatif") show(what.kind === "node" ? "node" : "links");
  else render();
}

function show(next: Tab): void {
  tab = next;
  for (const b of document.querySelectorAll<HTMLButtonElement>("#tabs button")) {
    b.classList.toggle("current", b.dataset.tab === tab);
  }
  if (tab !== "paths" && tab !== "whatif") ctx.map.clearMarks();
  render();
}

function render(): void {
  void VIEWS[tab](ctx, panel);
}

// --- loading state -----------------------------------------------------------------------

async function loadFabric(): Promise<void> {
  const [nodes, links] = await Promise.all([
    everything((offset, limit) => api.GET("/api/v1/nodes", { params: { query: { offset, limit } } })),
    everything((offset, limit) => api.GET("/api/v1/links", { params: { query: { offset, limit } } })),
  ]);
  ctx.nodes = new Map(nodes.map((n) => [n.name, n]));
  ctx.links = new Map(links.map((l) => [l.id, l]));
  ctx.map.load(nodes, links);
}

async function loadHealth(): Promise<void> {
  const items = await everything((offset, limit) =>
    api.GET("/api/v1/health/links", { params: { query: { offset, limit } } }));
  ctx.health = new Map(items.map((l) => [l.link_id, l]));
  for (const l of items) ctx.map.setLinkHealth(l.link_id, l.state);
}

async function loadSummary(): Promise<void> {
  const summary = $("summary");
  try {
    const [fabric, plan] = await Promise.all([
      must(api.GET("/api/v1/fabric/summary")),
      must(api.GET("/api/v1/plan")),
    ]);
    replace(summary, h("span", {}, `${fabric.switches} switches, ${fabric.hosts} hosts`),
      h("span", {}, `plan ${plan.revision}: ${plan.protected_pairs} protected, ` +
        `${plan.shared_risk_pairs} shared risk, ${plan.unprotected_pairs} unprotected pairs`));
  } catch (err) {
    replace(summary, err instanceof ApiError ? err.message : String(err));
  }
}

// --- live events -------------------------------------------------------------------------

const pending = new Map<string, number>();
function soon(key: string, work: () => void, ms = 300): void {
  if (pending.has(key)) return;
  pending.set(key, window.setTimeout(() => { pending.delete(key); work(); }, ms));
}

let seen = 0;
function onEvent(kind: Kind, data: Record<string, unknown>): void {
  seen += 1;
  document.body.dataset.events = String(seen);
  switch (kind) {
    case "health": {
      const id = Number(data.link_id);
      const state = String(data.state);
      ctx.map.setLinkHealth(id, state);
      const known = ctx.health.get(id);
      if (known) ctx.health.set(id, { ...known, state });
      if (tab === "links") soon("links", render);
      soon("health", () => void loadHealth(), 1000); // penalties, loss, drained flags
      break;
    }
    case "failover":
      if (tab === "failovers") soon("failovers", render, 500);
      break;
    case "paths":
      soon("summary", () => void loadSummary());
      if (tab === "paths") soon("paths", render, 500);
      break;
    case "topology":
      soon("fabric", () => void loadFabric().then(render).catch((e) => say(String(e))), 500);
      soon("summary", () => void loadSummary());
      break;
    case "applied":
      if (tab === "node" && ctx.selection?.kind === "node" && data.node === ctx.selection.name) {
        soon("node", render, 500);
      }
      break;
    case "overflow":
      soon("all", () => void refreshAll(), 1000); // at most one whole re-read a second
      break;
  }
}

async function refreshAll(): Promise<void> {
  await loadFabric();
  await Promise.all([loadHealth(), loadSummary()]);
  render();
}

// --- sign-in -----------------------------------------------------------------------------

let stream: AbortController | null = null;

async function signIn(): Promise<boolean> {
  try {
    const me = await must(api.GET("/api/v1/whoami"));
    setRole(me.role);
    document.body.dataset.role = me.role;
    $("who").textContent = `${me.name} (${me.role})`;
    for (const el of document.querySelectorAll<HTMLButtonElement>("header [data-needs]")) {
      el.disabled = !ctx.can(el.dataset.needs as "operator" | "admin");
      el.title = el.disabled ? `needs an ${el.dataset.needs} token` : "";
    }
    return true;
  } catch (err) {
    $("signin-error").textContent = err instanceof ApiError ? err.message : String(err);
    return false;
  }
}

function askForToken(): void {
  const dialog = $<HTMLDialogElement>("signin");
  if (!dialog.open) dialog.showModal();
}

async function start(): Promise<void> {
  if (!token.get() || !(await signIn())) {
    askForToken();
    return;
  }
  $<HTMLDialogElement>("signin").close();
  stream?.abort();
  stream = new AbortController();
  void follow(onEvent, (live) => {
    const badge = $("live");
    badge.textContent = live ? "live" : "offline";
    badge.className = `live ${live ? "on" : "off"}`;
    if (live) void refreshAll().catch((e) => say(e instanceof ApiError ? e.message : String(e)));
  }, stream.signal);
  show(tab);
}

$("signin-form").addEventListener("submit", (e) => {
  e.preventDefault();
  token.set($<HTMLInputElement>("token").value);
  void start();
});
$("signout").addEventListener("click", () => {
  token.clear();
  stream?.abort();
  location.reload();
});
$("recompute").addEventListener("click", async () => {
  try {
    const plan = await must(api.POST("/api/v1/plan/recompute"));
    say(`Recomputed: plan ${plan.revision} in ${plan.compute_seconds.toFixed(2)} s.`, true);
  } catch (err) {
    say(err instanceof ApiError ? err.message : String(err));
  }
});
for (const b of document.querySelectorAll<HTMLButtonElement>("#tabs button")) {
  b.addEventListener("click", () => show(b.dataset.tab as Tab));
}
replace($("legend"), ...Object.entries(HEALTH_COLOURS).map(([state, colour]) =>
  h("span", {}, h("i", { style: `background:${colour}` }), state)));

// For the console and the browser tests: the map's graph.
(window as unknown as { thorn: unknown }).thorn = { cy: ctx.map.cy, ctx };
void start();
