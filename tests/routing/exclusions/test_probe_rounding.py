"""Honest routes of mixed precision pass the probe's comparison on either CPU kind (ADR-0015).

Real shards of the tiny model answer the probe, greedy and sampled, in a
float32 route and in routes whose head computes in bfloat16 or float16 —
once in this machine's own kernels, once in those a CPU without AVX-512
runs. Rounding differs between the two, and must never read as disagreement.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

import pytest

from nodes_app.protocol.logprobs import TokenLogprob, TopLogprob
from routing_app.exclusions.probe_verdicts import (
    PROBE_TIE_MARGIN,
    ProbeAnswer,
    probe_answers_compare,
)
from tests.support.rounded_routes import AVX2_KERNELS, ROUTES

SEEDS = 40


def probe_answer(run: dict[str, Any], *, rounded: bool) -> ProbeAnswer:
    def entry(token_id: int, logprob: float, top: list[list[Any]]) -> TokenLogprob:
        listed = tuple(TopLogprob(f"<{t}>", lp, ()) for t, lp in top)
        return TokenLogprob(f"<{token_id}>", logprob, (), listed)

    entries = tuple(
        entry(token_id, logprob, top)
        for token_id, (logprob, top) in zip(run["token_ids"], run["entries"], strict=True)
    )
    return ProbeAnswer(token_ids=tuple(run["token_ids"]), logprobs=entries, rounded=rounded)


@pytest.mark.parametrize("kernels", ["native", "avx2"])
def test_routes_rounding_their_head_agree_with_float32_greedy_and_sampled(kernels: str) -> None:
    env = {**os.environ, **(AVX2_KERNELS if kernels == "avx2" else {})}
    printed = subprocess.run(
        [sys.executable, "-m", "tests.support.rounded_routes", str(SEEDS)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    ).stdout
    runs: dict[str, list[dict[str, Any]]] = json.loads(printed)
    reference = [probe_answer(run, rounded=False) for run in runs["float32"]]
    for name in ROUTES:
        if name == "float32":
            continue
        answers = [probe_answer(run, rounded=True) for run in runs[name]]
        [(greedy_a, greedy_b), *sampled] = list(zip(reference, answers, strict=True))
        assert probe_answers_compare(greedy_a, greedy_b, margin=PROBE_TIE_MARGIN).agree
        for a, b in sampled:
            comparison = probe_answers_compare(a, b, margin=math.inf)
            assert comparison.agree, (name, kernels, comparison, a.token_ids, b.token_ids)
