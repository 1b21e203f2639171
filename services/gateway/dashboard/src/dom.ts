// A few DOM helpers: the dashboard is plain TypeScript, no framework.

type Child = Node | string | number | null | undefined | false;

/** An element with attributes (`on*` functions become listeners) and children. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, unknown> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value as EventListener);
    } else if (key === "class") {
      el.className = String(value);
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** A table: header names and rows of cells. */
export function table(head: string[], rows: Child[][], attrs: Record<string, unknown> = {}) {
  return h("table", attrs,
    h("thead", {}, h("tr", {}, ...head.map((t) => h("th", {}, t)))),
    h("tbody", {}, ...rows.map((r) => h("tr", {}, ...r.map((c) => h("td", {}, c))))),
  );
}

export function badge(text: string, kind = text): HTMLElement {
  return h("span", { class: `badge ${kind.replace(/[^a-z_]/gi, "-")}` }, text);
}

export function when(at: string | null | undefined): string {
  if (!at) return "-";
  const d = new Date(at);
  return Number.isNaN(d.getTime()) ? at : d.toLocaleTimeString(undefined, { hour12: false }) +
    `.${String(d.getMilliseconds()).padStart(3, "0")}`;
}

export function ms(value: number | null | undefined): string {
  return value === null || value === undefined ? "-" : `${value.toFixed(1)} ms`;
}

export function replace(target: HTMLElement, ...children: Child[]): void {
  target.replaceChildren(...children.filter((c): c is Node | string | number =>
    c !== null && c !== undefined && c !== false).map((c) => (c instanceof Node ? c : String(c))));
}
