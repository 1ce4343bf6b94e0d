"""Probe answers from real shards of the tiny model, run in this process's torch kernels.

``python -m tests.support.rounded_routes SEEDS`` prints, as JSON, the probe's
answer (greedy, then sampled at temperature 1 with seeds ``0..SEEDS-1``) from
the float32 whole model and from a route whose head (layers 0-1) computes in
bfloat16 or float16 before the float32 layers 2-3, as the nodes compute them
(``ShardRunner``, ``TokenPicker``). Run with other kernels (``AVX2_KERNELS``)
it shows what a CPU without AVX-512 answers.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import django

# What a CPU without AVX-512 runs: torch's AVX2 vector kernels, MKL's and
# oneDNN's AVX2 code; oneDNN's bfloat16 products (torch takes them only with
# AVX-512) are switched off with MESHNET_TEST_NO_ONEDNN.
AVX2_KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MESHNET_TEST_NO_ONEDNN": "1",
}
MODEL = "tiny-random-llama"
ROUTES = {"float32": None, "bfloat16": "bfloat16", "float16": "float16"}


def answers(seeds: int) -> dict[str, list[dict[str, Any]]]:
    import torch

    if os.environ.get("MESHNET_TEST_NO_ONEDNN"):
        torch.backends.mkldnn.set_flags(False)
    torch.set_num_threads(1)
    from nodes_app.protocol.sampling import SamplingParams
    from nodes_app.runtime.engine.runner import ShardRunner
    from nodes_app.runtime.engine.sampler import TokenPicker
    from nodes_app.runtime.loading.shard import load_shard
    from nodes_app.shared.sources import resolve_source
    from nodes_app.shared.tokenization import tiny_tokenizer
    from tracker_app.probes import PROBE_MAX_TOKENS, PROBE_MESSAGES, PROBE_TOP_LOGPROBS

    source = resolve_source(MODEL)

    def shard(start: int, end: int, dtype: str) -> tuple[ShardRunner, int, int]:
        loaded = load_shard(model_key=MODEL, source=source, start=start, end=end, dtype=dtype)
        return ShardRunner(loaded), start, end

    tail = shard(2, 3, "float32")
    routes = {
        name: [shard(0, 3, "float32")] if dtype is None else [shard(0, 1, dtype), tail]
        for name, dtype in ROUTES.items()
    }
    chat: Any = tiny_tokenizer().apply_chat_template(PROBE_MESSAGES, add_generation_prompt=True)
    prompt = list(chat if isinstance(chat, list) else chat["input_ids"])

    def answer(route: list[tuple[ShardRunner, int, int]], temperature: float, seed: int) -> Any:
        chooser = TokenPicker(SamplingParams(temperature=temperature, seed=seed))
        caches = [runner.new_cache() for runner, _, _ in route]
        tokens: list[int] = []
        entries = []
        step, position = prompt, 0
        for _ in range(PROBE_MAX_TOKENS):
            hidden = route[0][0].embed(step)
            for (runner, start, end), cache in zip(route, caches, strict=True):
                hidden = runner.run_layers(
                    hidden.to(runner.shard.dtype),
                    cache=cache,
                    start=start,
                    end=end,
                    position=position,
                )
            choice = chooser.choose(route[-1][0].last_logits(hidden)[0], PROBE_TOP_LOGPROBS)
            assert choice.score is not None
            tokens.append(choice.token_id)
            entries.append([choice.score.logprob, choice.score.top])
            position += len(step)
            step = [choice.token_id]
        return {"token_ids": tokens, "entries": entries}

    runs = [(0.0, 0), *((1.0, seed) for seed in range(seeds))]
    return {
        name: [answer(route, temperature, seed) for temperature, seed in runs]
        for name, route in routes.items()
    }


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "meshnet_site.settings")
    django.setup()
    json.dump(answers(int(sys.argv[1])), sys.stdout)
