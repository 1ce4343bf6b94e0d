"""Prefix reuse on a two-node SmolLM2 route: first-token times with the cache ÷ without.

Side by side in one run, one torch thread per node, greedy: nodes 0-14 and
15-29 run as ``python -m nodes_app.runtime`` processes (dev-open, called
directly) and the head streams from ``/v1/generate``. A request in a prefix
scope (the plan's ``prefix_scope``, ADR-0027) may reuse what earlier requests
of that scope left in each node's cache; one without a scope reuses nothing,
the baseline. Each case runs both, alternating, on the same prompts:

- **A growing conversation**: a system prompt of about 830 tokens and six
  turns, each turn sending the whole history back. Target: every later turn's
  first token ÷ the first turn's ≤ 0.35 with the cache.
- **A shared system prompt**: six users, the same system prompt, a different
  one-line question each. Target: later users ÷ the first ≤ 0.35.
- **Decode speed**: tokens/s after the first token, a hit ÷ no scope ≥ 0.97
  (reuse costs nothing once the prompt is in).
- **Churn**: 24 distinct long prompts in one scope through nodes given a small
  KV budget: what the cache holds stays within it (the open health page's
  ``prefix_cache_load`` never past 1) and the nodes keep answering.

    .venv/bin/python bench/bench_prefix_reuse.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nodes_app.protocol.sse import sse_data
from tracker_app.localnet import NodeProcess, process_env, start_node

MODEL = "smollm2-135m"
TARGET_FIRST_TOKEN = 0.35
TARGET_DECODE = 0.97
ANSWER_TOKENS = 24
DECODE_TOKENS = 64
CHURN_PROMPTS = 24
CHURN_BUDGET_MIB = 96

RULES = [
    "Answer in plain English and keep every answer short.",
    "Never invent a fact; say so when you do not know.",
    "Prefer the metric system, and give units with every number.",
    "When asked for code, answer with one short Python function.",
    "Quote nobody, and cite no sources you cannot name.",
    "Explain a technical word the first time you use it.",
    "Write dates as year, month and day.",
    "Keep lists to five items at most.",
]
SYSTEM = (
    " ".join(f"Rule {n + 1}.{i + 1}: {rule}" for n in range(6) for i, rule in enumerate(RULES))
    + " Follow every rule above in every answer."
)
QUESTIONS = [
    "What is a lighthouse for?",
    "How tall is a typical one?",
    "Who keeps it running today?",
    "What powers its lamp?",
    "Why do some flash and others not?",
    "Name one famous lighthouse.",
]


def node(layers: tuple[int, int], name: str, log_dir: Path, *extra: str) -> NodeProcess:
    return start_node(
        name=name, model=MODEL, layers=layers, env=process_env(), log_dir=log_dir,
        node_id=name, dev_open=True, extra=extra,
    )  # fmt: skip


def generate(
    route: list[NodeProcess],
    messages: list[dict[str, str]],
    *,
    scope: str | None,
    max_tokens: int,
) -> tuple[str, float, float, int, int]:
    """One greedy generation: its text, seconds to the first token, decode tokens/s after
    it, the tokens produced and the prompt positions the route did not recompute."""
    head, tail = route
    plan: dict[str, Any] = {
        "model": MODEL,
        "hops": [head.hop(0, 14), tail.hop(15, 29)],
    }
    if scope is not None:
        plan["prefix_scope"] = scope
    body = {
        "request_id": f"bench-{time.monotonic_ns()}",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "plan": plan,
    }
    pieces: list[str] = []
    stamps: list[tuple[float, int]] = []  # when each chunk came, and the tokens it carried
    usage: dict[str, Any] = {}
    began = time.perf_counter()
    with httpx.stream("POST", f"{head.endpoint}/v1/generate", json=body, timeout=600) as answer:
        for line in answer.iter_lines():
            chunk = sse_data(line)
            if not isinstance(chunk, dict):
                continue
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if ids := chunk.get("meshnet_token_ids"):
                stamps.append((time.perf_counter(), len(ids)))
            for choice in chunk.get("choices", []):
                pieces.append((choice.get("delta") or {}).get("content") or "")
            usage = chunk.get("usage") or usage
    produced = sum(count for _, count in stamps)
    first = stamps[0][0] - began
    after_first = produced - stamps[0][1]
    span = stamps[-1][0] - stamps[0][0]
    decode = after_first / span if after_first and span > 0 else 0.0
    return "".join(pieces), first, decode, produced, int(usage.get("cached_tokens", 0))


def settle(route: list[NodeProcess]) -> None:
    """Wait until every node has ended the last generation's sessions (and kept its state)."""
    deadline = time.monotonic() + 30
    while any(n.health()["active_sessions"] for n in route) and time.monotonic() < deadline:
        time.sleep(0.05)


def conversation(route: list[NodeProcess]) -> list[float]:
    print("a growing conversation: first token (s), no scope vs in a scope")
    histories: dict[str, list[dict[str, str]]] = {
        "off": [{"role": "system", "content": SYSTEM}],
        "on": [{"role": "system", "content": SYSTEM}],
    }
    firsts: dict[str, list[float]] = {"off": [], "on": []}
    for turn, question in enumerate(QUESTIONS, 1):
        cached = 0
        for case, scope in (("off", None), ("on", "bench-conversation")):
            history = histories[case]
            history.append({"role": "user", "content": question})
            text, first, _, _, reused = generate(
                route, history, scope=scope, max_tokens=ANSWER_TOKENS
            )
            settle(route)
            history.append({"role": "assistant", "content": text})
            firsts[case].append(first)
            cached = reused if case == "on" else cached
        same = histories["off"][-1] == histories["on"][-1]
        print(
            f"  turn {turn}: {firsts['off'][-1]:.3f} vs {firsts['on'][-1]:.3f}"
            f"  ({cached} prompt tokens reused; same answer: {same})"
        )
    return [later / firsts["on"][0] for later in firsts["on"][1:]]


def shared_prompt(route: list[NodeProcess]) -> list[float]:
    print("a shared system prompt, six users: first token (s), no scope vs in a scope")
    firsts: dict[str, list[float]] = {"off": [], "on": []}
    for user, question in enumerate(QUESTIONS, 1):
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"User {user} asks: {question}"},
        ]
        answers = {}
        reused = 0
        for case, scope in (("off", None), ("on", "bench-shared")):
            answers[case], first, _, _, cached = generate(
                route, messages, scope=scope, max_tokens=ANSWER_TOKENS
            )
            settle(route)
            firsts[case].append(first)
            reused = cached if case == "on" else reused
        print(
            f"  user {user}: {firsts['off'][-1]:.3f} vs {firsts['on'][-1]:.3f}"
            f"  ({reused} reused; same answer: {answers['off'] == answers['on']})"
        )
    return [later / firsts["on"][0] for later in firsts["on"][1:]]


def decode_speed(route: list[NodeProcess]) -> float:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Tell me a long story about a lighthouse keeper."},
    ]
    generate(route, messages, scope="bench-decode", max_tokens=4)  # fill the cache
    settle(route)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(5):
        for case, scope in (("off", None), ("on", "bench-decode")):
            _, _, rate, produced, _ = generate(
                route, messages, scope=scope, max_tokens=DECODE_TOKENS
            )
            settle(route)
            assert produced == DECODE_TOKENS, produced
            rates[case].append(rate)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"decode after the first token: {off:.2f} tokens/s no scope, {on:.2f} with a hit")
    return on / off


def churn(log_dir: Path) -> bool:
    route = [
        node((0, 14), "churn-head", log_dir, "--kv-budget", str(CHURN_BUDGET_MIB)),
        node((15, 29), "churn-tail", log_dir, "--kv-budget", str(CHURN_BUDGET_MIB)),
    ]
    try:
        for started in route:
            started.wait_serving(timeout=300)
        loads = []
        for n in range(CHURN_PROMPTS):
            messages = [
                {"role": "system", "content": f"Conversation {n}. {SYSTEM}"},
                {"role": "user", "content": QUESTIONS[n % len(QUESTIONS)]},
            ]
            generate(route, messages, scope="bench-churn", max_tokens=4)
            settle(route)
            loads.append(max(float(r.health()["prefix_cache_load"]) for r in route))
        print(
            f"churn: {CHURN_PROMPTS} distinct long prompts, "
            f"{CHURN_BUDGET_MIB} MiB KV budget per node: cache load after each "
            f"{sorted(set(loads))} (1 = the whole budget)"
        )
        return max(loads) <= 1.0
    finally:
        for started in route:
            started.stop()


def main() -> int:
    logs = Path(tempfile.mkdtemp(prefix="meshnet-bench-"))
    route = [node((0, 14), "bench-head", logs), node((15, 29), "bench-tail", logs)]
    try:
        for started in route:
            started.wait_serving(timeout=300)
        generate(route, [{"role": "user", "content": "Hello"}], scope=None, max_tokens=2)
        talk = conversation(route)
        users = shared_prompt(route)
        decode = decode_speed(route)
    finally:
        for started in route:
            started.stop()
    within = churn(logs)
    print(
        f"later turns ÷ the first, in a scope: max {max(talk):.3f}, "
        f"mean {statistics.mean(talk):.3f} (target <= {TARGET_FIRST_TOKEN})"
    )
    print(
        f"later users ÷ the first, in a scope: max {max(users):.3f}, "
        f"mean {statistics.mean(users):.3f} (target <= {TARGET_FIRST_TOKEN})"
    )
    print(f"decode with a hit ÷ without = {decode:.3f} (target >= {TARGET_DECODE})")
    print(f"the cache stayed within the KV budget under churn: {within}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
