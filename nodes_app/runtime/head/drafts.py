"""Drafts for speculative decoding: prompt lookup, a grammar's forced tokens, a draft model.

Speculative decoding (ADR-0028) needs a guess of the next tokens that costs
the head less than the route's step it saves. Text that repeats what came
before — quoting or reformatting the prompt, code that reuses its names, a
list that follows a pattern — is guessed well by looking the last few tokens
up in the prompt and the answer so far and proposing what followed them
there (prompt lookup, as vLLM's ``ngram`` proposer and llama.cpp's lookup
decoding do).

:class:`PromptLookup` keeps, per n-gram length, where each n-gram last
occurred with a token after it, updated as tokens are added (O(longest) per
token, not a scan of the history per step), and proposes what followed the
latest earlier occurrence of the longest suffix it finds. Under a structured
output's grammar, :class:`GrammarForced` proposes what the grammar forces
instead, wherever it forces anything. Where the operator names a draft model
(a smaller model of the same tokenizer), :class:`DraftModel` proposes what it
decodes greedily, run whole on the head with a state of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nodes_app.runtime.engine.runner import ShardRunner

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


class DraftModel:
    """Proposes what a draft model decodes greedily after the text (ADR-0028).

    ``runner`` runs the draft model whole (embeddings to LM head, the engine's
    :class:`ShardRunner`); the generation's state in it is a K/V store of its
    own (``SessionKV``, at most ``limit`` positions), which holds a prefix
    of the text: what the text and the draft's last proposal agree on.
    ``tokens`` are the prompt (and any resumed tokens); :meth:`extend` adds
    each delivered token. :meth:`propose` first cuts the state back past the
    proposals the route rejected (to where a linear-attention state was held,
    when the draft has such layers), then runs the tokens it lacks and
    decodes. ``stop_ids`` are never proposed, nor anything after one, nor an
    id of ``vocab`` or past it (a draft's padded rows the model has not).

    :meth:`prime` and :meth:`propose` run torch: the caller runs them on the
    node's torch thread.
    """

    def __init__(
        self,
        runner: ShardRunner,
        tokens: Iterable[int] = (),
        *,
        vocab: int,
        stop_ids: Iterable[int] = (),
        limit: int | None = None,
    ) -> None:
        self.runner = runner
        self.vocab = vocab
        self.stop_ids = frozenset(stop_ids)
        self.tokens: list[int] = list(tokens)
        self.cache = runner.new_cache(limit=limit)
        # The tokens its state holds, in order: the text's, then its own proposals.
        self.ran: list[int] = []
        # Where its linear-attention state was held (SessionKV.hold), if it was.
        self._held: int | None = None
        context = getattr(runner.config, "max_position_embeddings", None)
        self.context: int | None = int(context) if context else None

    def extend(self, tokens: Iterable[int]) -> None:
        """Add tokens to the end of the text (none is run until the next proposal)."""
        self.tokens.extend(tokens)

    def prime(self) -> None:
        """Run the text but its last token: a generation's prompt, before its first round."""
        self._settle()
        pending = self.tokens[len(self.ran) : -1]
        if pending:
            self._forward(pending)

    def propose(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the draft model decodes greedily after the text."""
        if limit <= 0 or not self.tokens:
            return []
        if self.context is not None and len(self.tokens) + limit > self.context:
            return []
        self._settle()
        step = self.tokens[len(self.ran) :]
        proposal: list[int] = []
        while len(proposal) < limit:
            token = self._forward(step)
            if not proposal:
                # Its state now holds the text: where a linear state goes back to.
                self.cache.hold()
                self._held = len(self.ran)
            if token in self.stop_ids or token >= self.vocab:
                break
            proposal.append(token)
            step = [token]
        return proposal

    def _settle(self) -> None:
        """Cut the state back to what the text and its last proposal agree on, keeping at
        least the last token of the text to run (its logits are the next proposal's)."""
        kept = 0
        for ran, token in zip(self.ran, self.tokens[:-1], strict=False):
            if ran != token:
                break
            kept += 1
        cache, held, self._held = self.cache, self._held, None
        if kept == len(self.ran):
            cache.release()
            return
        if not cache.resumable(kept):
            # A linear-attention state goes back to where the last proposal began, or
            # to nothing; the tokens from there are run again.
            kept = held if held is not None and held <= kept else 0
        cache.truncate(kept)
        del self.ran[kept:]

    def _forward(self, ids: list[int]) -> int:
        """Run ``ids`` after the state; the draft's greedy token after them."""
        runner = self.runner
        hidden = runner.run_layers(
            runner.embed(ids),
            cache=self.cache,
            start=0,
            end=runner.shard.num_layers - 1,
            position=len(self.ran),
            token_ids=ids,
            prefill=False,
        )
        self.ran.extend(ids)
        return int(runner.last_logits(hidden)[0].argmax())
