"""How far rounding and corruption move the probe's near-tie gap, SmolLM2 on CPU (ADR-0015).

The probe's rule (``routing_app.exclusions.probe_verdicts.probe_answers_compare``) lets two
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
  what rounding does. A seeded sampled answer parts where the exponential
  race ``torch.multinomial`` runs picks another token, which may be any
  token the sampler could draw: "any pair" is the largest gap error
  between two tokens the reference gives at least ``1e-4`` of probability.
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

Rounding depends on the CPU's kernels: ``--kernels avx2`` runs the ones
torch takes on a CPU without AVX-512 (its AVX2 vector kernels, MKL's and
oneDNN's AVX2 code, bfloat16 matrix products through torch's own GEMM
rather than oneDNN's), so both kinds are measured on one machine.

    .venv/bin/python bench/bench_probe_margin.py [--positions 400] [--seeds 200]
        [--kernels native|avx2]
"""

from __future__ import annotations

import argparse
import math
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
# A token a sampler draws this rarely or less is left out of "any pair".
DRAWN = 1e-4
# What a CPU without AVX-512 runs: set before torch loads (oneDNN's bfloat16
# products are switched off in-process: torch takes them only with AVX-512).
AVX2_KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--positions", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--kernels", choices=("native", "avx2"), default="native")
    args = parser.parse_args()
    if args.kernels == "avx2" and any(os.environ.get(k) != v for k, v in AVX2_KERNELS.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **AVX2_KERNELS})

    import torch

    if args.kernels == "avx2":
        torch.backends.mkldnn.set_flags(False)

    from nodes_app.runtime.loading.shard import load_causal_lm, load_tokenizer
    from nodes_app.shared.sources import resolve_source

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
    logprobs, reference = rounding_table(torch, model, ids, MODEL, head_layers=15)

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

    from transformers import LlamaForCausalLM

    from nodes_app.runtime.loading.tiny import tiny_config, tiny_state_dict
    from nodes_app.shared.tokenization import tiny_tokenizer

    tiny: Any = LlamaForCausalLM(tiny_config())
    tiny.load_state_dict(tiny_state_dict())
    tiny.eval()
    tiny_ids = tiny_tokenizer()(text, return_tensors="pt")["input_ids"][:, : args.positions]
    print()
    rounding_table(torch, tiny, tiny_ids, "tiny-random-llama", head_layers=2)
    tiny_probe(args.seeds)


def rounding_table(
    torch: Any, model: Any, ids: Any, name: str, *, head_layers: int
) -> tuple[Callable[[Callable[[int, Any], Any]], Any], Any]:
    """Print how far each precision's route moves the gaps against float32's; returns the
    reader of ``ids`` through ``model`` (log-softmax at every position, ``entry(i, hidden)``
    applied as layer i's input) and float32's read."""
    layers = model.model.layers

    def logprobs(entry: Callable[[int, Any], Any]) -> Any:
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
    print(
        f"{name}, {ids.shape[1]} positions teacher-forced, one torch thread, "
        f"{torch.backends.cpu.get_cpu_capability()} kernels\n"
    )
    print(
        f"{'route':38} {'gap err max':>11} {'p99.5':>7} {'any pair':>8} {'flips':>7}"
        f" {'flip gap max':>12}"
    )
    head = f"layers 0-{head_layers - 1}"
    for name, dtype, rounded_layers in (
        ("every layer bfloat16", torch.bfloat16, len(layers)),
        (f"bfloat16 {head}, float32 after", torch.bfloat16, head_layers),
        ("every layer float16", torch.float16, len(layers)),
        (f"float16 {head}, float32 after", torch.float16, head_layers),
    ):
        # Casting back to float32 would keep the rounded weights: restore the originals.
        originals = [layers[index].state_dict() for index in range(rounded_layers)]
        originals = [{k: v.clone() for k, v in state.items()} for state in originals]
        for index in range(rounded_layers):
            layers[index].to(dtype)

        def rounded(index: int, hidden: Any, dtype: Any = dtype, head: int = rounded_layers) -> Any:
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
            f" {_any_pair_error(torch, reference, other):8.3f}"
            f" {len(gaps):3d}/{len(error):3d} {max(gaps or [0.0]):12.3f}"
        )
    return logprobs, reference


def tiny_probe(seeds: int) -> None:
    import django
    import torch
    from transformers import LlamaForCausalLM

    django.setup()
    from nodes_app.protocol.logprobs import TokenLogprob, TopLogprob
    from nodes_app.protocol.sampling import SamplingParams
    from nodes_app.runtime.engine.sampler import new_generator, sample_token
    from nodes_app.runtime.loading.tiny import tiny_config, tiny_state_dict
    from nodes_app.shared.tokenization import tiny_tokenizer
    from routing_app.exclusions.probe_verdicts import ProbeAnswer, probe_answers_compare
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

    layers = model.model.layers

    def answer(
        seed: int, *, scale: float = 0.0, head: Any = None, temperature: float = 0.0
    ) -> ProbeAnswer:
        """The probe's answer from a float32 route; with ``scale``, noise into layer 2; with
        ``head`` (a dtype), layers 0-1 compute in it; sampled with ``seed`` at ``temperature``."""
        noise = torch.Generator().manual_seed(seed)
        sampling = SamplingParams(temperature=temperature, seed=seed)
        draws = new_generator(seed)

        def entering(index: int) -> Callable[..., Any]:
            def cast(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                hidden = kwargs["hidden_states"] if not args else args[0]
                if index == NOISE_INTO_LAYER and scale:
                    hidden = hidden + scale * torch.randn(hidden.shape, generator=noise)
                if head is not None:
                    hidden = hidden.to(head if index < NOISE_INTO_LAYER else torch.float32)
                    kwargs["position_embeddings"] = tuple(
                        t.to(hidden.dtype) for t in kwargs["position_embeddings"]
                    )
                if args:
                    return (hidden, *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": hidden}

            return cast

        originals = [layers[index].state_dict() for index in range(NOISE_INTO_LAYER)]
        originals = [{k: v.clone() for k, v in state.items()} for state in originals]
        if head is not None:
            for index in range(NOISE_INTO_LAYER):
                layers[index].to(head)
        handles = [
            layer.register_forward_pre_hook(entering(index), with_kwargs=True)
            for index, layer in enumerate(layers)
        ]
        ids: list[int] = list(prompt)
        entries: list[TokenLogprob] = []
        try:
            with torch.no_grad():
                for _ in range(PROBE_MAX_TOKENS):
                    logits = model(torch.tensor([ids])).logits[0, -1].float()
                    entries.append(entry(torch.log_softmax(logits, -1)))
                    ids.append(sample_token(logits, sampling, draws))
        finally:
            for handle in handles:
                handle.remove()
            for index, state in enumerate(originals):
                layers[index].float()
                layers[index].load_state_dict(state)
        return ProbeAnswer(
            token_ids=tuple(ids[len(prompt) :]), logprobs=tuple(entries), rounded=head is not None
        )

    honest = answer(0)
    print(f"\ntiny-random-llama, the probe, {seeds} noise seeds into layer {NOISE_INTO_LAYER}")
    for scale in (5.0, 1.0):
        answers = [answer(seed, scale=scale) for seed in range(seeds)]
        same = sum(answer.token_ids == honest.token_ids for answer in answers)
        agreeing = sum(probe_answers_compare(honest, answer).agree for answer in answers)
        print(f"scale {scale}: token-identical {same}, agreeing under the rule {agreeing}")
    print(
        f"\ntiny-random-llama, {seeds} seeded answers sampled at temperature 1, float32 against"
        " an honest head of layers 0-1 in another precision"
    )
    for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        pairs = [
            (answer(seed, temperature=1.0), answer(seed, head=dtype, temperature=1.0))
            for seed in range(seeds)
        ]
        parted = [(a, b) for a, b in pairs if a.token_ids != b.token_ids]
        unlisted = sum(
            probe_answers_compare(a, b, margin=math.inf).tie_gap is None for a, b in parted
        )
        agreeing = sum(probe_answers_compare(a, b, margin=math.inf).agree for a, b in pairs)
        print(
            f"{name:9} parted {len(parted)} ({unlisted} at a token the other did not list),"
            f" agreeing under the rule {agreeing}"
        )


def _any_pair_error(torch: Any, reference: Any, other: Any) -> float:
    """The largest change in the logit difference of two tokens both drawn at least ``DRAWN``."""
    drawn = reference.exp() >= DRAWN
    change = other - reference
    high = change.masked_fill(~drawn, -torch.inf).max(-1).values
    low = change.masked_fill(~drawn, torch.inf).min(-1).values
    return float((high - low).max())


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
