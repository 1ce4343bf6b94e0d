"""The prefix cache: what ended sessions computed, kept for the next prompt that starts the same.

docs/adr/0027-prefix-reuse.md is the design. In short:

- **Blocks and the chain.** A prompt's token ids are cut into blocks of
  ``PREFIX_BLOCK_TOKENS``; block ``i``'s hash is SHA-256 of block ``i-1``'s
  hash and its ids, the chain seeded with the model and the request's *scope*
  (``nodes_app.shared.prefix_chain``). Only the head sees tokens: it sends the
  chain to every hop (a *claim*), and each node turns the chain into keys of its
  own (:func:`local_keys`: the layers it runs, its dtype, the scope its signed
  plan names), so a hop never holds another range's or another precision's
  state under a key it would match.
- **Entries.** When a session ends cleanly its :class:`SessionKV` becomes an
  entry (no copy), indexed by the key of every block it holds in full; for
  linear-attention states, only at the positions a snapshot was kept
  (``SessionKV.ran``). A new session whose chain matches ``k`` blocks copies
  those positions into its own state (:meth:`PrefixCache.take`).
- **The budget.** Entries count against the node's KV budget beside the
  sessions' reservations (``sessions.SessionStore``): least recently used
  entries go first, and a session is never refused while cache could be freed.

Everything here runs on the event loop except :meth:`PrefixCache.take`'s copy,
which the caller runs on the torch thread.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nodes_app.protocol.limits import PREFIX_BLOCK_TOKENS
from nodes_app.runtime.engine.kv import SessionKV


def local_keys(
    hashes: Sequence[str], *, model: str, start: int, end: int, dtype: str, scope: str
) -> list[bytes]:
    """A node's own keys for a chain: the layers it runs, its precision and the scope bound in."""
    seed = f"{model}|{start}-{end}|{dtype}|{scope}|".encode()
    return [hashlib.sha256(seed + value.encode()).digest() for value in hashes]


@dataclass(eq=False)
class Entry:
    """An ended session's state, held for ``blocks`` full blocks under ``keys``."""

    kv: SessionKV
    keys: list[bytes]
    nbytes: int


@dataclass(frozen=True)
class Hit:
    """What a claim found: ``blocks`` leading blocks held; ``exact`` when the state can be
    resumed at that count only (linear-attention layers), else at any count up to it."""

    blocks: int
    exact: bool
    entry: Entry | None = None


MISS = Hit(0, False)


class PrefixCache:
    """A node's prefix entries and their index, least recently used first."""

    def __init__(self, *, block: int = PREFIX_BLOCK_TOKENS) -> None:
        self.block = block
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._index: dict[bytes, tuple[Entry, int]] = {}
        self.nbytes = 0
        self.hits = 0
        self.lookups = 0
        self.reused_positions = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, keys: Sequence[bytes]) -> Hit:
        """The longest run of leading blocks of ``keys`` some entry holds (refreshing it)."""
        self.lookups += 1
        for count in range(len(keys), 0, -1):
            found = self._index.get(keys[count - 1])
            if found is None:
                continue
            entry, blocks = found
            if blocks != count:  # another chain's key: cannot happen short of a collision
                continue
            self._entries.move_to_end(id(entry))
            return Hit(count, entry.kv.linear, entry)
        return MISS

    def take(self, hit: Hit, kv: SessionKV) -> int:
        """Copy ``hit``'s positions into the new session's empty ``kv``; the positions taken.

        Torch work: run it on the torch thread. The entry may have been evicted
        meanwhile: its tensors live as long as ``hit`` does.
        """
        if hit.entry is None or not hit.blocks:
            return 0
        positions = hit.blocks * self.block
        kv.adopt_prefix(hit.entry.kv, positions)
        return positions

    def counted(self, positions: int) -> None:
        """A session started ``positions`` in (after the route agreed on them): a hit."""
        if positions:
            self.hits += 1
            self.reused_positions += positions

    def keep(self, kv: SessionKV, keys: Sequence[bytes], *, room: int) -> bool:
        """Hold ``kv`` (an ended session's) under the keys of the blocks it holds in full.

        ``room``: bytes the budget has for cache beside the sessions' reservations;
        older entries are evicted to fit, and nothing is kept that cannot. Linear
        states are indexed only where they can be resumed (their snapshots).
        """
        blocks = min(len(keys), kv.reached // self.block)
        counts = [
            count
            for count in range(1, blocks + 1)
            if kv.resumable(count * self.block)
            and (not kv.linear or count * self.block in (*kv.snapshots, kv.reached))
        ]
        if not counts:
            return False
        newest = counts[-1]
        held = self._index.get(keys[newest - 1])
        if held is not None and held[1] == newest:
            self._entries.move_to_end(id(held[0]))
            return False  # the same blocks are held already
        nbytes = kv.nbytes
        if nbytes > room:
            return False
        self.evict(self.nbytes + nbytes - room)
        entry = Entry(kv, [keys[count - 1] for count in counts], nbytes)
        displaced: set[Entry] = set()
        for count in counts:
            old = self._index.get(keys[count - 1])
            if old is not None:
                displaced.add(old[0])
            self._index[keys[count - 1]] = (entry, count)
        self._entries[id(entry)] = entry
        self.nbytes += nbytes
        for old_entry in displaced:
            if not any(self._index.get(key, (None, 0))[0] is old_entry for key in old_entry.keys):
                self._drop(old_entry)  # nothing finds it any more
        return True

    def evict(self, needed: int) -> int:
        """Free at least ``needed`` bytes, least recently used first; the bytes freed."""
        freed = 0
        while freed < needed and self._entries:
            entry = next(iter(self._entries.values()))
            self._drop(entry)
            freed += entry.nbytes
            self.evicted += 1
        return freed

    def clear(self) -> None:
        """Forget every entry."""
        self.evict(self.nbytes + 1)

    def _drop(self, entry: Entry) -> None:
        del self._entries[id(entry)]
        for key in entry.keys:
            if self._index.get(key, (None, 0))[0] is entry:
                del self._index[key]
        self.nbytes -= entry.nbytes

    def stats(self) -> dict[str, Any]:
        """What the operator's health view reports of it."""
        return {
            "block_tokens": self.block,
            "entries": len(self._entries),
            "bytes": self.nbytes,
            "lookups": self.lookups,
            "hits": self.hits,
            "reused_positions": self.reused_positions,
            "evicted": self.evicted,
        }


def agreed(hits: Sequence[Hit]) -> int:
    """The most leading blocks every node of a route can start after (ADR-0027).

    A node holding ``blocks`` of K/V alone can start at any count up to it; one
    with linear-attention states (``exact``) only at that count or at 0.
    """
    ranges = [hit.blocks for hit in hits if not hit.exact]
    exact = {hit.blocks for hit in hits if hit.exact}
    top = min(ranges, default=max(exact, default=0))
    if not exact:
        return top
    if len(exact) == 1 and (only := next(iter(exact))) <= top:
        return only
    return 0
