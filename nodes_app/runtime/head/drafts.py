"""Drafts without a draft model: prompt lookup over the tokens a generation has so far.

Speculative decoding (ADR-0028) needs a guess of the next tokens that costs
the head next to nothing. Text that repeats what came before — quoting or
reformatting the prompt, code that reuses its names, a list that follows a
pattern — is guessed well by looking the last few tokens up in the prompt
and the answer so far and proposing what followed them there (prompt
lookup, as vLLM's ``ngram`` proposer and llama.cpp's lookup decoding do).

:class:`PromptLookup` keeps, per n-gram length, where each n-gram last
occurred with a token after it, updated as tokens are added (O(longest) per
token, not a scan of the history per step), and proposes what followed the
latest earlier occurrence of the longest suffix it finds.
"""

from __future__ import annotations

from collections.abc import Iterable

# The n-gram lengths looked up, longest first: a longer match is a better guess.
LONGEST_NGRAM = 3
SHORTEST_NGRAM = 1


class PromptLookup:
    """Proposes the tokens that followed the latest earlier occurrence of the text's end.

    ``tokens`` are the prompt (and any resumed tokens); :meth:`extend` adds
    each token the answer delivers. ``stop_ids`` (end-of-text tokens) are
    never proposed, nor anything after one: a generation ends at them.
    """

    def __init__(
        self,
        tokens: Iterable[int] = (),
        *,
        stop_ids: Iterable[int] = (),
        longest: int = LONGEST_NGRAM,
        shortest: int = SHORTEST_NGRAM,
    ) -> None:
        if not 1 <= shortest <= longest:
            raise ValueError("n-gram lengths must satisfy 1 <= shortest <= longest")
        self.longest = longest
        self.shortest = shortest
        self.stop_ids = frozenset(stop_ids)
        self.tokens: list[int] = []
        # Per length n: an n-gram → the index of the token that followed its latest occurrence.
        self._follows: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(shortest, longest + 1)
        }
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Add tokens to the end of the text."""
        for token in tokens:
            self.tokens.append(token)
            # The n-grams that ended just before this token now have a follower.
            end = len(self.tokens) - 1
            for n, follows in self._follows.items():
                if end >= n:
                    follows[tuple(self.tokens[end - n : end])] = end

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens to follow the text, or none when nothing matches.

        The longest suffix (``longest`` down to ``shortest`` tokens) seen
        earlier with a token after it wins; the proposal is what followed its
        latest such occurrence, cut before any stop id.
        """
        if limit <= 0:
            return []
        tokens = self.tokens
        for n in range(min(self.longest, len(tokens)), self.shortest - 1, -1):
            follower = self._follows[n].get(tuple(tokens[len(tokens) - n :]))
            if follower is None:
                continue
            proposal: list[int] = []
            for token in tokens[follower : follower + limit]:
                if token in self.stop_ids:
                    break
                proposal.append(token)
            if proposal:
                return proposal
        return []
