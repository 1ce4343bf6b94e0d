"""Handing memory the process freed back to the operating system.

Loading converts every tensor once (GGUF blocks to floats, floats to the
shard's dtype, weights to int8): glibc keeps the freed buffers of those
conversions in its heap, so a node's resident memory stayed at its float32
size after loading a bfloat16 or int8 shard (ADR-0014 has the figures).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)  # glibc only
    return trim if callable(trim) else None


def release_freed_memory() -> None:
    """Return the heap's free pages to the OS (glibc's ``malloc_trim``); a no-op elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
