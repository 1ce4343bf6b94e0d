"""Routing simulator: the route choice policies against round-robin and an oracle, under load.

Seeded, no network, no database: the policies are ``routing_app``'s own
(the configured ``RoutePolicy`` over a real ``RouteStatsStore``), only the
nodes are made up. The parts are in ``bench/routing_simulation/``: the
topologies, the workload, the simulator; this script runs them and reports.

Three parts. The event runs: two topologies (ADR-0020's GPU head + CPU full
node, and a five-node mesh) whose nodes' *true* speed differs from the
benchmark they advertise (the prior), with four events. The replica runs
(ADR-0018): three replicas per stage over two and over three stages, and
``make demo``'s mixed topology (head 0-14, tail 15-29, full 0-29), steady.
Requests arrive as a Poisson stream,
each generating 16-256 tokens. A session's speed is the inverse of its
per-token time summed over its hops: layers run × the node's per-layer time
× the node's batching slowdown, plus 4 ms of network per hop after the head.
A node with k sessions at it at once runs a batch step k^0.6 times slower than
one alone, so its aggregate throughput grows as k^0.4 (2.3x at 8, as measured
with 64 tiny streams) up to ``BATCH_CAP`` sessions and stays flat beyond
(processor sharing: every session queues for its share). A session has one
token in flight, so the sessions *at* a node are its share of each session
through it (a fixed point, ``Network.occupancy``): a pipeline's stages work
at once, and a loaded route serves at its bottleneck node's capacity. Each request's
observed speed on a route carries 10 % log-normal noise. A request first
spends 2-20 of its own decode steps in prefill on its route (its time to
first token; again after a failover; the capacity estimate counts it). A
sample is recorded when a request completes (its tokens ÷ its time on its
last route, prefill included), and while it runs the tracker sees its pace
(tokens so far, time since it was sent and since its first token, with the
same noise: it is the request that is slower or faster than its route's
usual), as the proxy reports it to the load book. ``thompson-load without
paces`` is the default policy with the paces hidden from it, side by side.

Load levels: ``isolated`` is the first simulator's setting (1 request/s,
each request served as if alone), the others put arrivals at a share of the
topology's estimated capacity (node-disjoint routes, fastest first, each at
its batching cap). Four events, at each fifth of the run: the fastest
route's own costliest node slows down 5x (no epoch bump: the statistics must
notice on their own); it recovers (the old best is best again: a policy must
retry a route it had learned to avoid); a fast full-model node joins
(epoch bump); the then fastest route's own node leaves (epoch bump; its
sessions fail over to a route the policy picks).

For each policy: throughput (tokens delivered ÷ the requests' end-to-end
time) as a ratio of the oracle's, which knows every true speed and load and
sends each request to the complete route, of *all* of them (enumerated
exhaustively, not by the planner), where it runs fastest now, so where it
finishes first (greedy: it never holds a fast route back for the requests to
come, and does not count its own slowdown of the others, so near capacity a
policy can beat it),
with the lowest and highest seed's ratio; p50/p99 end-to-end latency;
per event, how many requests passed before the policy's share on the new
fastest route passed 50 % (for ``thompson-load`` the draw's share: its
one-off scouts of unmeasured routes are not a move of traffic); and the
longest time any candidate had neither a request in flight nor a fresh
sample, and ``overdue``: the most any routing decision left a candidate idle
past the ``max_unsampled_seconds`` bound while it sent its request to one
that was not (0 for ``thompson-load``, whose next request goes to a route
due under the bound: the gap itself can exceed the bound by the wait for
that request, or for the next when two fall due between two requests), and
``late``: the same whatever the decision chose (it may have scouted another
route past the bound).

The knobs (the sample spread 0.3, ``load_exponent``, the bound) were tuned
on seeds 1-5; every setting is also run on held-out seeds 101-105.

The replica runs put arrivals at 10 %, 90 % and 120 % of the topology's
capacity bound (``Network.capacity_bound``: per stage, the sum of its
replicas' capacities at their batching cap; the bottleneck stage's sum) and
print, beside the ratio to the all-routes oracle, the decode steps/s served
(prefill included) from a fifth of the run to the last arrival ÷ the bound,
the same oracle over the planner's candidates only (what the enumeration
costs), the routes the planner does not offer, and the share of requests
through each node. Then the replica runs' targets, pass or fail: with 3 replicas
per stage, served when saturated ≥ 0.8 × the bound; the default policy ≥ 0.9
of the all-routes oracle near capacity and ≥ 0.95 at light load (on every
replica topology). Like the other benchmarks, it prints a target's failure
and carries on (``make bench`` runs them all).

The conversation runs (``bench/routing_simulation/conversations.py``):
multi-turn conversations over the replica topologies, whose prompts share a
system prompt per app and each turn the previous turn's prompt and answer;
each node keeps a bounded prefix cache and a turn's prefill is its prompt's
uncached tokens. ``thompson-load`` chooses with the tracker's prefix memory
(cache-aware) and without it (cache-blind), beside an SGLang-style
cache-aware router and round-robin, at light load and near capacity (10 %
and 90 % of the capacity bound, every prompt counted as computed in full).
Per policy: mean and p90 time to first token, mean turn latency, answer
tokens/s, the cache hit rate (cached prompt tokens ÷ prompt tokens); then
cache-aware ÷ cache-blind and ÷ SGLang-style, and the target, pass or fail:
cache-aware mean time to first token ≤ 0.8 × cache-blind's.

Run: ``.venv/bin/python bench/routing_sim.py [--seeds N] [--requests N] [--quick]
[--only events|replicas|conversations] [--replica-seeds N] [--replica-requests N]
[--conversation-seeds N] [--conversations N]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.routing_simulation.conversations import (
    ConversationResult,
    Router,
    cold_work,
    converse,
    reuse_ceiling,
    sglang_style,
    thompson,
)
from bench.routing_simulation.conversations import (
    round_robin as conversation_round_robin,
)
from bench.routing_simulation.simulator import (
    ORACLE,
    ORACLE_CANDIDATES,
    ORACLES,
    ROUND_ROBIN,
    THOMPSON,
    WITHOUT_PACES,
    Policy,
    RunResult,
    bandit,
    round_robin,
    simulate,
)
from bench.routing_simulation.topologies import (
    REPLICA_SCENARIOS,
    SCENARIOS,
    Network,
    Scenario,
    per_request,
)
from bench.routing_simulation.workload import EVENTS
from routing_app.policies.config import POLICY_ADR0021, RoutePolicyConfig

POLICIES: list[tuple[str, RoutePolicyConfig | None]] = [
    ("thompson-load (ADR-0011 default)", THOMPSON),
    (WITHOUT_PACES, THOMPSON),
    ("adr0021 default (explore 0.3, alpha 1)", RoutePolicyConfig(policy=POLICY_ADR0021)),
    (
        "adr0021 tuned (explore 0.1, alpha 2)",
        RoutePolicyConfig(policy=POLICY_ADR0021, explore_share=0.1, weight_alpha=2.0),
    ),
    (ROUND_ROBIN, None),
    (ORACLE, None),
]
# (label, share of the estimated capacity; None: the isolated setting)
LOADS: list[tuple[str, float | None]] = [
    ("isolated (1 req/s, no interaction)", None),
    ("light (10% of capacity)", 0.1),
    ("medium (50% of capacity)", 0.5),
    ("near capacity (90%)", 0.9),
]


def policy_for(name: str, config: RoutePolicyConfig | None) -> Policy:
    if config is not None:
        return bandit(config, paces=name != WITHOUT_PACES)
    return round_robin() if name == ROUND_ROBIN else ORACLES[name]


def describe(answers: list[int | None], settled: list[float]) -> str:
    share = f"{statistics.mean(settled):.0%}"
    reached = [answer for answer in answers if answer is not None]
    if len(reached) < len(answers):
        return f"never in {len(answers) - len(reached)}/{len(answers)} (settles {share})"
    return f"{statistics.median(reached):.0f} (max {max(reached)}; settles {share})"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def seed_sets(count: int) -> list[tuple[str, range]]:
    """The seeds the knobs were tuned on (1..count) and as many held out (101..)."""
    return [
        (f"tuning seeds 1-{count}", range(1, count + 1)),
        (f"held-out seeds 101-{100 + count}", range(101, 101 + count)),
    ]


def report(results: dict[str, list[RunResult]]) -> None:
    """One line per policy (mean and per-seed range of the ratio), one per event."""
    oracle_tp = [run.throughput for run in results[ORACLE]]
    for name, _ in POLICIES:
        runs = results[name]
        ratios = [run.throughput / best for run, best in zip(runs, oracle_tp, strict=True)]
        latencies = [value for run in runs for value in run.latencies]
        print(
            f"{name:40} {statistics.mean(ratios):6.3f} x oracle "
            f"[{min(ratios):.3f}-{max(ratios):.3f}]  "
            f"p50 {percentile(latencies, 0.5):6.2f}  p99 {percentile(latencies, 0.99):7.2f}"
            f"  gap {max(run.longest_gap for run in runs):6.0f}"
            f" (overdue {max(run.overdue for run in runs):3.0f},"
            f" late {max(run.late for run in runs):3.0f})"
        )
        for index, event in enumerate(EVENTS):
            answers = [run.to_majority[index] for run in runs]
            settled = [run.settled[index] for run in runs]
            print(f"    {event:9} {describe(answers, settled)}")


# The replica runs (ADR-0018): policies, loads (share of the capacity bound), targets.
REPLICA_POLICIES: list[tuple[str, RoutePolicyConfig | None]] = [
    ("thompson-load (ADR-0011 default)", THOMPSON),
    (ROUND_ROBIN, None),
    (ORACLE_CANDIDATES, None),
    (ORACLE, None),
]
DEFAULT = REPLICA_POLICIES[0][0]
REPLICA_LOADS: list[tuple[str, float]] = [
    ("light (10% of the bound)", 0.1),
    ("near capacity (90% of the bound)", 0.9),
    ("saturated (120% of the bound offered)", 1.2),
]
LIGHT, NEAR, SATURATED = (label for label, _ in REPLICA_LOADS)
SERVED_TARGET = 0.8  # served under load ÷ the capacity bound, 3 replicas per stage
NEAR_TARGET = 0.9  # the default policy ÷ the all-routes oracle, near capacity
LIGHT_TARGET = 0.95  # ... at light load


def shares(counts: Counter[str], requests: int) -> str:
    return ", ".join(f"{key} {count / requests:.0%}" for key, count in sorted(counts.items()))


def replica_runs(
    scenario: Scenario, seeds: range, requests: int
) -> dict[str, dict[str, list[RunResult]]]:
    """Per load label, per policy, one run per seed; prints each load's lines."""
    net = Network(scenario)
    bound = net.capacity_bound()
    candidates = {plan.signature for plan in net.candidates()}
    routes = net.complete_routes()
    missing = [route.signature for route in routes if route.signature not in candidates]
    served_by_candidates = {n for route in net.candidates() for n in route.node_ids}
    print(
        f"\n== {scenario.name}: capacity bound {bound:.0f} decode steps/s "
        f"({per_request(bound):.2f} req/s); {len(routes)} complete routes, "
        f"{len(candidates)} candidates from the planner; nodes in no candidate: "
        f"{', '.join(sorted(set(net.nodes) - served_by_candidates)) or 'none'}"
    )
    for signature in missing:
        print(f"    not a candidate: {signature}")
    results: dict[str, dict[str, list[RunResult]]] = {}
    for label, utilisation in REPLICA_LOADS:
        rate = utilisation * per_request(bound)
        runs = {
            name: [
                simulate(scenario, name, policy_for(name, cfg), cfg, seed, requests, rate)
                for seed in seeds
            ]
            for name, cfg in REPLICA_POLICIES
        }
        results[label] = runs
        print(f"-- {label}, {rate:.2f} req/s")
        best = runs[ORACLE]
        for name, _ in REPLICA_POLICIES:
            ratio = [r.throughput / o.throughput for r, o in zip(runs[name], best, strict=True)]
            served = [r.served / bound for r in runs[name]]
            latencies = [value for run in runs[name] for value in run.latencies]
            print(
                f"{name:40} {statistics.mean(ratio):6.3f} x oracle (all routes) "
                f"[{min(ratio):.3f}-{max(ratio):.3f}]  served {statistics.mean(served):.3f}"
                f" x bound  p50 {percentile(latencies, 0.5):6.2f}"
                f"  p99 {percentile(latencies, 0.99):7.2f}"
            )
        for name in (DEFAULT, ORACLE):
            sent = sum((run.nodes for run in runs[name]), Counter[str]())
            total = sum(sum(run.routes.values()) for run in runs[name])
            print(f"    requests through each node, {name}: {shares(sent, total)}")
    return results


def versus_oracle(runs: dict[str, list[RunResult]]) -> float:
    """The default policy's throughput ÷ the all-routes oracle's, mean over the seeds."""
    pairs = zip(runs[DEFAULT], runs[ORACLE], strict=True)
    return statistics.mean(run.throughput / best.throughput for run, best in pairs)


def replica_section(seeds: int, requests: int) -> None:
    """The replica runs and their targets, pass or fail."""
    print(
        f"\nreplicas: seeds 1-{seeds} x {requests} requests, no events; "
        "columns: mean ratio to the all-routes oracle's throughput [lowest-highest seed], "
        "decode steps/s served (prefill included) from a fifth of the run to the last "
        "arrival ÷ the capacity bound, p50/p99 end-to-end latency (s)"
    )
    rows: list[tuple[str, float, float]] = []  # (what, figure, target: at least)
    for scenario in REPLICA_SCENARIOS:
        results = replica_runs(scenario, range(1, seeds + 1), requests)
        bound = Network(scenario).capacity_bound()
        if scenario.short.startswith("3x"):
            served = statistics.mean(r.served / bound for r in results[SATURATED][DEFAULT])
            rows.append((f"{scenario.short}: served, saturated ÷ bound", served, SERVED_TARGET))
        rows.append(
            (
                f"{scenario.short}: default ÷ oracle, near capacity",
                versus_oracle(results[NEAR]),
                NEAR_TARGET,
            )
        )
        rows.append(
            (
                f"{scenario.short}: default ÷ oracle, light",
                versus_oracle(results[LIGHT]),
                LIGHT_TARGET,
            )
        )
    print(f"\ntargets, {DEFAULT}:")
    for what, figure, target in rows:
        verdict = "pass" if figure >= target else "FAIL"
        print(f"    {what:45} {figure:6.3f}  >= {target:.2f}  {verdict}")


def event_section(seeds: int, requests: int) -> None:
    """The event runs (ADR-0011's settings): pair and mesh, every load, both seed sets."""
    at = ", ".join(f"{requests * (i + 1) // 5} ({event})" for i, event in enumerate(EVENTS))
    print(
        f"routing simulator: {seeds} tuning + {seeds} held-out seeds x "
        f"{requests} requests; events at request {at}; the slowdown is 5x; "
        f"thompson-load bound {THOMPSON.max_unsampled_seconds:.0f} s unsampled"
    )
    print(
        "columns: mean ratio to the all-routes oracle's throughput [lowest-highest seed], "
        "p50/p99 end-to-end latency (s), longest time a candidate went unsampled (s), the most "
        "a request's routing passed one over past the bound (overdue) or left one idle past it "
        "while scouting another (late); per event, median requests until "
        "the share on the new fastest route passed 50% (max over seeds)"
    )
    for scenario in SCENARIOS:
        capacity = Network(scenario).capacity_rps()
        for label, utilisation in LOADS:
            rate = None if utilisation is None else utilisation * capacity
            shown = "" if rate is None else f", {rate:.2f} req/s"
            for seeds_label, seed_range in seed_sets(seeds):
                print(f"\n== {scenario.name} — {label}{shown} — {seeds_label}")
                report(
                    {
                        name: [
                            simulate(
                                scenario,
                                name,
                                policy_for(name, cfg),
                                cfg,
                                seed,
                                requests,
                                rate,
                            )
                            for seed in seed_range
                        ]
                        for name, cfg in POLICIES
                    }
                )


# The conversation runs: routers, loads (share of the capacity bound, every prompt
# counted as computed in full), the target.
AWARE = "thompson-load, cache-aware (ours)"
BLIND = "thompson-load, cache-blind"
SGLANG = "SGLang-style cache-aware"
CONVERSATION_ROUTERS: list[tuple[str, Callable[[], Router]]] = [
    (BLIND, lambda: thompson(cache_aware=False)),
    (AWARE, lambda: thompson(cache_aware=True)),
    (SGLANG, lambda: sglang_style),
    (ROUND_ROBIN, conversation_round_robin),
]
CONVERSATION_LOADS: list[tuple[str, float]] = [
    ("light (10% of the bound)", 0.1),
    ("near capacity (90% of the bound)", 0.9),
]
TTFT_TARGET = 0.8  # cache-aware mean time to first token ÷ cache-blind's, at most


def mean_ttft(runs: list[ConversationResult]) -> float:
    """Mean time to first token over every seed's turns."""
    return statistics.mean(value for run in runs for value in run.ttft)


def mean_latency(runs: list[ConversationResult]) -> float:
    """Mean turn latency over every seed's turns."""
    return statistics.mean(value for run in runs for value in run.latency)


def conversation_section(seeds: int, conversations: int) -> None:
    """The conversation runs, their ratios and the target, pass or fail."""
    print(
        f"\nconversations: seeds 1-{seeds} x {conversations} conversations per setting; "
        "columns (turns of every seed pooled): mean and p90 time to first token (s), "
        "mean turn latency (s), answer tokens/s over the run, cache hit rate "
        "(cached prompt tokens ÷ prompt tokens)"
    )
    ceiling = statistics.mean(reuse_ceiling(seed, conversations) for seed in range(1, seeds + 1))
    print(
        f"hit rate were every turn sent where its conversation is held: {ceiling:.3f} "
        "(a turn computes at least its new message and the block it ends in)"
    )
    rows: list[tuple[str, float]] = []
    for scenario in REPLICA_SCENARIOS:
        bound = Network(scenario).capacity_bound()
        print(f"\n== {scenario.name}")
        for label, utilisation in CONVERSATION_LOADS:
            rate = utilisation * bound / cold_work()
            runs = {
                name: [
                    converse(scenario, router(), seed, conversations, rate)
                    for seed in range(1, seeds + 1)
                ]
                for name, router in CONVERSATION_ROUTERS
            }
            print(f"-- {label}, {rate:.3f} conversations/s")
            for name, _ in CONVERSATION_ROUTERS:
                results = runs[name]
                ttft = [value for run in results for value in run.ttft]
                hit = sum(r.cached_tokens for r in results) / sum(r.prompt_tokens for r in results)
                print(
                    f"{name:36} ttft {statistics.mean(ttft):6.2f} "
                    f"p90 {percentile(ttft, 0.9):6.2f}  latency "
                    f"{mean_latency(results):6.2f}  "
                    f"{statistics.mean(run.throughput for run in results):6.1f} tok/s  "
                    f"hit {hit:.3f}"
                )
            for other in (BLIND, SGLANG):
                ttft_ratio = mean_ttft(runs[AWARE]) / mean_ttft(runs[other])
                latency_ratio = mean_latency(runs[AWARE]) / mean_latency(runs[other])
                per_seed = [
                    statistics.mean(ours.ttft) / statistics.mean(theirs.ttft)
                    for ours, theirs in zip(runs[AWARE], runs[other], strict=True)
                ]
                print(
                    f"    cache-aware ÷ {other}: mean ttft {ttft_ratio:.3f} "
                    f"[{min(per_seed):.3f}-{max(per_seed):.3f}], "
                    f"mean latency {latency_ratio:.3f}"
                )
                if other == BLIND:
                    rows.append((f"{scenario.short}, {label}", ttft_ratio))
    print("\ntargets, cache-aware mean time to first token ÷ cache-blind's:")
    for what, figure in rows:
        verdict = "pass" if figure <= TTFT_TARGET else "FAIL"
        print(f"    {what:45} {figure:6.3f}  <= {TTFT_TARGET:.2f}  {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Routing policy simulator")
    parser.add_argument("--seeds", type=int, default=5, help="per seed set (tuning, held-out)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="3 seeds x 1000 requests")
    parser.add_argument(
        "--only",
        choices=("events", "replicas", "conversations"),
        help="run one part (default: all three)",
    )
    parser.add_argument("--replica-seeds", type=int, default=2, help="seeds 1..N")
    parser.add_argument("--replica-requests", type=int, default=1000)
    parser.add_argument("--conversation-seeds", type=int, default=3, help="seeds 1..N")
    parser.add_argument("--conversations", type=int, default=150, help="per run")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.requests = 3, 1000
    if args.only in (None, "events"):
        event_section(args.seeds, args.requests)
    if args.only in (None, "replicas"):
        replica_section(args.replica_seeds, args.replica_requests)
    if args.only in (None, "conversations"):
        conversation_section(args.conversation_seeds, args.conversations)


if __name__ == "__main__":
    main()
