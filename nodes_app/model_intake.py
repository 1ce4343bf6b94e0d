"""Adding a model the network may serve, from its weights: what ``add_model`` and the admin call.

:func:`model_weights_read` reads what the tracker must know of a checkpoint
(its family, layer count and context length) from the weights themselves —
``config.json`` of a Hugging Face directory, or a GGUF file's metadata — and
checks that the runtime serves its family (``nodes_app.shared.families``), that its
shape is one a real model has (:data:`SHAPE_BOUNDS`) and that its tokenizer
loads. :func:`language_model_add` then creates the catalogue
row, and :func:`language_model_draft_check` whether a catalogue model may
draft for it (the same tokenizer, ADR-0028). Whatever cannot be served raises
:class:`ModelRefused` with the reason. Nothing here imports torch: the
tracker runs it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from meshnet_site.errors import DomainError, ErrorKind
from nodes_app.models import LanguageModel, TopologyEpoch
from nodes_app.shared.families import GGUF_ARCHITECTURES, family_refusal
from nodes_app.shared.model_errors import ModelSourceError
from nodes_app.shared.sources import ModelSource, parse_source
from nodes_app.shared.tokenization import (
    TokenizerUnavailable,
    model_text_load,
    model_text_of,
    read_gguf_metadata,
    vocabulary_difference,
)

# A checkpoint is input, not trusted code: the shape its config declares is held to
# bounds above the largest published model of every served family (2026-12: layers
# 126, Llama 3.1 405B; hidden size 16,384, the same; vocabulary 262,144, Gemma 3;
# context 10,485,760 tokens, Llama 4 Scout). A shape past one is refused, the bound
# in the reason: the tracker sizes nothing by it, and nodes could never serve it.
SHAPE_BOUNDS: dict[str, int] = {
    "layers": 256,
    "hidden size": 65_536,
    "vocabulary": 1_048_576,
    "context length": 16_777_216,
}


class ModelRefused(DomainError):
    """A model that cannot be added: the message says why (family, files, tokenizer, key)."""

    kind = ErrorKind.INVALID
    code = "model_refused"


class ModelKeyTaken(ModelRefused):
    """The key already names a model served from other weights."""

    kind = ErrorKind.CONFLICT
    code = "model_key_taken"


@dataclass(frozen=True)
class ModelWeights:
    """What the tracker knows of a checkpoint, read from its files.

    ``weight_source`` is the source string to store: a path made absolute, or
    the ``package:``/``gguf:`` spec as given.
    """

    weight_source: str
    model_type: str
    num_layers: int
    context_length: int | None


def model_weights_read(*, weight_source: str) -> ModelWeights:
    """The family, layer count and context length of the checkpoint at ``weight_source``.

    Raises :class:`ModelRefused` when the source is missing or unreadable,
    its family or a setting of its config is not served, or its tokenizer
    does not load.
    """
    spec = weight_source.strip()
    if not spec:
        raise ModelRefused("no weights given: a directory with config.json, or a .gguf file")
    try:
        source = parse_source(spec)
    except ModelSourceError as error:
        raise ModelRefused(str(error)) from None
    if source.kind == "gguf":
        weights = _gguf_weights(Path(source.location), spec)
    elif source.kind == "directory":
        weights = _directory_weights(Path(source.location))
    else:
        raise ModelRefused(
            f"{spec!r} is not local weights: give a directory with config.json and "
            "*.safetensors, or a .gguf file (nothing is downloaded)"
        )
    _check_tokenizer(source)
    return weights


def language_model_add(
    *,
    key: str,
    weight_source: str,
    display_name: str = "",
    prompt_price_per_1k: Decimal = Decimal("0"),
    completion_price_per_1k: Decimal = Decimal("0"),
    draft: str | None = None,
) -> LanguageModel:
    """Add the model ``key`` served from ``weight_source``, reading its shape from the weights.

    ``draft``: the key of a catalogue model its heads run to guess its next
    tokens (:func:`language_model_draft_check`); set on the row even when it
    exists already. Idempotent: when ``key`` already names the same weights,
    that row is returned unchanged but for ``draft`` (names and prices
    edited since stay). Raises :class:`ModelKeyTaken` when ``key`` names
    other weights, and :class:`ModelRefused` for whatever
    :func:`model_weights_read` or the draft check refuses, or a negative price.
    """
    _check_key(key)
    for label, price in (("prompt", prompt_price_per_1k), ("completion", completion_price_per_1k)):
        if not price.is_finite() or price < 0:
            raise ModelRefused(f"the {label} price must be a number of at least 0, not {price}")
    weights = model_weights_read(weight_source=weight_source)
    drafter = None
    if draft is not None:
        drafter = LanguageModel.objects.filter(key=draft).first()
        if drafter is None:
            raise ModelRefused(f"no model {draft!r} to draft with: add it first")
        language_model_draft_check(key=key, weight_source=weights.weight_source, draft=drafter)
    # The weights are read (seconds for a large tokenizer) before the transaction opens.
    with transaction.atomic():
        model, created = LanguageModel.objects.get_or_create(
            key=key,
            defaults={
                "display_name": display_name or key,
                "num_layers": weights.num_layers,
                "context_length": weights.context_length,
                "weight_source": weights.weight_source,
                "prompt_price_per_1k": prompt_price_per_1k,
                "completion_price_per_1k": completion_price_per_1k,
            },
        )
        same = (model.weight_source, model.num_layers) == (
            weights.weight_source,
            weights.num_layers,
        )
        if not created and not same:
            raise ModelKeyTaken(
                f"model {key!r} already exists with weights {model.weight_source} "
                f"({model.num_layers} layers); choose another key"
            )
        if drafter is not None and model.draft_id != drafter.pk:
            model.draft = drafter
            model.save(update_fields=["draft"])
        TopologyEpoch.objects.get_or_create(model=model)
    return model


def language_model_draft_check(*, key: str, weight_source: str, draft: LanguageModel) -> None:
    """Refuse ``draft`` as the draft model of ``key`` (weights at ``weight_source``) unless
    it is another model whose tokenizer has the same vocabulary (ADR-0028).

    Both tokenizers are loaded here, as the tracker loads them to count tokens
    (seconds for a large GGUF vocabulary); one that does not load refuses.
    """
    if draft.key == key:
        raise ModelRefused(f"model {key!r} cannot be its own draft: choose a smaller model")
    own = _tokenizer(weight_source, key)
    theirs = _tokenizer(draft.weight_source, draft.key)
    difference = vocabulary_difference(own, theirs)
    if difference is not None:
        raise ModelRefused(
            f"model {draft.key!r} has another tokenizer than {key!r} ({difference}): "
            "a draft must share the model's tokenizer"
        )


def _tokenizer(weight_source: str, key: str) -> Any:
    try:
        return model_text_load(weight_source).tokenizer
    except TokenizerUnavailable as error:
        raise ModelRefused(
            f"the tokenizer of {key!r} does not load here ({error}): a draft's is compared "
            "with the model's"
        ) from None


def _check_key(key: str) -> None:
    try:
        LanguageModel._meta.get_field("key").run_validators(key)
    except ValidationError as error:
        raise ModelRefused(f"model key {key!r}: {' '.join(error.messages)}") from None
    if not key:
        raise ModelRefused("a model key is required")


def _directory_weights(directory: Path) -> ModelWeights:
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ModelRefused(f"{directory} has no config.json")
    if not any(directory.glob("*.safetensors")):
        raise ModelRefused(f"{directory} has no *.safetensors weights")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelRefused(f"{config_file} is not readable JSON: {error}") from None
    if not isinstance(config, dict):
        raise ModelRefused(f"{config_file} does not hold a config object")
    model_type = str(config.get("model_type", ""))
    if not model_type:
        raise ModelRefused(f"{config_file} names no model_type")
    text = config.get("text_config")
    text_config = text if isinstance(text, dict) else config
    _check_shape(
        config_file,
        {
            "layers": ("num_hidden_layers", config.get("num_hidden_layers")),
            "hidden size": ("hidden_size", text_config.get("hidden_size")),
            "vocabulary": ("vocab_size", text_config.get("vocab_size")),
            "context length": (
                "max_position_embeddings",
                config.get("max_position_embeddings"),
            ),
        },
    )
    return ModelWeights(
        weight_source=str(directory.resolve()),
        model_type=_served(model_type, config),
        num_layers=_layer_count(config.get("num_hidden_layers"), config_file),
        context_length=_context_length(config.get("max_position_embeddings")),
    )


def _gguf_weights(path: Path, spec: str) -> ModelWeights:
    try:
        metadata = read_gguf_metadata(path)
    except (ModelSourceError, OSError, ValueError) as error:
        raise ModelRefused(f"{path} is not a readable GGUF file: {error}") from None
    architecture = str(metadata.get("general.architecture", ""))
    model_type = GGUF_ARCHITECTURES.get(architecture)
    if model_type is None:
        served = ", ".join(GGUF_ARCHITECTURES)
        raise ModelRefused(
            f"GGUF architecture {architecture!r} is not served "
            f"(served GGUF architectures: {served})"
        )
    _check_shape(
        path,
        {
            what: (key, metadata.get(f"{architecture}.{key}"))
            for what, key in (
                ("layers", "block_count"),
                ("hidden size", "embedding_length"),
                ("vocabulary", "vocab_size"),
                ("context length", "context_length"),
            )
        },
    )
    # The settings family_refusal looks at, under transformers' names.
    config = {"num_kv_shared_layers": metadata.get(f"{architecture}.attention.shared_kv_layers")}
    scheme = spec.partition(":")[0]
    return ModelWeights(
        weight_source=spec if scheme in ("package", "gguf") else str(path.resolve()),
        model_type=_served(model_type, config),
        num_layers=_layer_count(metadata.get(f"{architecture}.block_count"), path),
        context_length=_context_length(metadata.get(f"{architecture}.context_length")),
    )


def _served(model_type: str, config: dict[str, Any]) -> str:
    refusal = family_refusal(model_type, config)
    if refusal is not None:
        raise ModelRefused(refusal)
    return model_type


def _check_shape(where: Path, shape: dict[str, tuple[str, object]]) -> None:
    """Refuse a declared shape (``what``: (its key, its value)) past :data:`SHAPE_BOUNDS`;
    values that are absent or not integers are left to the other checks."""
    for what, (key, value) in shape.items():
        bound = SHAPE_BOUNDS[what]
        if isinstance(value, int) and not isinstance(value, bool) and value > bound:
            raise ModelRefused(
                f"{where} declares {key} = {value}: past the {bound} ({what}) of any "
                "published model of a served family; a checkpoint this size is not served"
            )


def _layer_count(value: object, where: Path) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelRefused(f"{where} states no layer count (num_hidden_layers / block_count)")
    return value


def _context_length(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _check_tokenizer(source: ModelSource) -> None:
    try:
        model_text_of(source)
    # The tokenizer is built by third-party code (tokenizers, transformers'
    # GGUF conversion) that fails in many ways on a bad file; each one means
    # the tracker could not count this model's tokens, so each one refuses.
    except Exception as error:
        raise ModelRefused(f"the tokenizer of {source.location} does not load: {error}") from None
