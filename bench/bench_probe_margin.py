"""How far rounding and corruption move the probe's near-tie gap, SmolLM2 on CPU (ADR-0015).

The probe's rule (``routing_app.probing.probe_answers_compare``) lets two
routes part at a position where the summed gap — how far below its own
choice each route put the other's token — is at most ``PROBE_TIE_MARGIN``.
That sum is the change in the two tokens' logit difference between the
routes. This reads a fixed text (ADR-0007 at a fixed commit) teacher-forced
through SmolLM2 in float32 (the reference) and through:

- **routes of other precisions**: every layer bfloat16, a bfloat16 head
  (layers 0-14) before float32 layers, every layer float16 — the hidden
  state rounded to each layer's dtype on entry, as a node converts what it
  receives; the final norm and LM head in float32. Reported: the gap error
  at the reference's top two tokens (max, p99.5), and at the positions where
  the greedy token flips, the largest summed gap. The margin must exceed
  what rounding does.
- **corrupt routes**: Gaussian noise of a few scales added to the hidden
  state entering layer 2, as a node serving layers 0-1 with
  ``runnode --corrupt-hidden-states`` sends it (the process test's
  layout). Reported: the flips, and how many of them the rule would take
  for near-ties at a few margins (both tokens among the top 5, summed gap
  within the margin).
- **the probe itself on ``tiny-random-llama``** (the process test's model):
  the probe's chat, 12 greedy tokens with their top 5, from a float32 route
  and from a route whose layers 0-1 add noise, per noise seed; each pair
  judged by the real rule. Reported: how many corrupt answers it takes for
  agreeing.

    .venv/bin/python bench/bench_probe_margin.py [--positions 400] [--seeds 200]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "meshnet_site.settings")

MODEL = "smollm2-135m"
# A fixed text to read: ADR-0007 as it stood before ADR-0015 amended it.
TEXT = ("921be4a", "docs/adr/0007-probes-audits-schedules.md")
TOP = 5
MARGINS = (0.1, 0.3, 0.5)
NOISE_INTO_LAYER = 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--positions", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=200)
    args = parser.parse_args()

    import torch

    from nodes_app.runtime.loading import load_causal_lm, load_tokenizer
    from nodes_app.runtime.sources import resolve_source

    torch.set_num_threads(1)
    torch.manual_seed(0)
    source = resolve_source(MODEL)
    # A module of transformers' LlamaForCausalLM: its submodules are reached by name.
    model: Any = load_causal_lm(source)
    tokenizer = load_tokenizer(source)
    text = subprocess.run(
        ["git", "show", f"{TEXT[0]}:{TEXT[1]}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, : args.positions]
    layers = model.model.layers

    def logprobs(entry: Callable[[int, Any], Any]) -> Any:
        """Log-softmax at every position, ``entry(i, hidden)`` applied as layer i's input."""

        def hook(index: int) -> Callable[..., Any]:
            def cast(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                hidden = entry(index, kwargs["hidden_states"] if not args else args[0])
                if kwargs.get("position_embeddings") is not None:
                    kwargs["position_embeddings"] = tuple(
                        t.to(hidden.dtype) for t in kwargs["position_embeddings"]
                    )
                if args:
                    return (hidden, *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": hidden}

            return cast

        handles = [
            layer.register_forward_pre_hook(hook(i), with_kwargs=True)
            for i, layer in enumerate(layers)
        ]
        handles.append(model.model.norm.register_forward_pre_hook(lambda _m, a: (a[0].float(),)))
        try:
            with torch.no_grad():
                return torch.log_softmax(model(ids).logits[0].float(), -1)
        finally:
            for handle in handles:
                handle.remove()

    reference = logprobs(lambda _i, hidden: hidden)
    top2 = reference.topk(2, -1).indices

    print(f"{MODEL}, {ids.shape[1]} positions teacher-forced, one torch thread\n")
    print(f"{'route':38} {'gap err max':>11} {'p99.5':>7} {'flips':>7} {'flip gap max':>12}")
    for name, dtype, head_layers in (
        ("every layer bfloat16", torch.bfloat16, len(layers)),
        ("bfloat16 layers 0-14, float32 after", torch.bfloat16, 15),
        ("every layer float16", torch.float16, len(layers)),
    ):
        # Casting back to float32 would keep the rounded weights: restore the originals.
        originals = [layers[index].state_dict() for index in range(head_layers)]
        originals = [{k: v.clone() for k, v in state.items()} for state in originals]
        for index in range(head_layers):
            layers[index].to(dtype)

        def rounded(index: int, hidden: Any, dtype: Any = dtype, head: int = head_layers) -> Any:
            return hidden.to(dtype if index < head else torch.float32)

        other = logprobs(rounded)
        for index, state in enumerate(originals):
            layers[index].float()
            layers[index].load_state_dict(state)
        ref_gap = reference.gather(1, top2)
        other_gap = other.gather(1, top2)
        error = ((ref_gap[:, 0] - ref_gap[:, 1]) - (other_gap[:, 0] - other_gap[:, 1])).abs()
        gaps = _flip_gaps(torch, reference, other)
        print(
            f"{name:38} {error.max().item():11.3f} {torch.quantile(error, 0.995).item():7.3f}"
            f" {len(gaps):3d}/{len(error):3d} {max(gaps or [0.0]):12.3f}"
        )

    print(
        f"\nnoise into layer {NOISE_INTO_LAYER}    flips    "
        + "  ".join(f"within {margin}" for margin in MARGINS)
    )
    for scale in (5.0, 1.0, 0.5):

        def noisy(index: int, hidden: Any, scale: float = scale) -> Any:
            if index != NOISE_INTO_LAYER:
                return hidden
            return hidden + scale * torch.randn_like(hidden)

        gaps = _flip_gaps(torch, reference, logprobs(noisy), listed_only=True)
        within = "  ".join(
            f"{sum(g <= margin for g in gaps if g is not None):>{len(f'within {margin}')}}"
            for margin in MARGINS
        )
        print(f"scale {scale:<17} {len(gaps):3d}/{ids.shape[1]:3d}  {within}")
    tiny_probe(args.seeds)


def tiny_probe(seeds: int) -> None:
    import django
    import torch
    from transformers import LlamaForCausalLM

    django.setup()
    from nodes_app.protocol.logprobs import TokenLogprob, TopLogprob
    from nodes_app.runtime.tiny import tiny_config, tiny_state_dict
    from nodes_app.tokenization import tiny_tokenizer
    from routing_app.probing import ProbeAnswer, probe_answers_compare
    from tracker_app.probes import PROBE_MAX_TOKENS, PROBE_MESSAGES, PROBE_TOP_LOGPROBS

    model = LlamaForCausalLM(tiny_config())
    model.load_state_dict(tiny_state_dict())
    model.eval()
    chat: Any = tiny_tokenizer().apply_chat_template(PROBE_MESSAGES, add_generation_prompt=True)
    prompt: list[int] = list(chat if isinstance(chat, list) else chat["input_ids"])

    def entry(scores: Any) -> TokenLogprob:
        values, indices = scores.topk(PROBE_TOP_LOGPROBS)
        pairs = zip(values.tolist(), indices.tolist(), strict=True)
        top = tuple(TopLogprob(f"<{i}>", v, ()) for v, i in pairs)
        return TokenLogprob(top[0].token, top[0].logprob, (), top)

    def probe(scale: float, seed: int) -> ProbeAnswer:
        noise = torch.Generator().manual_seed(seed)

        def corrupt(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            hidden = kwargs["hidden_states"] if not args else args[0]
            hidden = hidden + scale * torch.randn(hidden.shape, generator=noise)
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}

        handle = model.model.layers[2].register_forward_pre_hook(corrupt, with_kwargs=True)
        ids: list[int] = list(prompt)
        entries: list[TokenLogprob] = []
        try:
            with torch.no_grad():
                for _ in range(PROBE_MAX_TOKENS):
                    logits = model(torch.tensor([ids])).logits[0, -1].float()
                    entries.append(entry(torch.log_softmax(logits, -1)))
                    ids.append(int(logits.argmax()))
        finally:
            handle.remove()
        return ProbeAnswer(token_ids=tuple(ids[len(prompt) :]), logprobs=tuple(entries))

    honest = probe(0.0, 0)
    print(f"\ntiny-random-llama, the probe, {seeds} noise seeds into layer {NOISE_INTO_LAYER}")
    for scale in (5.0, 1.0):
        answers = [probe(scale, seed) for seed in range(seeds)]
        same = sum(answer.token_ids == honest.token_ids for answer in answers)
        agreeing = sum(probe_answers_compare(honest, answer).agree for answer in answers)
        print(f"scale {scale}: token-identical {same}, agreeing under the rule {agreeing}")


def _flip_gaps(torch: Any, reference: Any, other: Any, *, listed_only: bool = False) -> list[Any]:
    """At each position where the greedy token differs, the summed gap (None: a token unlisted)."""
    gaps: list[Any] = []
    for position in (reference.argmax(-1) != other.argmax(-1)).nonzero().flatten().tolist():
        a, b = reference[position], other[position]
        x, y = int(a.argmax()), int(b.argmax())
        listed = y in a.topk(TOP).indices.tolist() and x in b.topk(TOP).indices.tolist()
        summed = float((a[x] - a[y]).clamp(min=0) + (b[y] - b[x]).clamp(min=0))
        gaps.append(summed if listed or not listed_only else None)
    return gaps


if __name__ == "__main__":
    main()
