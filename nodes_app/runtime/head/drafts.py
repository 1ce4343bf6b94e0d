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
latest earlier occurrence of the longest suffix it finds. Under a structured
output's grammar, :class:`GrammarForced` proposes what the grammar forces
instead, wherever it forces anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

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


class GrammarForced:
    """Proposes the tokens a structured-output grammar forces next (ADR-0028).

    Where a grammar allows a single continuation — a JSON object's fixed keys
    and punctuation, a tool call's name — llguidance names its tokens (in the
    tokenizer's own spelling; the model may still spell them otherwise, and
    then the last hop rejects the draft as any other). ``matcher`` is an
    llguidance matcher of the request's grammar, advanced through any resumed
    tokens; :meth:`extend` advances it through each delivered token. A
    matcher that errs proposes nothing from then on (the last hop, which
    holds the request to its grammar, says why).
    """

    def __init__(self, matcher: Any, *, stop_ids: Iterable[int] = ()) -> None:
        self.matcher = matcher
        self.stop_ids = frozenset(stop_ids)

    def extend(self, tokens: Iterable[int]) -> None:
        """Advance the grammar through delivered tokens."""
        for token in tokens:
            if not self.matcher.is_error():
                self.matcher.consume_token(token)

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar forces next (none when it forces nothing)."""
        if limit <= 0 or self.matcher.is_error() or self.matcher.is_stopped():
            return []
        proposal: list[int] = []
        for token in self.matcher.compute_ff_tokens()[:limit]:
            if token in self.stop_ids:
                break
            proposal.append(token)
        return proposal
