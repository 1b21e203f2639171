// The fabric map: Cytoscape.js on a preset tiered layout (tiers.ts), links and nodes
// coloured by health, red and blue paths highlighted with the active one animated, and the
// elements of a what-if marked.
import cytoscape, { type Core, type ElementDefinition } from "cytoscape";
import type { Schemas } from "./api";
import { layout } from "./tiers";

export type Health = "up" | "degraded" | "down" | "flapping" | "drained" | "unknown";
export type Selection = { kind: "node"; name: string } | { kind: "link"; id: number };

export const HEALTH_COLOURS: Record<Health, string> = {
  up: "#52b788",
  degraded: "#f4a261",
  down: "#d62828",
  flapping: "#9d4edd",
  drained: "#4895ef",
  unknown: "#adb5bd",
};

const STYLE: cytoscape.StylesheetJson = [
  {
    selector: "node",
    style: {
      width: 16,
      height: 16,
      "background-color": "#334e68",
      "border-width": 3,
      "border-color": "data(colour)",
      label: "data(id)",
      "font-size": 9,
      "text-valign": "top",
      "text-margin-y": -3,
      color: "#243b53",
      "min-zoomed-font-size": 7,
    },
  },
  { selector: "node[role = 'host']", style: { shape: "round-rectangle", width: 10, height: 10,
    "background-color": "#829ab1", "border-width": 2, "font-size": 6 } },
  { selector: "node[state = 'drained']", style: { "border-style": "dashed" } },
  {
    selector: "edge",
    style: {
      width: 1.5,
      "line-color": "data(colour)",
      "curve-style": "straight",
      opacity: 0.75,
    },
  },
  { selector: "edge[state = 'drained']", style: { "line-style": "dashed" } },
  { selector: "edge[state = 'down'], edge[state = 'flapping']", style: { width: 3, opacity: 1 } },
  { selector: ".dim", style: { opacity: 0.15 } },
  { selector: "edge.red, edge.blue", style: { width: 5, opacity: 1, "z-index": 10 } },
  { selector: "edge.red", style: { "line-color": "#e63946" } },
  { selector: "edge.blue", style: { "line-color": "#1d4ed8" } },
  { selector: "edge.red.blue", style: { "line-color": "#7b2cbf" } },
  { selector: "edge.active", style: { "line-style": "dashed", "line-dash-pattern": [10, 5] } },
  { selector: "node.red, node.blue", style: { "border-color": "#111", "z-index": 10 } },
  { selector: ".failed", style: { "line-color": "#111", "background-color": "#111",
    "border-color": "#d62828", width: 6, opacity: 1, "z-index": 20 } },
  { selector: ":selected", style: { "overlay-color": "#ffd166", "overlay-opacity": 0.45,
    "overlay-padding": 4 } },
];

const linkKey = (id: number) => `l${id}`;

export class FabricMap {
  readonly cy: Core;
  private structure = "";
  private dash = 0;
  private linkHealth = new Map<number, Health>();

  constructor(container: HTMLElement, onSelect: (what: Selection | null) => void) {
    this.cy = cytoscape({
      container,
      style: STYLE,
      layout: { name: "preset" },
      minZoom: 0.02,
      maxZoom: 4,
      boxSelectionEnabled: false,
      // Big fabrics: draw a texture while panning and zooming, full detail when still.
      textureOnViewport: true,
      hideEdgesOnViewport: true,
      pixelRatio: 1,
    });
    this.cy.on("tap", "node", (e) => onSelect({ kind: "node", name: e.target.id() }));
    this.cy.on("tap", "edge", (e) => onSelect({ kind: "link", id: e.target.data("link") }));
    this.cy.on("tap", (e) => {
      if (e.target === this.cy) onSelect(null);
    });
    // The active path's dashes march toward the destination (ONOS's protected-intent view).
    window.setInterval(() => {
      const active = this.cy.edges(".active");
      if (active.nonempty()) active.style("line-dash-offset", -(this.dash = (this.dash + 3) % 150));
    }, 60);
  }

  /** Show the fabric; the same nodes and links again only update their states in place. */
  load(nodes: Schemas["Node"][], links: Schemas["Link"][]): void {
    const shape = nodes.map((n) => n.name).join(",") + "|" +
      links.map((l) => `${l.id}:${l.a.node}-${l.b.node}`).join(",");
    if (shape !== this.structure) {
      this.structure = shape;
      const places = layout(
        nodes.map((n) => ({ name: n.name, role: n.role })),
        links.map((l) => ({ a: l.a.node, b: l.b.node })),
      );
      const elements: ElementDefinition[] = nodes.map((n) => ({
        group: "nodes",
        data: { id: n.name, role: n.role, tier: places.get(n.name)?.tier ?? 0,
          state: "unknown", colour: HEALTH_COLOURS.unknown },
        position: { x: places.get(n.name)?.x ?? 0, y: places.get(n.name)?.y ?? 0 },
      }));
      for (const l of links) {
        elements.push({
          group: "edges",
          data: { id: linkKey(l.id), link: l.id, source: l.a.node, target: l.b.node,
            state: "unknown", colour: HEALTH_COLOURS.unknown },
        });
      }
      this.cy.batch(() => {
        this.cy.elements().remove();
        this.cy.add(elements);
      });
      this.cy.fit(undefined, 20);
    }
    const admin = new Map(links.map((l) => [l.id, l.admin_state]));
    this.cy.batch(() => {
      for (const n of nodes) this.cy.getElementById(n.name).data("admin", n.admin_state);
      for (const [id, state] of admin) this.paintLink(id, state);
      this.cy.nodes().forEach((n) => this.paintNode(n.id()));
    });
  }

  /** A node: drained or down as its admin state says; else down when none of its links
   * works, degraded when some do not, up when all do (unknown until health reports). */
  private paintNode(name: string): void {
    const node = this.cy.getElementById(name);
    const admin = node.data("admin");
    let state: Health;
    if (admin === "drained" || admin === "down") {
      state = admin;
    } else {
      const links = node.connectedEdges().map((e) => e.data("state") as Health);
      const broken = links.filter((s) => s === "down" || s === "flapping").length;
      state = links.every((s) => s === "unknown") ? "unknown" : broken === links.length ? "down"
        : broken || links.some((s) => s === "degraded") ? "degraded" : "up";
    }
    node.data({ state, colour: HEALTH_COLOURS[state] });
  }

  private paintLink(id: number, admin?: string): void {
    const edge = this.cy.getElementById(linkKey(id));
    if (edge.empty()) return;
    const adminState = admin ?? edge.data("admin");
    const health = this.linkHealth.get(id) ?? "unknown";
    const state: Health = adminState === "drained" ? "drained" :
      adminState === "down" ? "down" : health;
    edge.data({ admin: adminState, state, colour: HEALTH_COLOURS[state] });
  }

  /** Health's view of a link (from GET /health/links or a `health` event). */
  setLinkHealth(id: number, state: string): void {
    const known: Health[] = ["up", "degraded", "down", "flapping", "drained", "unknown"];
    this.linkHealth.set(id, known.includes(state as Health) ? (state as Health) : "unknown");
    this.paintLink(id);
    this.cy.getElementById(linkKey(id)).connectedNodes().forEach((n) => this.paintNode(n.id()));
  }

  linkState(id: number): Health {
    return (this.cy.getElementById(linkKey(id)).data("state") as Health) ?? "unknown";
  }

  /** Red and blue routes; `active` is the colour the source sends on now. */
  showPaths(red: number[], blue: number[], redNodes: string[], blueNodes: string[],
            active: "red" | "blue"): void {
    this.clearMarks();
    this.cy.batch(() => {
      this.cy.elements().addClass("dim");
      for (const [colour, ids, nodes] of [["red", red, redNodes], ["blue", blue, blueNodes]] as const) {
        for (const id of ids) {
          const edge = this.cy.getElementById(linkKey(id));
          edge.removeClass("dim").addClass(colour);
          if (colour === active) edge.addClass("active");
        }
        for (const n of nodes) this.cy.getElementById(n).removeClass("dim").addClass(colour);
      }
    });
  }

  /** Mark what a what-if fails. */
  showFailed(links: number[], nodes: string[]): void {
    this.clearMarks();
    this.cy.batch(() => {
      for (const id of links) this.cy.getElementById(linkKey(id)).addClass("failed");
      for (const n of nodes) this.cy.getElementById(n).addClass("failed");
    });
  }

  clearMarks(): void {
    this.cy.batch(() => {
      this.cy.elements().removeClass("dim red blue active failed");
      this.cy.edges().removeStyle("line-dash-offset");
    });
  }

  select(what: Selection): void {
    const id = what.kind === "node" ? what.name : linkKey(what.id);
    this.cy.elements().unselect();
    const el = this.cy.getElementById(id);
    el.select();
    if (el.nonempty()) this.cy.animate({ center: { eles: el } }, { duration: 200 });
  }
}
