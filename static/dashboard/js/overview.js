// Overview: per model, the layer-coverage bar and the nodes table, live.

import { $, badge, duration, frameScheduler, h, int, num, pct, shortId, STATE_TONES } from "./dom.js";

export function mountOverview(state) {
  const root = $("models");
  let ages = []; // [cell, node] pairs whose "last heartbeat" text ticks every second

  const draw = () => {
    ages = [];
    const cards = [...state.models.values()].map((model) => modelCard(state, model, ages));
    root.replaceChildren(...cards);
    if (!cards.length) root.append(h("p", { class: "muted" }, "The catalogue has no model yet."));
  };
  state.on("models", frameScheduler(draw));

  // Ages and "silent" states move with the clock, not with messages.
  setInterval(() => {
    let changed = false;
    for (const [cell, node] of ages) {
      cell.textContent = age(state, node);
      const row = cell.closest("tr");
      if (row && row.dataset.state !== state.nodeState(node)) changed = true;
    }
    if (changed) draw();
  }, 1000);
}

function age(state, node) {
  return `${duration(Math.max(0, state.now() - node.last_heartbeat_at))} ago`;
}

function modelCard(state, model, ages) {
  const nodes = state.modelNodes(model.key);
  const gaps = state.gaps(model.key);
  const online = nodes.filter((n) => n.status === "online").length;
  const serving = online > 0 && gaps.length === 0;
  const reason = model.epoch_reason ? ` (${model.epoch_reason})` : "";
  return h(
    "section",
    { class: "card", dataset: { model: model.key } },
    h(
      "div",
      { class: "card-head" },
      h("h2", {}, model.key),
      h(
        "span",
        { class: "muted" },
        `${model.display_name} · ${model.num_layers} layers · epoch ${model.epoch}${reason}`,
      ),
      serving
        ? badge("every layer served", "ok")
        : badge(online ? "layers missing" : "no node online", "bad"),
    ),
    coverage(state, model, nodes, gaps),
    stagesTable(state.stages(model.key), gaps),
    nodes.length
      ? h("div", { class: "table-scroll" }, nodesTable(state, nodes, ages))
      : h("p", { class: "muted empty" }, "No node serves this model."),
  );
}

function coverage(state, model, nodes, gaps) {
  const columns = `repeat(${model.num_layers}, minmax(0, 1fr))`;
  const lane = (...segments) =>
    h("div", { class: "coverage-lane", style: { gridTemplateColumns: columns } }, segments);
  const span = (first, last) => ({ gridColumn: `${first + 1} / ${last + 2}` });
  const range = (first, last) => (first === last ? `${first}` : `${first}–${last}`);

  const lanes = nodes.map((node) => {
    const nodeState = state.nodeState(node);
    return lane(
      h(
        "div",
        {
          class: "coverage-seg",
          style: span(node.shard_start, node.shard_end),
          dataset: { state: nodeState, nodeId: node.id },
          title: `${node.id} · layers ${range(node.shard_start, node.shard_end)} · ${nodeState}`,
        },
        `${shortId(node.id)} ${range(node.shard_start, node.shard_end)}`,
      ),
    );
  });

  // The summary lane: served stretches and, in red, the layers nobody serves.
  const summary = [];
  let next = 0;
  for (const [first, last] of gaps) {
    if (first > next) summary.push(servedSegment(next, first - 1));
    summary.push(
      h(
        "div",
        {
          class: "coverage-seg",
          dataset: { kind: "gap" },
          style: span(first, last),
          title: `no online node serves layers ${range(first, last)}`,
        },
        `gap ${range(first, last)}`,
      ),
    );
    next = last + 1;
  }
  if (next < model.num_layers) summary.push(servedSegment(next, model.num_layers - 1));

  function servedSegment(first, last) {
    return h(
      "div",
      { class: "coverage-seg", dataset: { kind: "served" }, style: span(first, last) },
      `layers ${range(first, last)}`,
    );
  }

  const step = Math.max(1, Math.ceil(model.num_layers / 10));
  const ticks = [];
  for (let layer = 0; layer < model.num_layers; layer += step) {
    ticks.push(h("span", { style: span(layer, layer) }, layer));
  }
  return h(
    "div",
    { class: "coverage", role: "img", "aria-label": coverageLabel(model, gaps, range) },
    ...lanes,
    lane(...summary),
    h("div", { class: "coverage-scale", style: { gridTemplateColumns: columns } }, ticks),
  );
}

function coverageLabel(model, gaps, range) {
  if (!gaps.length) return `${model.key}: every layer is served`;
  return `${model.key}: no online node serves layers ${gaps.map(([a, b]) => range(a, b)).join(", ")}`;
}

// Each stage's capacity, and where placement (ADR-0019) puts the next node: the first
// gap, else the stage with the least capacity (ties: fewer nodes, then the earlier one).
function stagesTable(stages, gaps) {
  const range = (first, last) => (first === last ? `${first}` : `${first}–${last}`);
  const weakest = stages.reduce(
    (best, s) =>
      !best ||
      s.capacity < best.capacity ||
      (s.capacity === best.capacity && s.nodes.length < best.nodes.length)
        ? s
        : best,
    null,
  );
  const rows = [
    ...stages.map((stage) => ({ ...stage, gap: false })),
    ...gaps.map(([first, last]) => ({ first, last, nodes: [], capacity: 0, gap: true })),
  ].sort((a, b) => a.first - b.first);
  const nextFirst = gaps.length ? gaps[0][0] : weakest ? weakest.first : null;
  return h(
    "div",
    { class: "table-scroll" },
    h(
      "table",
      { class: "data", dataset: { role: "stages" } },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          h("th", { class: "num" }, "Stage"),
          h("th", { class: "num" }, "Nodes"),
          h("th", { class: "num" }, "Capacity tok/s"),
          h("th", {}, "Next node"),
        ),
      ),
      h(
        "tbody",
        {},
        rows.map((row) =>
          h(
            "tr",
            { dataset: { stage: `${row.first}-${row.last}`, kind: row.gap ? "gap" : "stage" } },
            h("td", { class: "num" }, range(row.first, row.last)),
            h(
              "td",
              { class: "num", title: row.nodes.map((n) => n.id).join(", ") },
              int(row.nodes.length),
            ),
            h("td", { class: "num" }, row.gap ? "—" : num(row.capacity)),
            h(
              "td",
              {},
              row.first === nextFirst
                ? badge(
                    row.gap ? "goes here: no node" : "goes here: least capacity",
                    row.gap ? "bad" : "warn",
                  )
                : "",
            ),
          ),
        ),
      ),
    ),
  );
}

function nodesTable(state, nodes, ages) {
  const rows = nodes.map((node) => {
    const nodeState = state.nodeState(node);
    const ageCell = h("td", { class: "num" }, age(state, node));
    ages.push([ageCell, node]);
    return h(
      "tr",
      { dataset: { nodeId: node.id, state: nodeState } },
      h("td", {}, h("code", { title: `wallet ${node.wallet}` }, node.id)),
      h("td", {}, h("span", { class: "ellipsis mono", title: node.endpoint }, node.endpoint)),
      h("td", { class: "num" }, `${node.shard_start}–${node.shard_end}`),
      h("td", {}, node.device_name ? `${node.hardware} · ${node.device_name}` : node.hardware),
      h("td", {}, h("code", {}, node.precision)),
      h("td", { class: "num" }, num(node.benchmark_tps)),
      h(
        "td",
        { class: "num", title: `${node.queue_depth} queued` },
        `${int(node.active_sessions)}${node.queue_depth ? ` (+${node.queue_depth} queued)` : ""}`,
      ),
      prefixCacheCell(node),
      h("td", { class: "num", dataset: { field: "prefix-hits" } }, int(node.prefix_hits)),
      h("td", {}, badge(nodeState, STATE_TONES[nodeState])),
      ageCell,
    );
  });
  return h(
    "table",
    { class: "data", dataset: { role: "nodes" } },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        h("th", {}, "Node"),
        h("th", {}, "Endpoint"),
        h("th", { class: "num" }, "Shard"),
        h("th", {}, "Device"),
        h("th", {}, "Precision"),
        h("th", { class: "num" }, "Benchmark tok/s"),
        h("th", { class: "num" }, "Sessions in use"),
        h("th", { class: "num" }, "Prefix cache"),
        h("th", { class: "num" }, "Prefix hits"),
        h("th", {}, "Status"),
        h("th", { class: "num" }, "Last heartbeat"),
      ),
    ),
    h("tbody", {}, rows),
  );
}

// A node reports its prefix cache's share of its KV budget rounded up to a quarter
// (ADR-0027), so a non-zero figure is an upper bound.
function prefixCacheCell(node) {
  const load = node.prefix_cache_load;
  return h(
    "td",
    {
      class: "num",
      dataset: { field: "prefix-cache" },
      title: "share of the node's KV budget its prefix cache holds, rounded up to a quarter",
    },
    load > 0 ? `≤ ${pct(load)}` : pct(load),
  );
}
