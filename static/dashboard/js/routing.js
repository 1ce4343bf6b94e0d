// Routing (learned): the /v1/routing table per model, with each route's
// observed tok/s over the last minutes (uPlot, vendored).

import {
  $,
  badge,
  frameScheduler,
  h,
  hopsView,
  int,
  num,
  pct,
  routeText,
  STATE_TONES,
} from "./dom.js";

const CHART_HEIGHT = 180;
const PALETTE = ["--chart-1", "--chart-2", "--chart-3", "--chart-4", "--chart-5", "--chart-6"];

// The active policy (ADR-0011) and the knobs that matter to it.
function policyLine(config) {
  const knobs =
    config.policy === "adr0021"
      ? `explore share ${pct(config.explore_share)} · weight alpha ${config.weight_alpha}`
      : `a route is due for re-measuring before ${config.max_unsampled_seconds} s unsampled · ` +
        `load exponent ${config.load_exponent}`;
  return (
    `Policy ${config.policy}: ${knobs} · stats half-life ${config.stats_half_life} s · ` +
    `samples under ${config.min_sample_tokens} tokens ignored`
  );
}

export function mountRouting(state) {
  const configLine = $("routing-config");
  const root = $("routing-models");
  const charts = new Map(); // model key → RouteChart

  const draw = () => {
    const config = state.routingConfig;
    configLine.textContent = config ? policyLine(config) : "";
    const cards = [];
    for (const model of state.routing.values()) {
      let chart = charts.get(model.model);
      if (!chart) charts.set(model.model, (chart = new RouteChart()));
      cards.push(modelCard(model, chart));
    }
    for (const key of charts.keys()) {
      if (!state.routing.has(key)) {
        charts.get(key).destroy();
        charts.delete(key);
      }
    }
    root.replaceChildren(...cards);
    for (const model of state.routing.values()) charts.get(model.model).update(model.series || {});
  };
  state.on("routing", frameScheduler(draw));
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
    for (const chart of charts.values()) chart.destroy();
    draw();
  });
}

function modelCard(model, chart) {
  const rows = model.routes.map((route) =>
    h(
      "tr",
      { dataset: { signature: route.signature, status: route.status } },
      h("td", { title: route.signature }, hopsView(route.hops)),
      h("td", { class: "num" }, num(route.prior_tps)),
      h("td", { class: "num" }, num(route.tps)),
      h("td", { class: "num" }, num(route.coefficient, 2)),
      h(
        "td",
        { class: "num", title: route.scout_due ? "the next request goes here once, to measure it" : null },
        pct(route.expected_share),
        route.scout_due ? " · scout due" : null,
      ),
      h("td", { class: "num", dataset: { field: "samples" } }, int(route.samples)),
      h("td", { class: "num" }, num(route.weight, 2)),
      h(
        "td",
        { class: "num", dataset: { field: "prompt-cost" } },
        route.prompt_token_seconds === null ? "—" : num(route.prompt_token_seconds * 1000, 2),
      ),
      h("td", { class: "num", dataset: { field: "accepted" } }, num(route.accepted_per_token, 2)),
      h("td", {}, badge(route.status, STATE_TONES[route.status])),
    ),
  );
  return h(
    "section",
    { class: "card", dataset: { routingModel: model.model } },
    h(
      "div",
      { class: "card-head" },
      h("h2", {}, model.model),
      h(
        "span",
        { class: "muted" },
        `epoch ${model.epoch} · ${model.routes.length} candidate route${model.routes.length === 1 ? "" : "s"}` +
          ` · a request strays ±${Math.round((Math.exp(model.sample_spread) - 1) * 100)} % from its route's speed`,
      ),
    ),
    model.routes.length
      ? h(
          "div",
          { class: "table-scroll" },
          h(
            "table",
            { class: "data" },
            h(
              "thead",
              {},
              h(
                "tr",
                {},
                h("th", {}, "Route (node[layers it runs] in order)"),
                h("th", { class: "num", title: "bottleneck hop's queue-adjusted tok/s × reputation" }, "Prior tok/s"),
                h("th", { class: "num", title: "decayed EWMA of end-to-end tok/s" }, "Learned tok/s"),
                h("th", { class: "num", title: "learned tok/s ÷ best proven route's" }, "Coefficient"),
                h("th", { class: "num", title: "share of traffic under the current policy (a one-off scout shown apart)" }, "Expected share"),
                h("th", { class: "num" }, "Samples"),
                h("th", { class: "num", title: "decayed sample mass" }, "Weight"),
                h("th", { class: "num", title: "milliseconds a prompt token the route computes costs, as learned: what a cached prefix saves (ADR-0029)" }, "Prompt ms"),
                h("th", { class: "num", title: "speculation: drafts the last hop accepted per answer token, each a round trip saved (ADR-0028)" }, "Kept/tok"),
                h("th", {}, "Status"),
              ),
            ),
            h("tbody", {}, rows),
          ),
        )
      : h("p", { class: "muted empty" }, "No complete route: some layers have no online node."),
    model.routes.length || Object.keys(model.series || {}).length ? chart.element : null,
  );
}

/** One model's chart: a line per route, observed tok/s of each completed request. */
class RouteChart {
  constructor() {
    this.element = h("div", { class: "chart" });
    this.plot = null;
    this.signatures = [];
    // Deferred to the next frame: resizing inside the observer's callback would
    // trigger it again within the same frame.
    this.resizer = new ResizeObserver(() => requestAnimationFrame(() => this.fit()));
    this.resizer.observe(this.element);
  }

  update(series) {
    const signatures = Object.keys(series).sort();
    const points = signatures.reduce((count, s) => count + series[s].length, 0);
    if (!points) {
      this.destroyPlot();
      this.element.replaceChildren(
        h("p", { class: "muted chart-empty" }, "No completed request in the last minutes to chart yet."),
      );
      return;
    }
    const data = alignSeries(signatures, series);
    if (this.plot && signatures.join("\n") === this.signatures.join("\n")) {
      this.plot.setData(data);
      return;
    }
    this.destroyPlot();
    this.element.replaceChildren();
    this.signatures = signatures;
    this.plot = new window.uPlot(this.options(signatures), data, this.element);
  }

  options(signatures) {
    const style = getComputedStyle(document.documentElement);
    const color = (name) => style.getPropertyValue(name).trim();
    const axis = {
      stroke: color("--chart-axis"),
      grid: { stroke: color("--chart-grid"), width: 1 },
      ticks: { stroke: color("--chart-grid"), width: 1 },
    };
    return {
      width: Math.max(this.element.clientWidth, 240),
      height: CHART_HEIGHT,
      // At least a minute wide, so one or two points do not fill the chart.
      scales: { x: { time: true, range: (_, min, max) => [Math.min(min, max - 60), max + 1] } },
      legend: { live: false },
      series: [
        {},
        ...signatures.map((signature, index) => ({
          label: routeText(signature),
          stroke: color(PALETTE[index % PALETTE.length]),
          width: 2,
          spanGaps: true,
          points: { show: true, size: 5 },
          value: (_, v) => (v === null ? "—" : `${v.toFixed(1)} tok/s`),
        })),
      ],
      axes: [axis, { ...axis, label: "tok/s", size: 55 }],
    };
  }

  fit() {
    const width = this.element.clientWidth;
    if (this.plot && width > 0 && width !== this.plot.width) {
      this.plot.setSize({ width, height: CHART_HEIGHT });
    }
  }

  destroyPlot() {
    if (this.plot) this.plot.destroy();
    this.plot = null;
    this.signatures = [];
  }

  destroy() {
    this.destroyPlot();
  }
}

/** uPlot wants one x array and, per line, a value (or null) at every x. */
function alignSeries(signatures, series) {
  const xs = [...new Set(signatures.flatMap((s) => series[s].map(([t]) => t)))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const lines = signatures.map((signature) => {
    const line = new Array(xs.length).fill(null);
    for (const [t, tps] of series[signature]) line[index.get(t)] = tps;
    return line;
  });
  return [xs, ...lines];
}
