// The dashboard's state: a snapshot, then the typed updates of the websocket
// applied to it as idempotent upserts. Tabs subscribe to the parts they draw.

const KEEP_CALLS = 200;

export class DashboardState {
  constructor() {
    this.listeners = new Map();
    this.serverOffset = 0; // server clock minus this browser's, in seconds
    this.heartbeatTimeout = 30;
    this.models = new Map(); // key → {key, display_name, num_layers, epoch, epoch_reason}
    this.nodes = new Map(); // id → node row
    this.routingConfig = null;
    this.routing = new Map(); // model key → {model, epoch, routes, series}
    this.calls = new Map(); // request id → call summary
    this.billing = null;
  }

  on(part, listener) {
    if (!this.listeners.has(part)) this.listeners.set(part, []);
    this.listeners.get(part).push(listener);
  }

  emit(...parts) {
    for (const part of parts) for (const listener of this.listeners.get(part) || []) listener();
  }

  /** Server time now, in Unix seconds. */
  now() {
    return Date.now() / 1000 + this.serverOffset;
  }

  apply(message) {
    const handler = {
      snapshot: () => this.applySnapshot(message),
      node: () => this.applyNode(message.node),
      epoch: () => this.applyEpoch(message),
      routing: () => this.applyRouting(message),
      call: () => this.applyCall(message.call),
      billing: () => this.applyBilling(message),
    }[message.type];
    if (handler) handler();
  }

  applySnapshot(snapshot) {
    this.serverOffset = snapshot.server_time - Date.now() / 1000;
    this.heartbeatTimeout = snapshot.heartbeat_timeout;
    this.models = new Map();
    this.nodes = new Map();
    for (const model of snapshot.models) {
      const { nodes, gaps, ...rest } = model;
      this.models.set(model.key, rest);
      for (const node of nodes) this.nodes.set(node.id, node);
    }
    this.routingConfig = snapshot.routing.config;
    this.routing = new Map(snapshot.routing.models.map((m) => [m.model, m]));
    this.calls = new Map();
    for (const call of [...snapshot.calls.recent, ...snapshot.calls.in_flight]) {
      this.calls.set(call.request_id, call);
    }
    this.billing = snapshot.billing;
    this.emit("models", "routing", "calls", "billing");
  }

  applyNode(node) {
    this.nodes.set(node.id, { ...this.nodes.get(node.id), ...node });
    if (!this.models.has(node.model)) {
      this.models.set(node.model, {
        key: node.model,
        display_name: node.model,
        num_layers: node.num_layers,
        epoch: 0,
        epoch_reason: "",
      });
    }
    this.emit("models");
  }

  applyEpoch({ model, epoch, reason }) {
    const entry = this.models.get(model);
    if (!entry || entry.epoch > epoch) return;
    Object.assign(entry, { epoch, epoch_reason: reason });
    this.emit("models");
  }

  applyRouting({ config, model }) {
    this.routingConfig = config;
    this.routing.set(model.model, model);
    this.emit("routing");
  }

  applyCall(call) {
    const known = this.calls.get(call.request_id);
    // A finished request never goes back to processing (updates may cross).
    if (known && known.state !== "processing" && call.state === "processing") return;
    this.calls.set(call.request_id, { ...known, ...call });
    if (this.calls.size > KEEP_CALLS) this.forgetOldCalls();
    this.emit("calls");
  }

  applyBilling(billing) {
    const { type, ...summary } = billing;
    this.billing = summary;
    this.emit("billing");
  }

  forgetOldCalls() {
    const finished = [...this.calls.values()]
      .filter((c) => c.state !== "processing")
      .sort((a, b) => (a.finished_at || a.updated_at || 0) - (b.finished_at || b.updated_at || 0));
    for (const call of finished.slice(0, this.calls.size - KEEP_CALLS)) {
      this.calls.delete(call.request_id);
    }
  }

  /** A node as the page should show it: "silent" once its heartbeat is overdue. */
  nodeState(node) {
    const silentFor = this.now() - node.last_heartbeat_at;
    if (node.status === "online" && silentFor > this.heartbeatTimeout) return "silent";
    return node.status;
  }

  modelNodes(key) {
    return [...this.nodes.values()]
      .filter((n) => n.model === key)
      .sort((a, b) => a.shard_start - b.shard_start || a.id.localeCompare(b.id));
  }

  /** The model's stages as routing_app.placement cuts them (ADR-0019): the stretches
   * between online nodes' shard boundaries, each with the nodes serving all of it and
   * its capacity, the sum of their tok/s (the benchmark, capped by the measured speed). */
  stages(key) {
    const model = this.models.get(key);
    const online = this.modelNodes(key).filter((n) => n.status === "online");
    const cuts = new Set([0, model.num_layers]);
    for (const node of online) {
      cuts.add(Math.max(0, node.shard_start));
      cuts.add(Math.min(model.num_layers, node.shard_end + 1));
    }
    const bounds = [...cuts].sort((a, b) => a - b);
    const stages = [];
    for (let i = 0; i + 1 < bounds.length; i++) {
      const [first, last] = [bounds[i], bounds[i + 1] - 1];
      const nodes = online.filter((n) => n.shard_start <= first && last <= n.shard_end);
      if (!nodes.length) continue;
      const capacity = nodes.reduce((sum, n) => sum + capacityTps(n), 0);
      stages.push({ first, last, nodes, capacity });
    }
    return stages;
  }

  /** Inclusive [first, last] layer ranges no online node serves (as routing sees it:
   * a silent node still counts until the liveness sweep takes it offline). */
  gaps(key) {
    const model = this.models.get(key);
    const covered = new Array(model.num_layers).fill(false);
    for (const node of this.modelNodes(key)) {
      if (node.status !== "online") continue;
      for (let layer = node.shard_start; layer <= node.shard_end; layer++) covered[layer] = true;
    }
    const gaps = [];
    covered.forEach((served, layer) => {
      if (served) return;
      const last = gaps[gaps.length - 1];
      if (last && last[1] === layer - 1) last[1] = layer;
      else gaps.push([layer, layer]);
    });
    return gaps;
  }
}

/** What a node carries when idle: its benchmark, capped by its measured tok/s once known. */
function capacityTps(node) {
  const benchmark = node.benchmark_tps || 0;
  const measured = node.measured_tps || 0;
  if (measured > 0) return benchmark > 0 ? Math.min(benchmark, measured) : measured;
  return benchmark;
}
