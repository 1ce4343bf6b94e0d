// Small DOM and formatting helpers shared by the tabs. Text from the network
// (node endpoints, device names, model output) only ever goes in as text.

/** h("td", {class: "num"}, "12") → <td class="num">12</td>; attrs may hold dataset {}. */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "dataset") Object.assign(node.dataset, value);
    else if (name === "style") Object.assign(node.style, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export const $ = (role, root = document) => root.querySelector(`[data-role="${role}"]`);

/** Replace a table body's rows; shows the matching "empty" note when there are none. */
export function fillRows(tbody, rows, emptyNote = null) {
  tbody.replaceChildren(...rows);
  if (emptyNote) emptyNote.hidden = rows.length > 0;
}

export function badge(text, tone = null, title = null) {
  return h("span", { class: "badge", dataset: tone ? { tone } : {}, title }, text);
}

export function num(value, digits = 1) {
  if (value === null || value === undefined || Number.isNaN(value)) return "—";
  return Number(value).toLocaleString(undefined, {
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  });
}

export function int(value) {
  if (value === null || value === undefined) return "—";
  return Number(value).toLocaleString();
}

export function pct(value) {
  if (value === null || value === undefined) return "—";
  return `${(value * 100).toFixed(value >= 0.1 || value === 0 ? 0 : 1)}%`;
}

/** Money arrives as a decimal string: shown as is, never through a float. */
export function money(value) {
  return value === null || value === undefined ? "—" : value;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || seconds < 0) return "—";
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

export function clock(unixSeconds) {
  if (!unixSeconds) return "—";
  return new Date(unixSeconds * 1000).toLocaleTimeString();
}

export function shortId(id) {
  return id ? String(id).slice(0, 8) : "—";
}

/** A route's hops as chips: node[start-end] → node[start-end]. */
export function hopsView(hops) {
  const parts = [];
  hops.forEach((hop, index) => {
    if (index) parts.push(h("span", { class: "hop-arrow", "aria-hidden": "true" }, "→"));
    parts.push(
      h(
        "span",
        { class: "hop", title: `${hop.node_id} at ${hop.endpoint}` },
        `${hop.node_id}[${hop.start_layer}-${hop.end_layer}]`,
      ),
    );
  });
  return h("span", { class: "hops" }, parts);
}

/** The hop part of a signature ("model | a[0-1] -> b[2-3]" → "a[0-1] → b[2-3]"). */
export function routeText(signature) {
  if (!signature) return "—";
  const bar = signature.indexOf(" | ");
  return (bar >= 0 ? signature.slice(bar + 3) : signature).replaceAll(" -> ", " → ");
}

export const MODE_TONES = { exploit: "ok", scout: "info", pinned: "warn", "greedy-fallback": null };
export const STATE_TONES = {
  processing: "info",
  completed: "ok",
  failed: "bad",
  cancelled: "warn",
  partial: "warn",
  online: "ok",
  draining: "warn",
  offline: null,
  silent: "warn",
  banned: "bad",
  proven: "ok",
  unsampled: null,
  stale: "warn",
  decayed: "warn",
  quarantined: "bad",
};

/** Coalesces many change notifications into one call per animation frame. */
export function frameScheduler(render) {
  let queued = false;
  return () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      render();
    });
  };
}
