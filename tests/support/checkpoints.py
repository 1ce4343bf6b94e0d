"""Tiny random-weight checkpoints of every decoder family Meshnet serves, made at test time.

The way transformers tests itself: a family's config shrunk to a hidden size
of 64 and six layers (few experts, short sliding windows and attention
chunks, so a short generation crosses them), a model built from it with a
fixed seed, ``save_pretrained`` into a directory beside the byte-level tiny
tokenizer. Nothing is downloaded; each checkpoint takes a second or two.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from nodes_app.shared.tokenization import TINY_VOCAB_SIZE, tiny_tokenizer

SEED = 20261202
LAYERS = 6
# A window or chunk this short is crossed by a prompt plus a dozen tokens.
WINDOW = 8

_COMMON: dict[str, Any] = {
    "vocab_size": TINY_VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "pad_token_id": 256,
    "eos_token_id": 258,
    "bos_token_id": None,
}
_MOE: dict[str, Any] = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
_LINEAR: dict[str, Any] = {
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "shared_expert_intermediate_size": 32,
    # Layers 0-2 linear attention, 3 full, 4-5 linear: splits fall on both kinds.
    "full_attention_interval": 4,
}

# Per family: what differs from _COMMON (None removes a key the family does not take).
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": WINDOW},
    "qwen2": {},
    "qwen3": {},
    "qwen3_moe": {**_MOE, "decoder_sparse_step": 1},
    "qwen3_next": {**_MOE, **_LINEAR},
    "qwen3_5_moe_text": {**_MOE, **_LINEAR},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "gemma2": {"sliding_window": WINDOW},
    "gemma3_text": {"sliding_window": WINDOW, "sliding_window_pattern": 2},
    "gemma4_text": {
        "sliding_window": WINDOW,
        "global_head_dim": 32,
        "vocab_size_per_layer_input": TINY_VOCAB_SIZE,
        "hidden_size_per_layer_input": 8,
    },
    "phi3": {},
    "olmo2": {},
    "granite": {
        "embedding_multiplier": 2.0,
        "residual_multiplier": 0.5,
        "attention_multiplier": 0.2,
        "logits_scaling": 4.0,
    },
    "smollm3": {"no_rope_layer_interval": 3},
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW},
    "deepseek_v3": {
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "n_shared_experts": 1,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
        "head_dim": 8,
        # Latent attention expands K/V to every head (real DeepSeek configs say so too).
        "num_key_value_heads": 4,
    },
    "llama4_text": {
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "intermediate_size_mlp": 128,
        "attention_chunk_size": WINDOW,
        "interleave_moe_layer_step": 1,
    },
}


def tiny_family_config(model_type: str) -> PretrainedConfig:
    """The shrunk config of ``model_type`` (a key of :data:`FAMILIES`)."""
    overrides = {**_COMMON, **FAMILIES[model_type]}
    return AutoConfig.for_model(
        model_type, **{key: value for key, value in overrides.items() if value is not None}
    )


def tiny_checkpoint(model_type: str, directory: Path) -> Path:
    """``directory`` holding a seeded random checkpoint of ``model_type`` and the tiny tokenizer."""
    config = tiny_family_config(model_type)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        # Random init leaves many weights tiny: widen them so layers and experts matter.
        for parameter in model.parameters():
            parameter.data.normal_(0.0, 0.2)
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def with_other_vocabulary(directory: Path) -> Path:
    """``directory``'s tokenizer with the ids of ``a`` and ``b`` swapped: as many tokens,
    two of them meaning another id (a model that cannot draft for the tiny tokenizer's)."""
    path = directory / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    path.write_text(json.dumps(tokenizer))
    return directory


# A chat template that renders tools itself and writes calls as Hermes-style blocks, as
# the Qwen2.5/Qwen3 templates do (written for these tests, in their format).
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "You may call these functions:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    "For each call, answer <tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{%- elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content }}"
    "{%- for call in message.tool_calls or [] %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role != 'system' %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def with_tools_template(directory: Path) -> Path:
    """``directory``'s tokenizer given :data:`TOOLS_TEMPLATE` as its chat template."""
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TOOLS_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


def transformers_greedy(
    directory: Path, prompt: list[int], tokens: int
) -> tuple[list[int], torch.Tensor]:
    """Transformers' own greedy ``generate`` on the whole checkpoint: the tokens and their logits.

    The logits ``[tokens, vocab]`` are the model's raw logits at each step (float32).
    """
    return transformers_greedy_each(directory, [prompt], tokens)[0]


def transformers_greedy_each(
    directory: Path, prompts: list[list[int]], tokens: int
) -> list[tuple[list[int], torch.Tensor]]:
    """:func:`transformers_greedy` of each prompt alone, the checkpoint loaded once."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    answers = []
    for prompt in prompts:
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=tokens,
            do_sample=False,
            eos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
        )
        answers.append((out.sequences[0, len(prompt) :].tolist(), torch.cat(out.logits).float()))
    return answers
