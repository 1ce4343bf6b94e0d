"""One batch of steps, run: its rows through the node's layers, then what each job answers.

The scheduler (``scheduler``) decides which steps run together and when;
this module runs them, on the torch thread (or inline on the loop, as the
scheduler decides). :func:`run_step_batch` embeds a head's token ids or
casts a hop's hidden states, runs every row through the runner's layers at
once (``runner.ShardRunner.run_batch``), then gives each job its outcome:

- a chunk that is not its prefill's last: :data:`MORE` (a middle hop keeps
  its output to answer every position);
- the step ends at the model's last layer: the session's picker chooses
  the token from its logits row (``sampler.TokenPicker``), with an echo's
  prompt scores gathered chunk by chunk (``ECHO_SCORE_ROWS`` at a time),
  or, for a draft round, verifies its drafts on every position's logits
  (``TokenPicker.verify``);
- otherwise the hidden states' bytes for the next hop, checked finite
  first (``finite.own_output``): a session whose output is not finite fails
  alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from nodes_app.runtime.engine.finite import own_output
from nodes_app.runtime.engine.runner import ShardRunner
from nodes_app.runtime.engine.sampler import TailRequest, prompt_scores
from nodes_app.runtime.engine.sessions import Session
from nodes_app.runtime.faults import NonFiniteOutput
from nodes_app.runtime.wire.entries import Choice, TokenScore
from nodes_app.runtime.wire.tensors import tensor_to_bytes

# Prompt positions an echo scores at once: its memory is a few rows × vocab float32
# (128 × 152k × 4 B ≈ 78 MB each), not the prefill chunk's (4096 rows: ~7 GB in all).
ECHO_SCORE_ROWS = 128


@dataclass(eq=False)
class StepJob:
    """One session's step in the queue: token ids (the head) or hidden states ``[1, T, H]``.

    ``tail`` is set when the step ends at the model's last layer: the token
    is chosen (and scored) as it says.
    """

    session: Session
    tail: TailRequest | None
    future: asyncio.Future[bytes | Choice]
    arrived: float
    tokens: list[int] | None = None
    hidden: torch.Tensor | None = None
    # A hop's step ids beside its hidden states, for families whose layers take them.
    ids: list[int] | None = None
    # A draft round's proposed positions at the step's end (ADR-0028): run in one
    # forward, never chunked, as decode positions (no prefix snapshot).
    drafts: int = 0
    # Positions already computed (a chunked prefill) and, on a middle hop, their outputs.
    done: int = 0
    outputs: list[torch.Tensor] = field(default_factory=list)
    # An echo's prompt scores so far (one per prompt token after the first).
    prompt: list[TokenScore] = field(default_factory=list)

    @property
    def last(self) -> bool:
        return self.tail is not None

    @property
    def length(self) -> int:
        if self.tokens is not None:
            return len(self.tokens)
        assert self.hidden is not None
        return int(self.hidden.shape[1])

    @property
    def abandoned(self) -> bool:
        return self.future.done() or self.session.closed


class More:
    """The outcome of a chunk that is not its prefill's last."""


MORE = More()
Outcome = bytes | Choice | BaseException | More


@torch.inference_mode()
def run_step_batch(
    runner: ShardRunner,
    batch: list[StepJob],
    length: int,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> list[Outcome]:
    """Run ``length`` positions of every job in ``batch`` (one layer range); each job's outcome.

    ``transform`` (test only: the node's ``--corrupt-hidden-states``) is
    applied to the layers' output. A job whose own output is not finite gets
    its ``NonFiniteOutput``; any other exception fails the whole batch.
    """
    shard = runner.shard
    first = batch[0]
    rows = []
    ids: list[list[int]] | None = [] if runner.family.per_layer_inputs else None
    for job in batch:
        span = slice(job.done, job.done + length)
        if ids is not None:
            step_ids = job.tokens if job.tokens is not None else job.ids
            assert step_ids is not None  # admission.check_step: such a hop's step has them
            ids.append(step_ids[span])
        if job.tokens is not None:
            rows.append(runner.embed(job.tokens[span]))
        else:
            assert job.hidden is not None
            rows.append(job.hidden[:, span].to(device=shard.device, dtype=shard.dtype))
    out = runner.run_batch(
        rows[0] if len(rows) == 1 else torch.cat(rows),
        caches=[job.session.cache for job in batch],
        pasts=[job.session.position + job.done for job in batch],
        start=first.session.start,
        end=first.session.end,
        token_ids=ids,
        prefill=length > 1 and not first.drafts,
    )
    if transform is not None:
        out = transform(out)
    final = first.done + length == first.length
    # A draft round (alone in its forward) is verified on every position's logits.
    logits = runner.last_logits(out) if final and first.last and not first.drafts else None
    outcomes: list[Outcome] = []
    for row, job in enumerate(batch):
        try:
            if job.tail is not None and job.tail.prompt_ids:
                _score_prompt(runner, job, out[row], length)
            job.done += length
            if not final:
                if not job.last:
                    job.outputs.append(out[row : row + 1])
                outcomes.append(MORE)
            elif job.drafts and job.tail is not None:
                assert job.session.picker is not None
                every = runner.logits(out[row : row + 1])[0]
                outcomes.append(
                    job.session.picker.verify(every, job.tail.drafts, job.tail.logprobs)
                )
            elif logits is not None:
                assert job.tail is not None
                assert job.session.picker is not None
                choice = job.session.picker.choose(logits[row], job.tail.logprobs)
                outcomes.append(dataclasses.replace(choice, prompt=tuple(job.prompt)))
            else:
                hidden = torch.cat([*job.outputs, out[row : row + 1]], dim=1)
                outcomes.append(tensor_to_bytes(own_output(hidden)))
        except NonFiniteOutput as error:
            outcomes.append(error)
    return outcomes


def _score_prompt(runner: ShardRunner, job: StepJob, out: torch.Tensor, length: int) -> None:
    """An echo: score the prompt tokens this chunk's positions predict (``out`` ``[q, H]``).

    Position ``p`` of the step predicts prompt token ``p + 1``; the chunk
    covers positions ``job.done…`` (run before ``done`` advances).
    """
    assert job.tail is not None
    ids = job.tail.prompt_ids
    rows = min(length, len(ids) - 1 - job.done)
    # A few float32 copies of rows × vocab live at once (logits, log-softmax):
    # scored ECHO_SCORE_ROWS at a time, whatever the prefill chunk.
    for first in range(0, max(rows, 0), ECHO_SCORE_ROWS):
        last = min(first + ECHO_SCORE_ROWS, rows)
        logits = runner.logits(out[first:last].unsqueeze(0))[0]
        targets = ids[job.done + 1 + first : job.done + 1 + last]
        job.prompt.extend(prompt_scores(logits, targets, job.tail.alternatives))
