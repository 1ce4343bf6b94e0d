"""A head's draft model (ADR-0028): a smaller model of the same tokenizer, loaded whole.

The head runs it on its own device to guess the model's next tokens
(``head.drafts.DraftModel``); the route verifies every guess, so a draft
changes how fast an answer comes, never what it is. What it must share with
the model is what each token id means: its tokenizer's vocabulary is
compared with the model's before any of its weights is read.
"""

from __future__ import annotations

from typing import Any

import torch

from nodes_app.runtime.loading.shard import LoadedShard, load_config, load_shard, load_tokenizer
from nodes_app.shared.model_errors import ModelSourceError
from nodes_app.shared.sources import ModelSource
from nodes_app.shared.tokenization import vocabulary_difference


def load_draft(
    *,
    key: str,
    source: ModelSource,
    tokenizer: Any,
    device: str = "cpu",
    dtype: torch.dtype | str | None = None,
    quantize: str = "none",
) -> LoadedShard:
    """Every layer of the draft model at ``source``, with its embeddings and LM head.

    In the head's precision (``dtype``, ``quantize``). Raises
    :class:`ModelSourceError` when its tokenizer's vocabulary is not
    ``tokenizer``'s (the model's), or its weights do not load.
    """
    difference = vocabulary_difference(tokenizer, load_tokenizer(source))
    if difference is not None:
        raise ModelSourceError(
            f"draft model {key} has another tokenizer than the model's ({difference}): "
            "a draft must share the model's tokenizer"
        )
    layers = int(load_config(source).num_hidden_layers)
    return load_shard(
        model_key=key,
        source=source,
        start=0,
        end=layers - 1,
        device=device,
        dtype=dtype,
        quantize=quantize,
        with_tokenizer=False,
        progress=False,
    )
