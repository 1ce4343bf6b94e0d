"""Choosing the next token on the last hop, and what it reports of the logits.

Greedy, temperature, top-k, top-p, seeded (:func:`sample_token`), after
OpenAI's penalties and logit_bias (:meth:`TokenPicker.adjusted`) and among the
tokens a grammar allows (:class:`Constraint`, ADR-0022). Logprobs are the
model's own: the log-softmax of the raw float32 logits, before any of those,
computed from the same logits that pick the token — for the chosen token and
its best alternatives (:meth:`TokenPicker.choose`), and for an echo, for each
prompt token given the ones before it (:func:`prompt_scores`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from llguidance import LLTokenizer

from nodes_app.protocol.sampling import SamplingParams
from nodes_app.runtime.engine.finite import all_finite
from nodes_app.runtime.faults import NonFiniteOutput, RuntimeRequestError
from nodes_app.runtime.wire.entries import Choice, TokenScore

# The JSON/header form of the parameters is the protocol's; only the torch
# side of sampling lives here.
from nodes_app.shared.grammar import grammar_matcher, matcher_problem

__all__ = [
    "Constraint",
    "SamplingParams",
    "TailRequest",
    "TokenPicker",
    "new_generator",
    "prompt_scores",
    "sample_token",
]

# A temperature this close to 0 would turn float32 scores into 0/0; below it
# the draw is the greedy one anyway (every other token's weight underflows).
_MIN_TEMPERATURE = 1e-30


@dataclass(frozen=True)
class TailRequest:
    """What the last hop does with a step's logits besides choosing with ``sampling``.

    ``logprobs``: report the chosen token's logprob and this many best
    alternatives (in a draft round, every delivered token's; None: report
    nothing). ``prompt_ids``: an echo — the ids of the step's first
    positions, each of which (but the first) gets its logprob given the ones
    before it, with as many alternatives.
    ``generated_ids``: completion tokens already generated before this session
    (a resumed completion's), which the penalties count; sent on the step
    that opens the session. ``drafts``: a draft round (speculative decoding,
    ADR-0028): the step's last positions hold these proposed tokens, each
    verified in turn (:meth:`TokenPicker.verify`).
    """

    sampling: SamplingParams
    logprobs: int | None = None
    prompt_ids: tuple[int, ...] = ()
    generated_ids: tuple[int, ...] = ()
    drafts: tuple[int, ...] = ()

    @property
    def alternatives(self) -> int:
        """Best alternatives reported at each scored position."""
        return self.logprobs or 0


def new_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


class Constraint:
    """One session's grammar on the last hop: which tokens may come next, as it advances.

    An llguidance matcher over the model's tokenizer (``tokenizer``, built once
    per node by :func:`nodes_app.shared.grammar.grammar_words`), advanced through ``generated_ids``
    (a resumed completion's tokens: after a failover the grammar's state is the
    uninterrupted one's) and then through every token chosen. A grammar that does
    not compile, or resumed tokens it does not accept, are the request's 400
    (``bad_grammar``, in the matcher's words).
    """

    def __init__(self, tokenizer: LLTokenizer, grammar: str, generated_ids: Sequence[int] = ()):
        self._matcher = grammar_matcher(tokenizer, grammar)
        self._vocab = tokenizer.vocab_size
        if generated_ids:
            self._matcher.consume_tokens(list(generated_ids))
        if self._matcher.is_error():
            raise _refused(self._matcher.get_error())

    def allowed(self, vocab: int, device: torch.device) -> torch.Tensor:
        """A bool mask ``[vocab]`` of the tokens that may come next (none past the
        tokenizer's words: a model's padding rows are never a word)."""
        mask = torch.frombuffer(bytearray(self._matcher.compute_logit_bias()), dtype=torch.uint8)
        if self._matcher.is_error():
            raise _refused(self._matcher.get_error())
        allowed = torch.zeros(vocab, dtype=torch.bool)
        size = min(vocab, self._vocab)
        allowed[:size] = mask[:size] != 0
        return allowed.to(device)

    def advance(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise _refused(self._matcher.get_error())


def _refused(reason: str) -> RuntimeRequestError:
    return RuntimeRequestError(
        f"the grammar cannot be followed: {matcher_problem(reason)}", code="bad_grammar"
    )


def check_logit_bias(sampling: SamplingParams, vocab: int) -> None:
    """Refuse (400 ``bad_sampling``) a logit_bias naming ids past the vocabulary.

    The head checks a request's, the last hop its opening step's: the
    tracker has no vocabulary to check them against.
    """
    if any(token >= vocab for token, _ in sampling.logit_bias):
        raise RuntimeRequestError(
            f"logit_bias names token ids past the vocabulary (0..{vocab - 1})",
            code="bad_sampling",
        )


def sample_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    allowed: torch.Tensor | None = None,
) -> int:
    """One token id from float32 ``logits`` of shape ``[vocab]``, among the ``allowed``
    ones (a bool mask; None: any).

    Raises :class:`NonFiniteOutput` when a logit is NaN or infinite: argmax
    would answer token 0 for NaN logits, a plausible token from a broken
    computation, and the node that computed them is the one at fault.
    """
    if not all_finite(logits):
        raise NonFiniteOutput("the logits are not finite")
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    if params.greedy:
        return int(torch.argmax(logits))
    # Shifted so the best score is 0: dividing by a small temperature then
    # sends the others towards -inf (weight 0) instead of overflowing to NaN.
    scores = (logits - logits.max()) / max(params.temperature, _MIN_TEMPERATURE)
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        threshold = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < threshold, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        probabilities = torch.softmax(ordered, dim=-1)
        # Drop tokens once the mass before them already reaches top_p; the best
        # token is always kept, whatever top_p rounds to in float32.
        drop = probabilities.cumsum(dim=-1) - probabilities >= params.top_p
        drop[0] = False
        scores = scores.scatter(0, order[drop], float("-inf"))
    probabilities = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))


def _top(logprobs: torch.Tensor, k: int) -> list[tuple[tuple[int, float], ...]]:
    """The ``k`` best ``(id, logprob)`` of each row of ``logprobs`` ``[rows, vocab]``."""
    if k == 0:
        return [()] * logprobs.shape[0]
    values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]), dim=-1)
    return [
        tuple(zip(row_ids, row_values, strict=True))
        for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True)
    ]


def prompt_scores(logits: torch.Tensor, targets: Sequence[int], k: int) -> list[TokenScore]:
    """Row ``i``'s logprob of ``targets[i]`` and its ``k`` best alternatives.

    ``logits`` ``[rows, vocab]`` are the raw float32 logits at the positions
    before each target. Raises :class:`NonFiniteOutput` for NaN or infinite logits.
    """
    if not all_finite(logits):
        raise NonFiniteOutput("the logits are not finite")
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    index = torch.tensor(list(targets), device=logits.device).unsqueeze(1)
    chosen = logprobs.gather(1, index).squeeze(1).tolist()
    return [TokenScore(value, top) for value, top in zip(chosen, _top(logprobs, k), strict=True)]


class TokenPicker:
    """One session's token choices on the last hop, with the sampling it was opened with.

    A session's sampling is fixed when it opens (its opening step carries
    it), so what each choice needs of it is built once: its ``constraint``
    (the grammar's matcher, when the sampling has one), the seeded
    generator, the logit_bias as tensors (on the first logits' device), and
    the counts of the completion's tokens (those it was opened with, then
    every token it chooses), kept only when the sampling has a penalty, so a
    resumed completion is penalised exactly as the uninterrupted one.
    """

    def __init__(
        self,
        sampling: SamplingParams,
        generated_ids: Sequence[int] = (),
        constraint: Constraint | None = None,
    ) -> None:
        self.sampling = sampling
        self.constraint = constraint
        self.generator = new_generator(sampling.seed)
        self._history: list[int] | None = list(generated_ids) if sampling.penalized else None
        self._counts: torch.Tensor | None = None
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None

    def _counts_for(self, logits: torch.Tensor) -> torch.Tensor | None:
        if self._history is None:
            return None
        if self._counts is None:
            vocab = logits.shape[-1]
            history = torch.tensor(
                [token for token in self._history if token < vocab],
                dtype=torch.long,
                device=logits.device,
            )
            self._counts = torch.bincount(history, minlength=vocab).to(logits.dtype)
        return self._counts

    def _bias_for(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._bias is None:
            pairs = self.sampling.logit_bias
            ids = torch.tensor([token for token, _ in pairs], device=logits.device)
            values = torch.tensor(
                [value for _, value in pairs], device=logits.device, dtype=logits.dtype
            )
            self._bias = ids, values
        return self._bias

    def adjusted(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``[vocab]`` after OpenAI's penalties and logit_bias (a new tensor if changed).

        With ``counts[j]`` the times token ``j`` occurs in the completion so
        far, token ``j`` loses ``counts[j] × frequency_penalty`` and, if it
        occurs, ``presence_penalty``, then gains ``logit_bias[j]``.
        """
        params, scores = self.sampling, logits
        counts = self._counts_for(logits)
        if counts is not None:
            present = (counts > 0).to(logits.dtype)
            scores = scores - counts * params.frequency_penalty - present * params.presence_penalty
        if params.logit_bias:
            scores = scores.index_add(0, *self._bias_for(logits))
        return scores

    def choose(self, logits: torch.Tensor, logprobs: int | None = None) -> Choice:
        """The next token from float32 ``logits`` ``[vocab]``; with ``logprobs``, its score.

        ``logprobs`` is how many best alternatives to report with the chosen
        token's logprob (None: report nothing). Raises
        :class:`NonFiniteOutput` for NaN or infinite logits (penalties and
        biases are finite, so :func:`sample_token`'s check covers them).
        """
        allowed = None
        if self.constraint is not None:
            allowed = self.constraint.allowed(logits.shape[-1], logits.device)
        token = sample_token(self.adjusted(logits), self.sampling, self.generator, allowed)
        if self.constraint is not None:
            self.constraint.advance(token)
        if self._counts is not None:
            self._counts[token] += 1
        if logprobs is None:
            return Choice(token)
        scores = torch.log_softmax(logits, dim=-1)
        [top] = _top(scores.unsqueeze(0), logprobs)
        return Choice(token, TokenScore(float(scores[token]), top))

    def verify(
        self, logits: torch.Tensor, drafts: Sequence[int], logprobs: int | None = None
    ) -> Choice:
        """A draft round's answer from float32 ``logits`` ``[len(drafts) + 1, vocab]``.

        Row ``i`` follows the step's position ``i`` (the last accepted token,
        then the drafts). Each row's token is chosen as :meth:`choose` would
        choose it, in order, so penalties, logit_bias and a grammar see every
        token before it; a draft equal to its row's choice is accepted, and the
        first choice that differs (or the one after the last draft) is the
        answer's token: ``Choice.accepted`` drafts, then ``token_id``. Exactly
        the tokens decoding one position at a time chooses, and the picker's
        state advances by exactly those. With ``logprobs``, every delivered
        token is scored as :meth:`choose` scores it: each accepted draft's in
        ``Choice.accepted_scores``, the answer's token's in ``Choice.score``.
        """
        scores: list[TokenScore] = []
        for accepted, row in enumerate(logits):
            choice = self.choose(row, logprobs)
            if accepted == len(drafts) or choice.token_id != drafts[accepted]:
                return Choice(
                    choice.token_id, choice.score, accepted=accepted, accepted_scores=tuple(scores)
                )
            if choice.score is not None:
                scores.append(choice.score)
        raise ValueError("a draft round's logits have one row more than its drafts")
