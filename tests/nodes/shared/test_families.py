"""The served families and the reasons a checkpoint outside them is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nodes_app.shared.families import GGUF_ARCHITECTURES, SUPPORTED_FAMILIES, family_refusal

ROOT = Path(__file__).resolve().parents[3]


def test_every_served_family_is_accepted_with_its_default_config() -> None:
    assert len(SUPPORTED_FAMILIES) == 18
    assert all(family_refusal(model_type, {}) is None for model_type in SUPPORTED_FAMILIES)


def test_an_unknown_model_type_is_refused_naming_it_and_the_served_ones() -> None:
    reason = family_refusal("gpt2", {"model_type": "gpt2"})

    assert reason is not None
    assert "'gpt2'" in reason
    assert "qwen3_moe" in reason and "llama4_text" in reason


def test_gemma4_with_kv_shared_layers_is_refused_for_kv_sharing() -> None:
    assert family_refusal("gemma4_text", {"num_kv_shared_layers": 0}) is None

    reason = family_refusal("gemma4_text", {"num_kv_shared_layers": 20})

    assert reason is not None and "KV sharing across layers" in reason


def test_a_vision_language_checkpoint_is_refused_naming_its_text_model() -> None:
    reason = family_refusal("qwen3_5_moe", {"text_config": {"model_type": "qwen3_5_moe_text"}})

    assert reason is not None
    assert "vision-language" in reason and "'qwen3_5_moe_text'" in reason


def test_every_gguf_architecture_maps_to_a_served_family() -> None:
    assert set(GGUF_ARCHITECTURES.values()) <= set(SUPPORTED_FAMILIES)


def test_the_family_list_loads_without_django_or_torch() -> None:
    script = (
        "import sys, nodes_app.shared.families\n"
        "print(sorted({'django', 'torch', 'transformers'} & set(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )

    assert result.stdout.strip() == "[]"
