"""Model families as small declared adapters over transformers' own decoder modules.

The runner (:mod:`nodes_app.runtime.engine.runner`) runs any family's layers the same
way: embed (the head), each layer with its position embeddings, mask and
per-session state, and finish (the last hop). What differs between families
is declared here, never branched on in the runner:

- **how it embeds**: the embedding module itself (Gemma's scale by
  √hidden lives in transformers' scaled embedding), times a multiplier from
  the config (Granite);
- **which position embeddings each layer type takes**: one rotary for every
  layer, or one per layer type (Gemma 3/4: local and global rotary bases);
  layers without rotary (SmolLM3's and Llama 4's NoPE layers) ignore it
  inside transformers' own attention;
- **which attention implementation it needs**: ``sdpa`` unless the family's
  attention does what SDPA cannot (Gemma 2's logit softcapping, GPT-OSS's
  attention sinks: ``eager``, with an additive float mask);
- **which state each layer keeps**: by its layer type — K/V over the whole
  past (``full_attention``), over a window (``sliding_attention``), within a
  chunk (``chunked_attention``), or a convolution and a recurrent state
  (``linear_attention``, Gated DeltaNet);
- **what a layer takes beyond the hidden states**: Gemma 4's per-layer
  embedding of the step's token ids, which every hop computes itself;
- **each layer's K/V widths** (what a session reserves): Gemma 4's wide
  global heads, DeepSeek's compressed latent;
- **whether the rows of a batch must share their past** (Llama 4's NoPE
  layers read it off the cache);
- **how the last hop finishes**: final norm and LM head, then a logit scale
  (Granite) or tanh softcapping (Gemma).

Which model types are served is declared once, torch-free, in
:mod:`nodes_app.shared.families`; :data:`FAMILIES` holds an adapter for each of
them, and anything else is refused at start with the reason
(:func:`family_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import PretrainedConfig

from nodes_app.shared.families import family_refusal
from nodes_app.shared.model_errors import UnsupportedModelError

AttentionImplementation = Literal["sdpa", "eager"]

# The per-layer state kinds the runner keeps per session (see kv.py), by layer type.
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
LINEAR_ATTENTION = "linear_attention"
LINEAR_LAYER_TYPES = frozenset({LINEAR_ATTENTION})
LAYER_TYPES = ATTENTION_LAYER_TYPES | LINEAR_LAYER_TYPES


@dataclass(frozen=True)
class Family:
    """What one decoder family needs of the runner beyond calling its layers in order."""

    model_type: str
    attention: AttentionImplementation = "sdpa"
    # Gemma 3/4: the rotary module takes the layer type (local and global bases).
    rotary_by_layer_type: bool = False
    # Granite: embeddings × ``config.embedding_multiplier``; logits ÷ ``config.logits_scaling``.
    scaled_io: bool = False
    # Gemma 4: every layer also takes a per-layer embedding of the token ids.
    per_layer_inputs: bool = False
    # Llama 4: NoPE layers read the past length off the cache (attention temperature),
    # so the rows of one batched forward must share it.
    rows_share_past: bool = False

    def layer_type(self, config: PretrainedConfig, index: int) -> str:
        """Layer ``index``'s type, which decides its mask and the state it keeps."""
        types = getattr(config, "layer_types", None)
        if types:
            return str(types[index])
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
            return "sliding_attention"
        return "full_attention"

    def kv_dims(self, config: PretrainedConfig, index: int) -> tuple[int, int, int]:
        """Layer ``index``'s K/V per position: (heads, key head dim, value head dim).

        Read from the layer's own config where a family varies it per layer
        (Gemma 4's global layers have wider heads); multi-head latent
        attention (DeepSeek V3) keeps one compressed latent and one rotary
        key per position, which transformers' layer hands the cache as K and V.
        """
        layers = getattr(config, "per_layer_config", None)
        layer = layers[index] if layers else config
        if getattr(config, "kv_lora_rank", None):
            return 1, int(config.kv_lora_rank), int(config.qk_rope_head_dim)
        heads = int(getattr(layer, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = int(
            getattr(layer, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        return heads, head_dim, head_dim

    def embed(
        self, embed_tokens: torch.nn.Module, config: PretrainedConfig, ids: torch.Tensor
    ) -> torch.Tensor:
        """Input embeddings ``[N, T, H]`` of token ids ``[N, T]`` (the head only)."""
        embeddings = embed_tokens(ids)
        if self.scaled_io:
            embeddings = embeddings * config.embedding_multiplier
        return embeddings

    def position_embeddings(
        self,
        rotary: torch.nn.Module,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        kinds: set[str],
    ) -> dict[str, Any]:
        """Each layer type's position embeddings for ``position_ids`` ``[N, T]``."""
        if self.rotary_by_layer_type:
            return {kind: rotary(hidden, position_ids, kind) for kind in kinds}
        shared = rotary(hidden, position_ids)
        return dict.fromkeys(kinds, shared)

    def per_layer_embeddings(self, decoder: Any, ids: torch.Tensor) -> torch.Tensor | None:
        """Gemma 4: each layer's own embedding of token ids ``[N, T]``: ``[N, T, layers, P]``.

        Computed by transformers' own decoder methods from the ids and their
        input embeddings, on whichever hop runs the layers: a hop is sent the
        step's ids beside the hidden states (``ForwardStep.token_ids``).
        ``None`` for every other family.
        """
        if not self.per_layer_inputs:
            return None
        embeddings = decoder.embed_tokens(ids)
        return decoder.project_per_layer_inputs(
            embeddings, decoder.get_per_layer_inputs(ids, embeddings)
        )

    def finish(self, config: PretrainedConfig, logits: torch.Tensor) -> torch.Tensor:
        """The model's logits from the LM head's output (float32)."""
        if self.scaled_io:
            logits = logits / config.logits_scaling
        cap = getattr(config, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        Family("llama"),
        Family("mistral"),
        Family("qwen2"),
        Family("qwen3"),
        Family("qwen3_moe"),
        Family("qwen3_next"),
        Family("qwen3_5_moe_text"),
        Family("mixtral"),
        Family("gemma2", attention="eager"),
        Family("gemma3_text", rotary_by_layer_type=True),
        Family("gemma4_text", rotary_by_layer_type=True, per_layer_inputs=True),
        Family("phi3"),
        Family("olmo2"),
        Family("granite", scaled_io=True),
        Family("smollm3"),
        Family("gpt_oss", attention="eager"),
        Family("deepseek_v3"),
        Family("llama4_text", rows_share_past=True),
    )
}


def family_of(config: PretrainedConfig) -> Family:
    """The adapter for ``config``'s model type; refuses what the runner cannot serve, saying why.

    What is served, and why anything else is refused, is declared once in
    :mod:`nodes_app.shared.families` (``add_model`` and the admin say the same).
    """
    model_type = str(getattr(config, "model_type", "?"))
    refusal = family_refusal(model_type, config.to_dict())
    if refusal is not None:
        raise UnsupportedModelError(refusal)
    family = FAMILIES[model_type]
    for index in range(int(config.num_hidden_layers)):
        kind = family.layer_type(config, index)
        if kind not in LAYER_TYPES:
            raise UnsupportedModelError(f"layer {index} has unsupported attention type {kind!r}")
    return family
