"""The catalogue's ``tiny-random-llama``: a 4-layer Llama built in code from a fixed seed.

Every process that builds it holds identical weights, so split-versus-whole
comparisons across node processes are exact. Its tokenizer is byte-level
(one token per UTF-8 byte, plus three ChatML specials) and built without any
download, so multi-byte characters really do span several tokens; it lives in
the torch-free ``nodes_app.shared.tokenization``, which the tracker loads too.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nodes_app.shared.tokenization import TINY_CONTEXT_LENGTH, TINY_VOCAB_SIZE, tiny_tokenizer

__all__ = ["SEED", "VOCAB_SIZE", "tiny_config", "tiny_state_dict", "tiny_tokenizer"]

SEED = 20260101
VOCAB_SIZE = TINY_VOCAB_SIZE


def tiny_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_CONTEXT_LENGTH,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        tie_word_embeddings=False,
        bos_token_id=None,
        pad_token_id=256,
        eos_token_id=258,
    )


def tiny_state_dict() -> dict[str, torch.Tensor]:
    """The full model's weights, identical in every process (seeded, CPU, float32)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(tiny_config()).float()
    weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    # Shrink the LM head rows of bytes that are not printable ASCII (keeping EOS):
    # the best of 95 printable logits then wins, so greedy output reads as text.
    keep = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    keep[32:127] = True
    keep[10] = True
    keep[VOCAB_SIZE - 1] = True
    weights["lm_head.weight"][~keep] *= 0.01
    return weights
