"""A whole route in one process: a head's :class:`RouteDriver` over in-process hops.

Each hop is a :class:`NodeService` (dev-open) whose steps the head's links
hand to ``hop.step_intake`` directly, every step and answer encoded and
decoded by the link's codec on the way, as ``hop.link_server`` would: the
head, the hops' engines and the wire without node processes or sockets, so
a family table stays fast. Speculation's timing can be fixed
(:class:`FixedTimings`), so that a test chooses how many drafts a head sends;
a hop may stand in for an older node's (:class:`OlderHop`,
:class:`UnscoredRoundsHop`) or keep the rounds it answered (:class:`RecordingHop`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch

from nodes_app.protocol.generate import GenerateRequest
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.head.hop_links import HopLinks
from nodes_app.runtime.head.route_driver import RouteDriver, prompt_for
from nodes_app.runtime.head.speculation import LOOKUP, RouteTiming, TimingBook
from nodes_app.runtime.hop import step_intake
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.wire.entries import Choice, ForwardStep, LinkStep, StepAnswer
from nodes_app.runtime.wire.frames import (
    decode_answers,
    decode_requests,
    encode_answers,
    encode_requests,
)
from nodes_app.shared.sources import ModelSource
from tests.support.sse import sse_frames


class FixedTiming(RouteTiming):
    """A route's timing that measurements do not move."""

    def record_plain(self, seconds: float) -> None:
        return None

    def record_round(self, drafts: int, seconds: float) -> None:
        return None


class FixedTimings(TimingBook):
    """Every route timed as given: ``per_draft`` 0 drafts as many as pay at once."""

    def __init__(self, *, plain: float = 1.0, per_draft: float = 0.0) -> None:
        super().__init__()
        self.timing = FixedTiming(plain, per_draft)

    def of(self, route: Any, proposer: str = LOOKUP) -> RouteTiming:
        return self.timing


class InProcessHop:
    """The head's link to one in-process hop."""

    def __init__(self, service: NodeService) -> None:
        self.service = service

    async def step(
        self, step: ForwardStep, body: bytes, *, capability: Any, plan: Any, timeout: float
    ) -> StepAnswer:
        [entry] = decode_requests(encode_requests([LinkStep(1, step, body)]))
        assert isinstance(entry, LinkStep)
        try:
            result = await step_intake.forward(self.service, entry.step, entry.body)
        except RuntimeRequestError as error:
            answer = StepAnswer.refusal(1, error)
        else:
            if isinstance(result, Choice):
                answer = StepAnswer.chosen(1, result)
            else:
                answer = StepAnswer(
                    1, hidden=result, dtype=self.service.dtype_name, shape=entry.step.shape
                )
        [back] = decode_answers(encode_answers([answer]))
        return back

    async def cancel(
        self, session_id: str, *, capability: Any, timeout: float, keep: Any = None
    ) -> StepAnswer:
        self.service.cancel(session_id)
        return StepAnswer(1, status=204)


class OlderHop(InProcessHop):
    """A hop of a node older than draft rounds: it refuses a step's unknown ``drafts``."""

    refusal = "unknown step fields: drafts"

    def __init__(self, service: NodeService) -> None:
        super().__init__(service)
        self.refused = 0

    def refuses(self, step: ForwardStep) -> bool:
        return step.drafts is not None

    async def step(
        self, step: ForwardStep, body: bytes, *, capability: Any, plan: Any, timeout: float
    ) -> StepAnswer:
        if self.refuses(step):
            self.refused += 1
            return StepAnswer.refusal(1, RuntimeRequestError(self.refusal, code="bad_field"))
        return await super().step(step, body, capability=capability, plan=plan, timeout=timeout)


class UnscoredRoundsHop(OlderHop):
    """A last hop of a node whose draft rounds carried no logprobs: it refuses a round
    asking for them, as such nodes did."""

    refusal = "a draft round is verified without logprobs"

    def refuses(self, step: ForwardStep) -> bool:
        return step.drafts is not None and step.logprobs is not None


class RecordingHop(InProcessHop):
    """A hop that keeps each draft round it answered: ``(drafts, accepted)``."""

    def __init__(self, service: NodeService) -> None:
        super().__init__(service)
        self.rounds: list[tuple[int, int]] = []

    async def step(
        self, step: ForwardStep, body: bytes, *, capability: Any, plan: Any, timeout: float
    ) -> StepAnswer:
        answer = await super().step(step, body, capability=capability, plan=plan, timeout=timeout)
        if step.drafts is not None and answer.status == 200:
            self.rounds.append((len(step.drafts), answer.accepted or 0))
        return answer


class InProcessLinks:
    """:class:`HopLinks`' part a head uses, to hops in this process by endpoint."""

    def __init__(self, hops: dict[str, NodeService]) -> None:
        self.hops = {endpoint: InProcessHop(service) for endpoint, service in hops.items()}

    def to(self, endpoint: str) -> InProcessHop:
        return self.hops[endpoint]


class InProcessRoute:
    """Nodes of one checkpoint over ``ranges`` (the first the head), in this process."""

    def __init__(self, directory: Path, ranges: Sequence[tuple[int, int]]) -> None:
        torch.set_num_threads(1)
        source = ModelSource("directory", str(directory))
        self.ranges = list(ranges)
        self.services = [
            NodeService(
                load_shard(model_key="tiny", source=source, start=start, end=end, progress=False),
                node_id=f"node-{index}",
                gate=PlanGate(dev_open=True),
                kv_budget=2**28,
            )
            for index, (start, end) in enumerate(ranges)
        ]
        self.endpoints = [f"http://node-{index}.test" for index in range(len(ranges))]
        self.links = InProcessLinks(dict(zip(self.endpoints[1:], self.services[1:], strict=True)))

    @contextmanager
    def last_hop_as(self, hop: InProcessHop) -> Iterator[None]:
        """The head's link to the last hop goes through ``hop`` while in the block."""
        endpoint = self.endpoints[-1]
        kept, self.links.hops[endpoint] = self.links.hops[endpoint], hop
        try:
            yield
        finally:
            self.links.hops[endpoint] = kept

    def body(self, prompt: str, *, max_tokens: int, **extra: Any) -> dict[str, Any]:
        """A greedy generate body over the route for a raw ``prompt``."""
        hops = [
            {"node_id": f"node-{index}", "endpoint": endpoint, "start_layer": s, "end_layer": e}
            for index, (endpoint, (s, e)) in enumerate(
                zip(self.endpoints, self.ranges, strict=True)
            )
        ]
        return {
            "request_id": "in-process",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "plan": {"model": "tiny", "hops": hops},
            **extra,
        }

    def generate(self, body: dict[str, Any], *, timings: TimingBook | None = None) -> list[Any]:
        """The head's stream for ``body``, as parsed SSE payloads; no session left anywhere."""
        [frames] = self.generate_together([body], timings=timings)
        return frames

    def generate_together(
        self, bodies: Sequence[dict[str, Any]], *, timings: TimingBook | None = None
    ) -> list[list[Any]]:
        """Each body's stream, all generated at once (their steps batched where the
        scheduler batches them); no session left anywhere."""

        async def one(body: dict[str, Any]) -> list[Any]:
            head = self.services[0]
            request = GenerateRequest.parse(body)
            prompt = await prompt_for(head, request)
            links = cast(HopLinks, self.links)
            driver = RouteDriver(head, links, request, prompt, timings=timings)
            lines = [frame.decode() async for frame in driver.stream()]
            return sse_frames("".join(lines).splitlines())

        async def run() -> list[list[Any]]:
            streams = await asyncio.gather(*(one(body) for body in bodies))
            await asyncio.sleep(0.01)  # the hops' cancels, sent in the background
            return list(streams)

        streams = asyncio.run(run())
        assert all(len(service.store) == 0 for service in self.services)
        return streams

    def close(self) -> None:
        for service in self.services:
            service.close()
