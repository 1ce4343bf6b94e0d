"""A prompt's chain of block hashes: what a prefix cache is keyed by, torch-free.

A prompt's token ids are cut into blocks of ``PREFIX_BLOCK_TOKENS``; block
``i``'s hash is SHA-256 of block ``i-1``'s hash and its ids, the chain seeded
with the model, the request's prefix scope and the block size
(docs/adr/0027-prefix-reuse.md). The head computes it to claim cached blocks
from its route's hops; the tracker computes the same chain to remember which
nodes hold which prefixes (routing_app.learning.prefix_memory), so both name a
prefix the same way without the tracker holding any tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from nodes_app.protocol.limits import PREFIX_BLOCK_TOKENS, PREFIX_HASH_HEX

_CHAIN_VERSION = b"meshnet-prefix/1"


def chain_seed(model: str, scope: str, block: int = PREFIX_BLOCK_TOKENS) -> str:
    """The hash a request's chain starts from: its model, scope and block size."""
    raw = b"|".join((_CHAIN_VERSION, model.encode(), scope.encode(), str(block).encode()))
    return hashlib.sha256(raw).hexdigest()[:PREFIX_HASH_HEX]


def block_hashes(
    seed: str, token_ids: Sequence[int], block: int = PREFIX_BLOCK_TOKENS
) -> list[str]:
    """One hash per full block of ``token_ids``: each covers every token before its end."""
    hashes: list[str] = []
    previous = seed
    for first in range(0, len(token_ids) - block + 1, block):
        ids = ",".join(map(str, token_ids[first : first + block]))
        previous = hashlib.sha256(f"{previous}:{ids}".encode()).hexdigest()[:PREFIX_HASH_HEX]
        hashes.append(previous)
    return hashes
