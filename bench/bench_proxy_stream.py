"""SmolLM2 through the tracker vs. straight from the head vs. ``generate`` in one process.

Starts a tracker and two SmolLM2 nodes (layers 0-14 and 15-29), then streams
the same greedy request in alternating rounds through ``/v1/chat/completions``
(route pinned to those two nodes), directly from the head's ``/v1/generate``
(with a plan signed by the network's tracker key, as the tracker would sign
it), with transformers ``generate`` on the whole model in this process, and
with the nodes' two shard runners one after the other in this process (one
torch thread each time, as each node has). Tokens/s counts the whole
request, prefill included, on every side; beside them, the CPU each spends
per token (``/proc`` for the processes). Prints each and the ratios
tracker / direct (target >= 0.95) and tracker / generate (target >= 0.97),
in two layouts run one after the other: every process
left to the OS scheduler (the target's figure), and both nodes and this
process's model work on one CPU with the tracker and the client on the
other (what the route costs without the scheduler moving a waking process
between CPUs).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.processes import cpu_seconds, pin
from bench.signed_plans import signed_direct
from nodes_app.protocol.sse import sse_data
from tracker_app.localnet import LocalNetwork

MODEL = "smollm2-135m"
TOKENS = 64
ROUNDS = 5
TARGET_DIRECT = 0.95  # through the tracker ÷ straight from the head
TARGET_GENERATE = 0.97  # through the tracker ÷ generate in one process
MESSAGES = [{"role": "user", "content": "Write a short poem about distributed computing."}]


def timed_stream(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, float]:
    """(completion tokens, seconds from sending to the last token)."""
    began = time.perf_counter()
    tokens = 0
    with httpx.stream("POST", url, json=body, headers=headers, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if isinstance(frame := sse_data(line), dict):
                usage = frame.get("usage")
                if usage:
                    tokens = int(usage["completion_tokens"])
    return tokens, time.perf_counter() - began


def in_process_generate() -> Callable[[], tuple[int, float, float]]:
    """``generate`` on the whole model in this process: (new tokens, seconds, CPU seconds)."""
    import torch

    from nodes_app.runtime.loading.shard import load_causal_lm, load_tokenizer
    from nodes_app.shared.prompting import prompt_token_ids
    from nodes_app.shared.sources import resolve_source

    torch.set_num_threads(1)
    source = resolve_source(MODEL)
    model: Any = load_causal_lm(source)  # transformers' generate(), unknown to nn.Module
    prompt = torch.tensor([prompt_token_ids(load_tokenizer(source), MESSAGES)])

    def run() -> tuple[int, float, float]:
        began, cpu = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            out = model.generate(
                prompt, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False
            )
        new = out.shape[1] - prompt.shape[1]
        return new, time.perf_counter() - began, time.process_time() - cpu

    return run


def in_process_shards() -> Callable[[], tuple[int, float, float]]:
    """The nodes' two shard runners (0-14, 15-29) in this process, one after the other per
    token, greedy, no transport: (new tokens, seconds, CPU seconds) per call."""
    import torch

    from nodes_app.runtime.engine.runner import ShardRunner
    from nodes_app.runtime.loading.shard import load_shard, load_tokenizer
    from nodes_app.shared.prompting import prompt_token_ids
    from nodes_app.shared.sources import resolve_source

    torch.set_num_threads(1)
    source = resolve_source(MODEL)
    halves = [
        (
            ShardRunner(load_shard(model_key=MODEL, source=source, start=a, end=b, progress=False)),
            a,
            b,
        )
        for a, b in ((0, 14), (15, 29))
    ]
    prompt = prompt_token_ids(load_tokenizer(source), MESSAGES)

    def run() -> tuple[int, float, float]:
        began, cpu = time.perf_counter(), time.process_time()
        caches = [runner.new_cache() for runner, _, _ in halves]
        ids, position = list(prompt), 0
        for _ in range(TOKENS):
            hidden = halves[0][0].embed(ids)
            for (runner, start, end), cache in zip(halves, caches, strict=True):
                hidden = runner.run_layers(
                    hidden, cache=cache, start=start, end=end, position=position
                )
            position += len(ids)
            ids = [int(halves[-1][0].last_logits(hidden).argmax())]
        return TOKENS, time.perf_counter() - began, time.process_time() - cpu

    return run


def main() -> None:
    # One machine, so the embedded mode; no rate limit on the benchmark's key.
    settings = {"MESHNET_RATE_LIMIT_PER_MINUTE": "100000", "REDIS_URL": None}
    all_cpus = set(os.sched_getaffinity(0))
    model_cpus = {min(all_cpus)}
    layouts = {
        "unpinned (OS scheduler)": (all_cpus, all_cpus),
        "nodes and this process's model work on one CPU, tracker and client on the rest": (
            model_cpus,
            all_cpus - model_cpus or model_cpus,
        ),
    }
    with LocalNetwork.throwaway(env=settings) as net:
        net.start_tracker()
        key = net.create_api_key("bench")
        head = net.add_node("head", MODEL, (0, 14), wait=False)
        tail = net.add_node("tail", MODEL, (15, 29), wait=False)
        net.wait_for_route(MODEL)
        hops = [head.hop(), tail.hop()]
        common = {"messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0}
        via_tracker = {"model": MODEL, "stream": True, "route": [h["node_id"] for h in hops]}
        direct = {"plan": {"model": MODEL, "hops": hops}}
        assert net.tracker_key_file is not None and net.tracker is not None
        auth = {"Authorization": f"Bearer {key}"}
        generate, shards = in_process_generate(), in_process_shards()
        timed_stream(f"{net.url}/v1/chat/completions", {**common, **via_tracker}, auth)  # warm
        generate()
        shards()
        print(
            f"SmolLM2 two nodes (0-14, 15-29), {TOKENS} tokens greedy, {ROUNDS} alternating "
            "rounds each, one torch thread per process"
        )
        headline: tuple[float, float] | None = None
        for name, (node_cpus, other_cpus) in layouts.items():
            for node in (head, tail):
                pin(node.process.pid, node_cpus)
            pin(net.tracker.process.pid, other_cpus)
            tracker_tps, direct_tps, generate_tps, shards_tps = [], [], [], []
            # CPU ms per token: generate's; the head's and the tail's straight from the
            # head; the tracker's through it (the CPU figures do not blur with load).
            cpu: dict[str, list[float]] = {
                "generate": [],
                "shards": [],
                "head": [],
                "tail": [],
                "tracker": [],
            }
            for _ in range(ROUNDS):
                pin(os.getpid(), other_cpus)
                body = signed_direct({**common, **direct}, net.tracker_key_file)
                before = [cpu_seconds(node.process.pid) for node in (head, tail)]
                n, s = timed_stream(f"{hops[0]['endpoint']}/v1/generate", body, {})
                direct_tps.append(n / s)
                for node, began in zip((head, tail), before, strict=True):
                    cpu[node.name].append(1000 * (cpu_seconds(node.process.pid) - began) / n)
                began = cpu_seconds(net.tracker.process.pid)
                n, s = timed_stream(
                    f"{net.url}/v1/chat/completions", {**common, **via_tracker}, auth
                )
                tracker_tps.append(n / s)
                cpu["tracker"].append(1000 * (cpu_seconds(net.tracker.process.pid) - began) / n)
                pin(os.getpid(), node_cpus)
                n, s, used = generate()
                generate_tps.append(n / s)
                cpu["generate"].append(1000 * used / n)
                n, s, used = shards()
                shards_tps.append(n / s)
                cpu["shards"].append(1000 * used / n)
            t, d = statistics.median(tracker_tps), statistics.median(direct_tps)
            g, r = statistics.median(generate_tps), statistics.median(shards_tps)
            headline = headline or (t / d, t / g)
            print(f"[{name}]")
            print(
                f"  generate, one process: {g:.2f} tokens/s  {[round(x, 2) for x in generate_tps]}"
            )
            print(f"  shards, one process:   {r:.2f} tokens/s  {[round(x, 2) for x in shards_tps]}")
            print(f"  direct from head:      {d:.2f} tokens/s  {[round(x, 2) for x in direct_tps]}")
            print(
                f"  through tracker:       {t:.2f} tokens/s  {[round(x, 2) for x in tracker_tps]}"
            )
            print(
                f"  tracker / direct = {t / d:.3f}, tracker / generate = {t / g:.3f}, "
                f"shards in one process / generate = {r / g:.3f}"
            )
            ms = {part: statistics.median(values) for part, values in cpu.items()}
            nodes = ms["head"] + ms["tail"]
            print(
                f"  CPU per token: generate {ms['generate']:.1f} ms; shards in one process "
                f"{ms['shards']:.1f} ms; straight from the head, "
                f"head {ms['head']:.1f} + tail {ms['tail']:.1f} = {nodes:.1f} ms "
                f"({nodes - ms['generate']:+.1f}); the tracker {ms['tracker']:.2f} ms"
            )
    assert headline is not None
    print(f"ratio tracker / direct   = {headline[0]:.3f}  (target >= {TARGET_DIRECT}, unpinned)")
    print(f"ratio tracker / generate = {headline[1]:.3f}  (target >= {TARGET_GENERATE}, unpinned)")


if __name__ == "__main__":
    main()
