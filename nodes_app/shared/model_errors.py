"""Errors about weights that both sides report: the registry adding a model, a node loading it."""

from __future__ import annotations


class UnsupportedModelError(Exception):
    """The model source names an architecture the shard runner cannot split."""


class ModelSourceError(Exception):
    """The weights for a model key cannot be found or read."""
