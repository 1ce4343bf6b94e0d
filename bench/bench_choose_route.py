"""How long one routing decision takes with 200 online nodes of one model.

One decision = enumerate the candidates from the node records (the prefix-
maximum planner) + read their arms from the store + the configured policy's
``choose`` (every candidate measured, so ``thompson-load`` draws rather than
scouts), what ``services.route_choose`` does once it has read the registry;
the database read that produces the records is not included. Each policy is
timed, side by side with a naive planner (every hop scans every node) and
against the 1 ms budget of issue 4. Standalone:
``.venv/bin/python bench/bench_choose_route.py``.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "meshnet_site.settings")

from routing_app.config import POLICY_ADR0021, POLICY_THOMPSON_LOAD, RoutingConfig
from routing_app.planner import MAX_CANDIDATES, NodeRecord, RoutePlan, _plan, enumerate_routes
from routing_app.stats import RouteStatsStore

NUM_LAYERS = 40
NODES = 200
BUDGET_SECONDS = 1e-3
ROUNDS = 3000


def network(rng: random.Random) -> list[NodeRecord]:
    """200 nodes: full-model nodes, heads of various lengths, middles and tails."""
    nodes = []
    for index in range(NODES):
        kind = index % 4
        if kind == 0:
            start, end = 0, NUM_LAYERS - 1
        elif kind == 1:
            start, end = 0, rng.randint(5, 30)
        elif kind == 2:
            start = rng.randint(5, 25)
            end = rng.randint(start, NUM_LAYERS - 1)
        else:
            start, end = rng.randint(15, 35), NUM_LAYERS - 1
        nodes.append(
            NodeRecord(
                node_id=f"node-{index:03}",
                endpoint=f"http://10.0.{index // 250}.{index % 250}:7000",
                shard_start=start,
                shard_end=end,
                benchmark_tps=rng.uniform(5.0, 500.0),
                queue_depth=rng.randint(0, 3),
                active_sessions=rng.randint(0, 2),
                reputation=rng.uniform(0.5, 1.0),
            )
        )
    return nodes


def naive_enumerate(
    *, model_key: str, num_layers: int, nodes: Sequence[NodeRecord]
) -> list[RoutePlan]:
    """The obvious planner: every hop scans every node for the longest reach."""
    last = num_layers - 1
    ranked = []
    for head in sorted(nodes, key=lambda n: n.node_id):
        if head.shard_start != 0:
            continue
        chain, end = [head], head.shard_end
        while end < last:
            options = [n for n in nodes if n.shard_start <= end + 1 <= n.shard_end]
            if not options:
                break
            following = max(options, key=lambda n: (n.shard_end, n.score))
            chain.append(following)
            end = following.shard_end
        if end >= last:
            ranked.append((-min(n.score for n in chain), len(chain), head.node_id, chain))
    ranked.sort(key=lambda item: item[:3])
    return [_plan(model_key, last, chain) for *_, chain in ranked[:MAX_CANDIDATES]]


def measure(
    planner: Callable[..., list[RoutePlan]], nodes: list[NodeRecord], config: RoutingConfig
) -> list[float]:
    store = RouteStatsStore(half_life=600.0)
    rng = random.Random(1)
    # Every candidate proven, as on a tracker that has served traffic for a while.
    for plan in planner(model_key="bench", num_layers=NUM_LAYERS, nodes=nodes):
        store.arms.record_sample(
            model_key="bench",
            signature=plan.signature,
            epoch=1,
            output_tokens=64,
            tokens_per_second=rng.uniform(10, 60),
        )
    timings = []
    for _ in range(ROUNDS):
        began = time.perf_counter()
        plans = planner(model_key="bench", num_layers=NUM_LAYERS, nodes=nodes)
        arms = store.views(plans=plans, epoch=1)
        picked = config.route_policy().choose(arms, rng=rng)
        timings.append(time.perf_counter() - began)
        assert picked is not None
    return timings


def main() -> None:
    nodes = network(random.Random(2026))
    fast = enumerate_routes(model_key="bench", num_layers=NUM_LAYERS, nodes=nodes)
    assert fast == naive_enumerate(model_key="bench", num_layers=NUM_LAYERS, nodes=nodes)
    print(f"choose_route, {NODES} online nodes, {NUM_LAYERS} layers, {len(fast)} candidates")
    for policy in (POLICY_THOMPSON_LOAD, POLICY_ADR0021):
        config = RoutingConfig(policy=policy)
        ours = measure(enumerate_routes, nodes, config)
        naive = measure(naive_enumerate, nodes, config)
        ours_median, naive_median = statistics.median(ours), statistics.median(naive)
        p95 = sorted(ours)[int(len(ours) * 0.95)]
        print(f"  {policy}: median {ours_median * 1e6:8.1f} us   p95 {p95 * 1e6:8.1f} us")
        print(f"    naive planner median {naive_median * 1e6:8.1f} us")
        print(f"    ratio median / 1 ms budget: {ours_median / BUDGET_SECONDS:.3f}")
        print(f"    ratio median / naive baseline: {ours_median / naive_median:.3f}")


if __name__ == "__main__":
    main()
