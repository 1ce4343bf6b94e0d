"""The probe's sample of served requests, the tracker's hold on a head's stop and budget,
and the served-answer check run over it (the re-runs faked)."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from nodes_app.models import Node
from nodes_app.protocol.frames import ChunkFrame
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.sampling import SamplingParams
from nodes_app.protocol.signed_plan import PlanHop
from routing_app.exclusions.probe_verdicts import ProbeAnswer
from routing_app.models import RouteQuarantine
from routing_app.planning.route_plan import RoutePlan
from routing_app.policies.choice import DecisionMode, RouteDecision
from tests.support.probe_answers import (
    FLOAT32,
    MIXED,
    RIGHT,
    SURE,
    WRONG,
    answer,
    entry,
    plan,
    step,
)
from tests.support.routing import make_model, make_node
from tracker_app import probes
from tracker_app.completions.generation import Generation, Segment
from tracker_app.completions.prompt_tokens import PromptCount
from tracker_app.models import ServedAnswer
from tracker_app.probes import served_answers_check
from tracker_app.served_answers import (
    TRIM_EVERY,
    ServedSample,
    served_answers_purge,
    served_answers_record,
    served_answers_take,
)

HOUR = timedelta(hours=1)
# Sampled with one seed, two routes drew 7 and 8, 1.9 nats apart (no greedy near-tie):
# rounding moved the draw across the boundary between them.
TOP3 = [(7, -0.1), (8, -2.0), (9, -4.0)]
REFERENCE = answer(SURE, dict(TOP3), {1: -0.1, 2: -3.0})
SHIFTED = ProbeAnswer(
    token_ids=(5, 8, 1), logprobs=(step(SURE), entry(8, -2.0, TOP3), step({1: -0.1}))
)


def served(
    route: RoutePlan,
    token_ids: tuple[int, ...] = (1, 2, 3),
    *,
    stop: tuple[str, ...] = (),
    max_tokens: int = 16,
    sampling: SamplingParams | None = None,
) -> Generation:
    """A choice served on ``route`` as the proxy leaves it (its request sent, tokens in)."""
    generation = Generation(
        choice=0,
        prompt=[{"role": "user", "content": "Hi"}],
        prompt_count=PromptCount(3, True),
        sampling=sampling or SamplingParams(),
    )
    generation.segments.append(Segment(RouteDecision(route, DecisionMode.PINNED, 1), 0, 0.0))
    generation.sent = GenerateRequest(
        request_id="r",
        model=route.model_key,
        hops=tuple(PlanHop(h.node_id, h.endpoint, h.start_layer, h.end_layer) for h in route.hops),
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=max_tokens,
        sampling=generation.sampling,
        stop=list(stop),
    )
    generation.token_ids = list(token_ids)
    generation.finish_reason = "stop"
    return generation


def test_a_sampled_choice_without_a_seed_gets_one_the_tracker_keeps():
    generation = served(plan(("full", 0, 3)), sampling=SamplingParams(temperature=0.8))

    assert generation.sampling.seed is not None
    assert served(plan(("full", 0, 3))).sampling.seed is None  # greedy needs none


def test_text_past_the_clients_stop_is_cut_and_the_head_blamed():
    generation = served(plan(("h", 0, 1), ("t", 2, 3)), (), stop=("END",))

    first = generation.absorb(ChunkFrame(content="ab", token_ids=(1,)), request_id="r")
    second = generation.absorb(ChunkFrame(content="cEN", token_ids=(2,)), request_id="r")
    third = generation.absorb(ChunkFrame(content="Dmore", token_ids=(3,)), request_id="r")
    after = generation.absorb(ChunkFrame(content="zz", token_ids=(4,)), request_id="r")

    assert [p.text if p else None for p in (first, second, third, after)] == [
        "ab",
        "cEN",
        None,
        None,
    ]
    assert generation.finish_reason == "stop"
    assert generation.token_ids == [1, 2, 3]
    assert generation.overrun is not None and generation.overrun.node_id == "h"


def test_tokens_past_max_tokens_are_not_taken():
    generation = served(plan(("full", 0, 3)), (), max_tokens=2)

    generation.absorb(ChunkFrame(content="a", token_ids=(1,)), request_id="r")
    generation.absorb(ChunkFrame(content="bc", token_ids=(2, 3)), request_id="r")

    assert generation.token_ids == [1, 2]
    assert generation.finish_reason == "length"
    assert generation.overrun is not None


def test_an_honest_heads_frames_pass_untouched():
    generation = served(plan(("full", 0, 3)), (), stop=("END",), max_tokens=2)

    generation.absorb(ChunkFrame(content="EN", token_ids=(1,)), request_id="r")
    generation.absorb(ChunkFrame(content="", token_ids=(2,), finish_reason="stop"), request_id="r")

    assert generation.content == "EN"
    assert generation.overrun is None


@pytest.mark.django_db
class TestSample:
    @pytest.fixture
    def model(self):
        model = make_model(num_layers=4)
        for node_id, start, end in [("full", 0, 3), ("h", 0, 1), ("t", 2, 3)]:
            make_node(model, node_id, start, end)
        return model

    def record(self, model, generations, now, keep=4):
        return served_answers_record(
            model_key=model.key,
            request_id=uuid.uuid4(),
            generations=generations,
            now=now,
            keep=keep,
            max_age=HOUR,
            lookback=timedelta(days=1),
        )

    def test_a_served_choice_is_kept_with_its_request_and_answer_then_taken_once(self, model):
        route = plan(("h", 0, 1), ("t", 2, 3), model=model.key)
        now = timezone.now()
        self.record(model, [served(route, stop=("\n",))], now)

        [sample] = served_answers_take(
            model_key=model.key, count=5, now=now, max_age=HOUR, rng=random.Random(1)
        )

        assert sample.plan == route
        assert sample.answer.token_ids == (1, 2, 3)
        rerun = sample.rerun(plan(("full", 0, 3), model=model.key), request_id="x", top_logprobs=5)
        assert (rerun.stop, rerun.max_tokens, rerun.messages) == (
            ["\n"],
            16,
            [{"role": "user", "content": "Hi"}],
        )
        assert (rerun.logprobs, rerun.top_logprobs) == (True, 5)
        assert not ServedAnswer.objects.exists()

    def test_the_sample_keeps_only_the_newest_and_forgets_the_old(self, model):
        route = plan(("full", 0, 3), model=model.key)
        now = timezone.now()
        for minute in range(3 * TRIM_EVERY):
            self.record(model, [served(route)], now + timedelta(minutes=minute), keep=4)

        kept = list(ServedAnswer.objects.order_by("-served_at").values_list("served_at", flat=True))
        assert 4 <= len(kept) < 4 + TRIM_EVERY
        assert kept[0] == now + timedelta(minutes=3 * TRIM_EVERY - 1)
        late = now + timedelta(minutes=3 * TRIM_EVERY - 3) + HOUR
        old = [served_at for served_at in kept if served_at < late - HOUR]
        assert served_answers_purge(now=late, max_age=HOUR) == len(old) > 0

    def test_a_choice_that_failed_over_is_not_kept(self, model):
        route = plan(("full", 0, 3), model=model.key)
        generation = served(route)
        generation.segments.append(generation.segments[0])

        assert self.record(model, [generation], timezone.now()) == 0

    def test_a_head_that_overran_has_its_route_quarantined_not_sampled(self, model):
        route = plan(("h", 0, 1), ("t", 2, 3), model=model.key)
        generation = served(route, (), stop=("x",))
        generation.absorb(ChunkFrame(content="axb", token_ids=(1,)), request_id="r")

        assert self.record(model, [generation], timezone.now()) == 0

        quarantine = RouteQuarantine.objects.get()
        assert (quarantine.signature, quarantine.suspects) == (route.signature, ["h"])
        assert Node.objects.get(pk="h").reputation == 0.5
        assert Node.objects.get(pk="t").reputation == 1.0

    def test_the_check_quarantines_the_route_whose_served_answer_the_others_contradict(
        self, model, monkeypatch
    ):
        monkeypatch.setattr(probes, "audit_queue", lambda: None)
        route = plan(("h", 0, 1), ("t", 2, 3), model=model.key)
        now = timezone.now()
        self.record(model, [served(route, WRONG.token_ids)], now)
        sent: list[str] = []

        def rerun(sample: ServedSample, target: RoutePlan):
            sent.append(target.signature)
            return RIGHT

        [summary] = served_answers_check(
            model=model,
            now=now,
            lookback=timedelta(days=1),
            count=2,
            max_age=HOUR,
            rng=random.Random(1),
            send=rerun,
        )

        assert summary.quarantined == [route.signature]
        # Served without logprobs: its own route is re-run last, and answers otherwise.
        assert sent.count(route.signature) == 1 and sent[-1] == route.signature
        assert RouteQuarantine.objects.get().suspects == ["t"]
        assert Node.objects.get(pk="h").reputation == 1.0
        assert not ServedAnswer.objects.exists()

    def test_an_answer_served_without_logprobs_parting_at_a_near_tie_is_not_judged_corrupt(
        self, model, monkeypatch
    ):
        monkeypatch.setattr(probes, "audit_queue", lambda: None)
        route = plan(("h", 0, 1), ("t", 2, 3), model=model.key)
        now = timezone.now()
        self.record(model, [served(route, MIXED.token_ids)], now)

        def rerun(sample: ServedSample, target: RoutePlan):
            # The served route, re-run, answers as it served (a bfloat16 head at a tie).
            return MIXED if target == route else FLOAT32

        [summary] = served_answers_check(
            model=model,
            now=now,
            lookback=timedelta(days=1),
            count=2,
            max_age=HOUR,
            rng=random.Random(1),
            send=rerun,
        )

        assert summary.quarantined == []
        assert summary.outcomes[route.signature] == "agreed"

    def test_a_sampled_answer_may_part_where_both_routes_list_each_others_token(
        self, model, monkeypatch
    ):
        monkeypatch.setattr(probes, "audit_queue", lambda: None)
        route = plan(("h", 0, 1), ("t", 2, 3), model=model.key)
        now = timezone.now()
        sampled = SamplingParams(temperature=0.8, seed=7)
        self.record(model, [served(route, SHIFTED.token_ids, sampling=sampled)], now)

        def rerun(sample: ServedSample, target: RoutePlan):
            assert sample.rerun(target, request_id="x", top_logprobs=5).sampling.seed == 7
            return SHIFTED if target == route else REFERENCE

        [summary] = served_answers_check(
            model=model,
            now=now,
            lookback=timedelta(days=1),
            count=2,
            max_age=HOUR,
            rng=random.Random(1),
            send=rerun,
        )

        assert summary.quarantined == []
