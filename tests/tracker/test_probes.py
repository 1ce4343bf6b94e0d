"""Running the route probe over the registry's routes (the sender faked), and its task."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from nodes_app.protocol.frames import ChunkFrame
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.logprobs import TokenLogprob, TopLogprob
from nodes_app.protocol.sse import SSE_DONE, sse_event
from nodes_app.services import topology_epoch_bump
from routing_app.exclusions import receivers
from routing_app.exclusions.probe_verdicts import ProbeAnswer
from routing_app.models import RouteProbe, RouteQuarantine
from routing_app.planning.route_plan import Hop, RoutePlan
from tests.support.routing import make_model, make_node
from tracker_app import probes, tasks
from tracker_app.probes import probe_request, route_probe_done, route_probes_run

pytestmark = pytest.mark.django_db

RIGHT = (1, 2, 3, 4)
WRONG = (1, 2, 9, 9)


class FakeSender:
    """Answers like the nodes would: wrongly for every route through ``corrupt``."""

    def __init__(self, corrupt: str = "c") -> None:
        self.corrupt = corrupt
        self.sent: list[str] = []

    def __call__(self, plan: RoutePlan) -> ProbeAnswer:
        self.sent.append(plan.signature)
        return ProbeAnswer(token_ids=WRONG if self.corrupt in plan.node_ids else RIGHT)


@pytest.fixture
def model():
    model = make_model(num_layers=4)
    make_node(model, "full", 0, 3)
    make_node(model, "c", 0, 1)
    return model


@pytest.fixture(autouse=True)
def no_audit_queue(monkeypatch):
    queued = []
    monkeypatch.setattr(probes, "audit_queue", lambda: queued.append(True))
    return queued


def test_the_probe_is_a_plain_greedy_request_for_the_route(model):
    plan = RoutePlan(model.key, 3, (Hop("full", "http://full", 0, 3),))
    request = probe_request(plan)

    assert request.sampling.greedy
    # Logprobs as a client may ask them: near-ties are judged on them (ADR-0015).
    assert (request.logprobs, request.top_logprobs) == (True, probes.PROBE_TOP_LOGPROBS)
    assert request.messages == probes.PROBE_MESSAGES
    assert request.hops[0].node_id == "full"
    assert "probe" not in request.request_id  # a node cannot tell a probe from traffic


def scored(token_id: int) -> TokenLogprob:
    text = chr(ord("a") + token_id)
    return TokenLogprob(text, -0.1, (ord(text),), (TopLogprob(text, -0.1, (ord(text),)),))


def head_answering(*frames: ChunkFrame) -> httpx.AsyncClient:
    """A client whose every head streams ``frames`` (then the end) to the request it got."""

    def answer(http_request: httpx.Request) -> httpx.Response:
        request = GenerateRequest.parse(json.loads(http_request.content))
        events = [
            sse_event(frame.to_json(completion_id="c", created=1, model=request.model))
            for frame in (ChunkFrame(role="assistant"), *frames)
        ]
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            content=b"".join([*events, sse_event(SSE_DONE)]),
        )

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def send(model, client: httpx.AsyncClient):
    plan = RoutePlan(model.key, 3, (Hop("full", "http://full", 0, 3),))

    async def run():
        async with client:
            return await probes.probe_send_async(plan, client)

    return asyncio.run(run())


def test_the_probe_answer_keeps_each_tokens_logprobs(model):
    client = head_answering(
        ChunkFrame(content="ab", token_ids=(0, 1), logprobs=(scored(0), scored(1))),
        ChunkFrame(content="c", token_ids=(2,), logprobs=(scored(2),), finish_reason="stop"),
    )

    answer = send(model, client)

    assert answer.token_ids == (0, 1, 2)
    assert [entry.token for entry in answer.logprobs] == ["a", "b", "c"]


def test_the_probe_answer_keeps_only_the_logprobs_that_line_up_with_its_tokens(model):
    client = head_answering(
        ChunkFrame(content="a", token_ids=(0,), logprobs=(scored(0),)),
        ChunkFrame(content="b", token_ids=(1,)),
        ChunkFrame(content="c", token_ids=(2,), logprobs=(scored(2),), finish_reason="stop"),
    )

    answer = send(model, client)

    assert answer.token_ids == (0, 1, 2)
    assert [entry.token for entry in answer.logprobs] == ["a"]


def test_it_probes_every_candidate_route_and_quarantines_the_corrupt_one(model):
    sender = FakeSender()

    summary = route_probes_run(
        model=model, now=timezone.now(), lookback=timedelta(days=1), send=sender
    )

    assert len(sender.sent) == 2
    assert summary is not None and len(summary.quarantined) == 1
    assert RouteQuarantine.objects.get().suspects == ["c"]


def test_a_quarantined_route_is_not_probed_again_before_its_reprobe_is_due(model):
    now = timezone.now()
    route_probes_run(model=model, now=now, lookback=timedelta(days=1), send=FakeSender())
    sender = FakeSender()

    route_probes_run(
        model=model, now=now + timedelta(seconds=30), lookback=timedelta(days=1), send=sender
    )
    assert len(sender.sent) == 1
    assert route_probes_run(
        model=model, now=now + timedelta(seconds=30), lookback=timedelta(days=1),
        due_only=True, send=sender,
    ) is None  # fmt: skip

    healed = FakeSender(corrupt="nobody")
    summary = route_probes_run(
        model=model, now=now + timedelta(seconds=61), lookback=timedelta(days=1),
        due_only=True, send=healed,
    )  # fmt: skip
    assert summary is not None and len(summary.released) == 1
    assert len(healed.sent) == 2


def test_a_probe_queued_by_an_epoch_change_runs_once_per_epoch(model, monkeypatch):
    sender = FakeSender()
    monkeypatch.setattr(probes, "probe_send", sender)
    monkeypatch.setattr(tasks, "route_probes_run", lambda **kw: route_probes_run(**kw, send=sender))

    first = tasks.probe_routes(model_key=model.key, epoch=1)
    again = tasks.probe_routes(model_key=model.key, epoch=1)

    assert [run["epoch"] for run in first] == [1]
    assert again == []
    assert route_probe_done(model=model, epoch=1)


def test_a_probe_queued_for_an_older_epoch_is_skipped(model):
    topology_epoch_bump(model=model, reason="join")

    assert route_probe_done(model=model, epoch=1)
    assert tasks.probe_routes(model_key=model.key, epoch=1) == []
    assert not RouteProbe.objects.exists()


def test_the_probe_task_tolerates_a_model_that_is_gone():
    assert tasks.probe_routes(model_key="no-such-model") == []


def test_an_epoch_change_queues_a_probe_after_commit(
    model, monkeypatch, django_capture_on_commit_callbacks
):
    sent = []
    monkeypatch.setattr(
        receivers.celery_app, "send_task", lambda name, **options: sent.append((name, options))
    )

    with django_capture_on_commit_callbacks(execute=True):
        epoch = topology_epoch_bump(model=model, reason="join: c")

    assert [(name, options["kwargs"]) for name, options in sent] == [
        ("routing.probe_routes", {"model_key": model.key, "epoch": epoch})
    ]
