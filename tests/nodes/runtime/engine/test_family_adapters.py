"""Every served decoder family, split and whole, answers as transformers' own ``generate``.

Tiny random checkpoints of each family (``tests/support/checkpoints.py``) are
loaded shard by shard as nodes load them and run through the runner in
process: whole, split in two (for the hybrid families between a
linear-attention and a full-attention layer) and in three (inside runs of
MoE layers). Greedy tokens must be identical and every step's log-probabilities
within 1e-4 of transformers' whole model; two sessions decoded in one batch
must get what each gets alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nodes_app.runtime.engine.family_adapters import FAMILIES as ADAPTERS
from nodes_app.runtime.engine.kv import session_bytes
from nodes_app.runtime.engine.runner import ShardRunner
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.shared.families import SUPPORTED_FAMILIES
from nodes_app.shared.model_errors import UnsupportedModelError
from nodes_app.shared.sources import ModelSource
from tests.support.checkpoints import FAMILIES, LAYERS, tiny_checkpoint, transformers_greedy

PROMPT = [257, 117, 115, 101, 114, 10, 104, 105, 258, 10, 257, 97, 115, 115]
STEPS = 12
SPLITS = {
    "whole": [(0, LAYERS - 1)],
    # Hybrid families: layers 0-2 are linear attention, 3 full attention.
    "two hops": [(0, 2), (3, LAYERS - 1)],
    "three hops": [(0, 1), (2, 3), (4, LAYERS - 1)],
}

Hops = list[tuple[ShardRunner, int, int]]


def checkpoint(checkpoints: dict[str, Path], family: str) -> Path:
    directory = checkpoints[family]
    if not directory.exists():
        tiny_checkpoint(family, directory)
    return directory


def hops_of(directory: Path, ranges: list[tuple[int, int]]) -> Hops:
    source = ModelSource("directory", str(directory))
    return [
        (
            ShardRunner(
                load_shard(model_key="tiny", source=source, start=start, end=end, progress=False)
            ),
            start,
            end,
        )
        for start, end in ranges
    ]


def greedy(hops: Hops, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens along ``hops`` and each step's logits, one session per hop."""
    caches = [runner.new_cache() for runner, _, _ in hops]
    tokens: list[int] = []
    logits = []
    step, position = list(prompt), 0
    for _ in range(steps):
        hidden = hops[0][0].embed(step)
        for (runner, start, end), cache in zip(hops, caches, strict=True):
            hidden = runner.run_layers(
                hidden, cache=cache, start=start, end=end, position=position, token_ids=step
            )
        position += len(step)
        last = hops[-1][0].last_logits(hidden)[0]
        logits.append(last)
        step = [int(last.argmax())]
        tokens.append(step[0])
    return tokens, torch.stack(logits)


@pytest.mark.parametrize("split", sorted(SPLITS))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_split_or_whole_generates_what_transformers_generates(
    checkpoints: dict[str, Path], family: str, split: str
) -> None:
    torch.set_num_threads(1)
    directory = checkpoint(checkpoints, family)
    expected, expected_logits = transformers_greedy(directory, PROMPT, STEPS)

    tokens, logits = greedy(hops_of(directory, SPLITS[split]), PROMPT, STEPS)

    assert tokens == expected
    torch.testing.assert_close(
        logits.log_softmax(-1), expected_logits.log_softmax(-1), rtol=0, atol=1e-4
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sessions_decoded_in_one_batch_get_what_each_gets_alone(
    checkpoints: dict[str, Path], family: str
) -> None:
    torch.set_num_threads(1)
    ((runner, start, end),) = hops_of(checkpoint(checkpoints, family), [(0, LAYERS - 1)])
    prompts = [PROMPT, PROMPT[3:], PROMPT[:9]]
    # Llama 4's NoPE layers need the rows of a batch at one past: the scheduler groups them so.
    if runner.family.rows_share_past:
        prompts = [PROMPT, PROMPT[::-1], [min(p + 1, 255) for p in PROMPT]]
    caches = [runner.new_cache() for _ in prompts]
    alone, nexts = [], []
    for prompt, cache in zip(prompts, caches, strict=True):
        hidden = runner.run_layers(
            runner.embed(prompt), cache=cache, start=start, end=end, position=0, token_ids=prompt
        )
        nexts.append(int(runner.last_logits(hidden)[0].argmax()))
        fresh = runner.new_cache()
        runner.run_layers(
            runner.embed(prompt), cache=fresh, start=start, end=end, position=0, token_ids=prompt
        )
        single = runner.run_layers(
            runner.embed(nexts[-1:]),
            cache=fresh,
            start=start,
            end=end,
            position=len(prompt),
            token_ids=nexts[-1:],
        )
        alone.append(runner.last_logits(single)[0])

    batch = runner.run_batch(
        torch.cat([runner.embed([token]) for token in nexts]),
        caches=caches,
        pasts=[len(prompt) for prompt in prompts],
        start=start,
        end=end,
        token_ids=[[token] for token in nexts],
    )

    torch.testing.assert_close(runner.last_logits(batch), torch.stack(alone), rtol=0, atol=1e-5)


def test_a_family_the_runner_does_not_serve_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 50}'
    )
    with pytest.raises(UnsupportedModelError, match="'gpt2' is not served"):
        hops_of(tmp_path, [(0, 1)])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_sessions_reservation_is_what_its_state_really_takes(
    checkpoints: dict[str, Path], family: str
) -> None:
    ((runner, start, end),) = hops_of(checkpoint(checkpoints, family), [(0, LAYERS - 1)])
    prompt = (PROMPT * 2)[:16]
    cache = runner.new_cache(limit=len(prompt))

    runner.run_layers(
        runner.embed(prompt), cache=cache, start=start, end=end, position=0, token_ids=prompt
    )

    assert cache.nbytes == session_bytes(runner.shard, start, end, len(prompt))


def test_the_runner_has_an_adapter_for_every_served_family_and_no_other() -> None:
    assert set(ADAPTERS) == set(SUPPORTED_FAMILIES) == set(FAMILIES)
