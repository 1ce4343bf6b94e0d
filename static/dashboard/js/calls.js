// Call wall: requests in flight with live progress, then the latest finished.

import {
  $,
  badge,
  clock,
  duration,
  fillRows,
  frameScheduler,
  h,
  int,
  MODE_TONES,
  money,
  num,
  routeText,
  shortId,
  STATE_TONES,
} from "./dom.js";

const RECENT = 20;

export function mountCalls(state) {
  const inFlightBody = $("calls-in-flight").tBodies[0];
  const recentBody = $("calls-recent").tBodies[0];
  const counter = $("in-flight-count");
  let elapsed = []; // [cell, call] pairs ticking every second

  const draw = () => {
    const calls = [...state.calls.values()];
    const inFlight = calls
      .filter((c) => c.state === "processing")
      .sort((a, b) => a.started_at - b.started_at);
    const recent = calls
      .filter((c) => c.state !== "processing")
      .sort((a, b) => finishedAt(b) - finishedAt(a))
      .slice(0, RECENT);
    elapsed = [];
    fillRows(
      inFlightBody,
      inFlight.map((call) => inFlightRow(state, call, elapsed)),
      $("calls-in-flight-empty"),
    );
    fillRows(recentBody, recent.map(recentRow), $("calls-recent-empty"));
    counter.hidden = inFlight.length === 0;
    counter.textContent = String(inFlight.length);
  };
  state.on("calls", frameScheduler(draw));
  setInterval(() => {
    for (const [cell, call] of elapsed) cell.textContent = duration(state.now() - call.started_at);
  }, 1000);
}

function finishedAt(call) {
  return call.finished_at || call.updated_at || call.started_at || 0;
}

function routeCell(call) {
  return h("td", { title: call.route || "" }, h("span", { class: "ellipsis mono" }, routeText(call.route)));
}

function modeCell(call) {
  return h("td", {}, call.mode ? badge(call.mode, MODE_TONES[call.mode]) : "—");
}

function inFlightRow(state, call, elapsed) {
  const cell = h("td", { class: "num" }, duration(state.now() - call.started_at));
  elapsed.push([cell, call]);
  return h(
    "tr",
    { dataset: { requestId: call.request_id, state: call.state } },
    h("td", {}, h("code", { title: call.request_id }, shortId(call.request_id))),
    h("td", {}, call.model || "—"),
    h("td", { dataset: { field: "api" } }, call.api || "—"),
    routeCell(call),
    modeCell(call),
    h("td", { class: "num", dataset: { field: "tokens" } }, int(call.tokens)),
    h("td", { class: "num" }, num(call.tokens_per_second)),
    cell,
  );
}

// The prompt tokens its route took from the nodes' prefix caches (billed at the cached price).
function cachedNote(call) {
  if (!call.cached_tokens) return null;
  return h(
    "span",
    { class: "muted", title: `of ${int(call.prompt_tokens)} prompt tokens, ${int(call.cached_tokens)} reused from the nodes' prefix caches` },
    ` · ${int(call.cached_tokens)} cached`,
  );
}

function recentRow(call) {
  const state = h("td", {}, badge(call.state, STATE_TONES[call.state], call.error || call.finish_reason));
  if (call.error) state.append(" ", h("span", { class: "error-text" }, call.error));
  return h(
    "tr",
    { dataset: { requestId: call.request_id, state: call.state } },
    h("td", { class: "num" }, clock(finishedAt(call))),
    h("td", {}, h("code", { title: call.request_id }, shortId(call.request_id))),
    h("td", { dataset: { field: "api" } }, call.api || "—"),
    routeCell(call),
    modeCell(call),
    state,
    h("td", { class: "num", dataset: { field: "tokens" } }, int(call.tokens), cachedNote(call)),
    h("td", { class: "num" }, num(call.tokens_per_second)),
    h("td", { class: "num", dataset: { field: "cost" } }, money(call.cost)),
  );
}
