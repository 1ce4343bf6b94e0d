"""The decoder families the node runtime serves, and why a checkpoint outside them is refused.

The one list of what Meshnet serves: ``add_model`` and the admin refuse what
is not here, and the runtime refuses it at start-up, both with the reason
:func:`family_refusal` gives. Plain data, free of Django and torch, so the
tracker and the runtime both import it.

A family is named by its transformers ``model_type`` (``config.json``'s
``model_type``). A GGUF file names its architecture in llama.cpp's words;
:data:`GGUF_ARCHITECTURES` says which family transformers loads each as.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SUPPORTED_FAMILIES: dict[str, str] = {
    "llama": "Llama 2/3 (dense)",
    "mistral": "Mistral (dense, sliding-window attention)",
    "qwen2": "Qwen2 / Qwen2.5 (dense)",
    "qwen3": "Qwen3 (dense)",
    "qwen3_moe": "Qwen3 mixture of experts",
    "qwen3_next": "Qwen3-Next (mixture of experts, Gated-DeltaNet linear + full attention)",
    "qwen3_5_moe_text": "Qwen3.5/3.6 MoE text model (linear + full attention)",
    "mixtral": "Mixtral (mixture of experts)",
    "gemma2": "Gemma 2 (local/global attention, logit softcapping)",
    "gemma3_text": "Gemma 3 text model (local/global attention)",
    "gemma4_text": "Gemma 4 text model (per-layer token embeddings)",
    "phi3": "Phi-3 / Phi-4 (dense)",
    "olmo2": "OLMo 2 (dense)",
    "granite": "IBM Granite (dense, scaled residuals)",
    "smollm3": "SmolLM3 (dense, some layers without rotary positions)",
    "gpt_oss": "GPT-OSS (mixture of experts, attention sinks)",
    "deepseek_v3": "DeepSeek-V3 (multi-head latent attention, mixture of experts)",
    "llama4_text": "Llama 4 text model (chunked attention, mixture of experts)",
}

# llama.cpp's ``general.architecture`` → the model_type transformers loads it as,
# for the GGUF architectures whose tensors the node's GGUF reader maps (the
# dense Llama layout; a "llama" file whose name says Mistral loads as mistral).
# GGUF files of the other families (fused expert tensors, Gemma's norms) are
# refused until a test reads one: serve those from a Hugging Face directory.
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
}

# Vision-language checkpoints whose text model is a served family: saved on
# its own (``model_type`` the text family, a ``…ForCausalLM``), it is served.
_MULTIMODAL_TEXT_MODELS: dict[str, str] = {
    "qwen3_5_moe": "qwen3_5_moe_text",
    "gemma3": "gemma3_text",
    "gemma4": "gemma4_text",
    "llama4": "llama4_text",
}


def family_refusal(model_type: str, config: Mapping[str, Any]) -> str | None:
    """Why the runtime cannot serve a checkpoint of ``model_type``, or None when it can.

    ``config`` is the checkpoint's config (``config.json`` as a dict, or what a
    GGUF file's metadata says of the same settings). The reason is one
    sentence for an operator: it names the model type or the setting at fault.
    """
    if model_type in _MULTIMODAL_TEXT_MODELS:
        text = _MULTIMODAL_TEXT_MODELS[model_type]
        return (
            f"model type {model_type!r} is a vision-language checkpoint; Meshnet serves "
            f"causal language models only: save its text model on its own ({text!r}) "
            "and add that"
        )
    if model_type not in SUPPORTED_FAMILIES:
        supported = ", ".join(SUPPORTED_FAMILIES)
        return f"model type {model_type!r} is not served (served: {supported})"
    if model_type == "gemma4_text" and (config.get("num_kv_shared_layers") or 0) > 0:
        # Shared layers read the K/V an earlier layer computed, which may sit on another node.
        return (
            f"model type 'gemma4_text' with num_kv_shared_layers="
            f"{config['num_kv_shared_layers']} is not served: KV sharing across layers"
        )
    return None
