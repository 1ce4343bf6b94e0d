"""The head's checks of a hop's answer: what it must hold before the head relays or uses it.

A middle hop answers hidden states (:func:`hidden_of`); the hop ending at the
last layer answers the chosen token with the scores its step asked for
(:func:`choice_of`), and for an echo the prompt's scores (:func:`prompt_scores_of`).
An answer that does not hold what the step asked for raises :class:`BadAnswer`:
the hop that answered is at fault (the route driver reports it, ``route_driver.HopFailed``).
The frames themselves are ``wire.frames``'; this module is the head's policy on them.
"""

from __future__ import annotations

from typing import Any

import torch

from nodes_app.protocol.decoding import is_count
from nodes_app.protocol.logprobs import logprob_valid
from nodes_app.runtime.engine.finite import all_finite
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.wire.entries import Choice, PromptTable, StepAnswer, TokenScore
from nodes_app.runtime.wire.tensors import DTYPES, tensor_from_bytes


class BadAnswer(ValueError):
    """A hop's answer that does not hold what its step asked for (that hop's fault)."""


def hidden_of(answer: StepAnswer, shape: tuple[int, int, int]) -> tuple[bytes, str]:
    """A middle hop's answer, checked before it is relayed: its bytes and dtype.

    The answer must have the step's shape, a float dtype, the length they
    give and only finite values.
    """
    dtype = answer.dtype or ""
    if dtype not in DTYPES or answer.shape != shape or answer.hidden is None:
        raise BadAnswer("answered hidden states of another shape or dtype")
    try:
        hidden = tensor_from_bytes(answer.hidden, dtype, shape)
    except RuntimeRequestError as error:
        raise BadAnswer(f"answered {error.message}") from error
    if not all_finite(hidden):
        raise BadAnswer("answered hidden states that are not finite")
    return answer.hidden, dtype


def choice_of(
    answer: StepAnswer,
    *,
    vocab: int,
    logprobs: int | None,
    prompt_scores: int,
    drafts: int = 0,
) -> Choice:
    """The last hop's answer, checked, as a :class:`Choice`; :class:`BadAnswer` if malformed.

    The token and every alternative must be an id below ``vocab``, every
    logprob a finite number of at most 0; with ``logprobs`` there must be
    the chosen token's logprob and exactly ``logprobs`` alternatives (fewer
    only when the vocabulary is smaller); ``prompt_scores`` entries of
    ``[logprob, top]`` for an echo (none otherwise); for a draft round of
    ``drafts`` drafts, the count accepted, at most ``drafts`` (0 when left
    out), and none without one; with ``logprobs``, a ``[logprob, top]`` score
    of the same kind for each accepted draft (none without ``logprobs``).
    """
    alternatives = min(logprobs or 0, vocab)
    token = answer.token_id
    if not _is_id(token, vocab):
        raise BadAnswer(f"answered a token id outside the vocabulary (0..{vocab - 1})")
    score = None
    if logprobs is not None:
        score = _score(answer.logprob, answer.top, vocab, alternatives)
    elif answer.logprob is not None or answer.top is not None:
        raise BadAnswer("answered logprobs it was not asked for")
    prompt: tuple[TokenScore, ...] = ()
    if prompt_scores or answer.prompt is not None:
        if answer.prompt != [prompt_scores, alternatives] or answer.prompt_body is None:
            raise BadAnswer(f"answered other than {prompt_scores} prompt scores")
        table = PromptTable(prompt_scores, alternatives, answer.prompt_body)
        prompt = prompt_scores_of(table, vocab)
    accepted = 0 if answer.accepted is None else answer.accepted
    if not (is_count(accepted) and accepted <= drafts):
        raise BadAnswer(f"answered other than a count of at most {drafts} accepted drafts")
    return Choice(
        token, score, prompt, accepted, _accepted_scores(answer, vocab, logprobs, accepted)
    )


def _accepted_scores(
    answer: StepAnswer, vocab: int, logprobs: int | None, accepted: int
) -> tuple[TokenScore, ...]:
    """Each accepted draft's score, as ``logprobs`` asks; :class:`BadAnswer` unless there
    is exactly one per accepted draft with ``logprobs`` and none without."""
    raw = answer.accepted_scores
    if logprobs is None:
        if raw is not None:
            raise BadAnswer("answered logprobs it was not asked for")
        return ()
    if accepted == 0 and raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) != accepted:
        raise BadAnswer(f"answered other than a score for each of its {accepted} accepted drafts")
    alternatives = min(logprobs, vocab)
    scores = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2):
            raise BadAnswer("answered an accepted draft's score that is not [logprob, top]")
        scores.append(_score(item[0], item[1], vocab, alternatives))
    return tuple(scores)


def prompt_scores_of(table: PromptTable, vocab: int) -> tuple[TokenScore, ...]:
    """An echo's prompt scores, checked; :class:`BadAnswer` unless every id is below
    ``vocab``, every logprob a finite number of at most 0, and the body exactly as long
    as the table says."""
    rows, k = table.rows, table.alternatives
    columns = table.columns()
    if columns is None:
        raise BadAnswer(f"answered prompt scores of other than {rows} × {k} values")
    chosen, ids, values = columns
    if not bool((torch.isfinite(chosen) & (chosen <= 0)).all()) or not bool(
        (torch.isfinite(values) & (values <= 0)).all()
    ):
        raise BadAnswer("answered a prompt logprob that is not a finite number of at most 0")
    if rows * k and not bool(((ids >= 0) & (ids < vocab)).all()):
        raise BadAnswer(f"answered a prompt alternative outside the vocabulary (0..{vocab - 1})")
    return tuple(
        TokenScore(value, tuple(zip(row_ids, row_values, strict=True)))
        for value, row_ids, row_values in zip(
            chosen.tolist(), ids.tolist(), values.tolist(), strict=True
        )
    )


def _score(logprob: Any, top: Any, vocab: int, alternatives: int) -> TokenScore:
    if not logprob_valid(logprob):
        raise BadAnswer("answered a logprob that is not a finite number of at most 0")
    if not isinstance(top, list) or len(top) != alternatives:
        raise BadAnswer(f"answered other than {alternatives} alternatives")
    pairs: list[tuple[int, float]] = []
    for pair in top:
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and _is_id(pair[0], vocab)
            and logprob_valid(pair[1])
        ):
            raise BadAnswer("answered an alternative that is not [token id, logprob]")
        pairs.append((pair[0], float(pair[1])))
    return TokenScore(float(logprob), tuple(pairs))


def _is_id(value: Any, vocab: int) -> bool:
    return is_count(value) and value < vocab
