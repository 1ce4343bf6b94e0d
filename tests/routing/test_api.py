"""GET /v1/routing: the learned routing table as JSON."""

from __future__ import annotations

import random
import uuid

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from rest_framework import status
from rest_framework.test import APIClient

from nodes_app.services import topology_epoch_bump
from routing_app.learning.arms import DEFAULT_SAMPLE_SPREAD, SAMPLE_SPREAD_BOUNDS
from routing_app.learning.prefix_memory import RequestPrefix
from routing_app.services import route_choose, route_sample_record, route_served_record
from tests.support.routing import make_model, make_node
from tracker_app.api_keys.services import api_key_create

pytestmark = pytest.mark.django_db

ROUTE_KEYS = {
    "signature",
    "hops",
    "prior_tps",
    "tps",
    "coefficient",
    "expected_share",
    "scout_due",
    "samples",
    "weight",
    "status",
    "prompt_token_seconds",
    "answer_token_seconds",
    "drafted_per_token",
    "accepted_per_token",
}


def staff_client():
    client = APIClient()
    client.force_login(
        User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", password="x", is_staff=True)
    )
    return client


def key_client():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(name='client').plain}")
    return client


def table(model_key=None, client=None):
    query = {"model": model_key} if model_key else {}
    response = (client or staff_client()).get("/v1/routing", query)
    assert response.status_code == status.HTTP_200_OK
    return response.json()


def routes_of(model):
    (entry,) = table(model.key)["models"]
    return {route["signature"]: route for route in entry["routes"]}


@pytest.fixture
def mixed(store):
    model = make_model(num_layers=40)
    make_node(model, "gpu-abc", 0, 21, tps=11164.0)
    make_node(model, "cpu-def", 0, 39, tps=425.0)
    return model


def test_it_shows_config_epoch_and_every_candidate(mixed):
    body = table(mixed.key)

    assert body["config"] == {
        "policy": "thompson-load",
        "explore_share": 0.3,
        "weight_alpha": 1.0,
        "stats_half_life": 600.0,
        "min_sample_tokens": 8,
        "max_unsampled_seconds": 900.0,
        "load_exponent": 0.5,
    }
    (entry,) = body["models"]
    assert (entry["model"], entry["epoch"]) == (mixed.key, 1)
    assert [set(route) for route in entry["routes"]] == [ROUTE_KEYS, ROUTE_KEYS]


def test_it_lists_the_hybrid_route_with_its_tail_starting_at_layer_22(mixed):
    hybrid = routes_of(mixed)[f"{mixed.key} | gpu-abc[0-21] -> cpu-def[22-39]"]

    assert hybrid["hops"] == [
        {
            "node_id": "gpu-abc",
            "endpoint": "http://gpu-abc.test:7000",
            "start_layer": 0,
            "end_layer": 21,
        },
        {
            "node_id": "cpu-def",
            "endpoint": "http://cpu-def.test:7000",
            "start_layer": 22,
            "end_layer": 39,
        },
    ]
    assert hybrid["prior_tps"] == 425.0


def test_it_shows_unsampled_routes_with_all_traffic_on_the_best_prior(mixed):
    routes = list(routes_of(mixed).values())

    assert [r["status"] for r in routes] == ["unsampled", "unsampled"]
    assert [r["expected_share"] for r in routes] == [1.0, 0.0]
    assert [(r["tps"], r["coefficient"], r["samples"], r["weight"]) for r in routes] == [
        (None, None, 0, 0.0),
        (None, None, 0, 0.0),
    ]


def test_it_shows_how_far_the_models_requests_stray_from_their_routes_speed(mixed, store):
    assert table(mixed.key)["models"][0]["sample_spread"] == DEFAULT_SAMPLE_SPREAD
    decision = route_choose(model=mixed, rng=random.Random(1))
    for seconds in [4.0, 4.4] * 10:  # 40 tokens at 10 and about 9 tok/s: a spread of 5 %
        route_sample_record(decision=decision, output_tokens=40, elapsed_seconds=seconds)

    assert table(mixed.key)["models"][0]["sample_spread"] == SAMPLE_SPREAD_BOUNDS[0]


def test_it_shows_each_routes_token_costs_and_how_far_speculation_carried_it(mixed, store):
    decision = route_choose(model=mixed, rng=random.Random(1))
    assert {r["prompt_token_seconds"] for r in routes_of(mixed).values()} == {None}
    route_served_record(
        decision=decision,
        prefix=RequestPrefix(blocks=(), prompt_tokens=500, output_tokens=64),
        cached_tokens=100,
        first_token_seconds=2.0,
        output_tokens=41,
        elapsed_seconds=6.0,
        drafted=30,
        accepted=20,
    )

    served = routes_of(mixed)[decision.plan.signature]
    assert served["prompt_token_seconds"] == pytest.approx(2.0 / 400)
    assert served["answer_token_seconds"] == pytest.approx(4.0 / 40)
    assert served["drafted_per_token"] == pytest.approx(30 / 41)
    assert served["accepted_per_token"] == pytest.approx(20 / 41)
    # The model's other routes borrow its token costs until they have their own; a
    # route's speculation is its own.
    others = [r for r in routes_of(mixed).values() if r is not served]
    assert {round(r["prompt_token_seconds"], 9) for r in others} == {round(2.0 / 400, 9)}
    assert {r["accepted_per_token"] for r in others if r["signature"] != served["signature"]} <= {
        None
    }


def test_it_marks_routes_measured_before_a_topology_change_as_stale(mixed, store):
    decision = route_choose(model=mixed, rng=random.Random(1))
    route_sample_record(decision=decision, output_tokens=40, elapsed_seconds=4.0)

    topology_epoch_bump(model=mixed, reason="join: someone")

    route = routes_of(mixed)[decision.plan.signature]
    assert (route["status"], route["tps"], route["samples"]) == ("stale", 10.0, 1)
    assert table(mixed.key)["models"][0]["epoch"] == 2


def test_it_marks_a_route_through_a_held_node_quarantined(mixed, store):
    store.exclusions.ban_node(node_id="gpu-abc", seconds=60)

    hybrid = routes_of(mixed)[f"{mixed.key} | gpu-abc[0-21] -> cpu-def[22-39]"]

    assert (hybrid["status"], hybrid["expected_share"]) == ("quarantined", 0.0)


def test_it_lists_every_catalogue_model_without_a_filter(mixed):
    models = [entry["model"] for entry in table()["models"]]

    assert mixed.key in models
    assert "smollm2-135m" in models


def test_it_answers_an_unknown_model_with_an_openai_style_404(store):
    response = staff_client().get("/v1/routing", {"model": "no-such-model"})

    assert response.status_code == status.HTTP_404_NOT_FOUND
    assert response.json() == {
        "error": {
            "message": "The model 'no-such-model' does not exist; "
            "GET /v1/models lists the served ones",
            "type": "invalid_request_error",
            "code": "model_not_found",
        }
    }


def test_it_reports_the_policy_the_settings_hold_now(mixed):
    with override_settings(
        MESHNET_ROUTE_POLICY="adr0021",
        MESHNET_ROUTE_EXPLORE_SHARE=0.05,
        MESHNET_ROUTE_WEIGHT_ALPHA=2.0,
    ):
        config = table(mixed.key)["config"]

    assert (config["policy"], config["explore_share"], config["weight_alpha"]) == (
        "adr0021",
        0.05,
        2.0,
    )


def test_it_documents_the_endpoint_in_the_openapi_schema():
    response = APIClient().get("/api/schema/", {"format": "json"})

    assert "/v1/routing" in response.json()["paths"]


def serve_scripted_client(model, clock, requests, checkpoints):
    """``requests`` chats on two registered routes, one twice as fast; the table at each
    checkpoint, keyed by head node."""
    make_node(model, "quick", 0, 29, tps=50.0)
    make_node(model, "steady", 0, 29, tps=50.0)
    true_tps = {"quick": 60.0, "steady": 30.0}
    rng, noise = random.Random(5), random.Random(6)
    snapshots = []
    for request in range(1, requests + 1):
        decision = route_choose(model=model, rng=rng)
        tokens = 64
        speed = true_tps[decision.plan.head.node_id] * noise.uniform(0.9, 1.1)
        route_sample_record(decision=decision, output_tokens=tokens, elapsed_seconds=tokens / speed)
        clock.advance(1.0)
        if request in checkpoints:
            routes = {r["hops"][0]["node_id"]: r for r in table(model.key)["models"][0]["routes"]}
            snapshots.append(routes)
    return snapshots


@override_settings(MESHNET_ROUTE_POLICY="adr0021")
def test_it_shows_coefficients_converging_for_a_scripted_client(store, clock):
    """Two registered routes, one twice as fast: the table learns it from real samples."""
    model = make_model(num_layers=30)
    first, early, last = serve_scripted_client(model, clock, 300, (1, 10, 300))

    assert {r["status"] for r in first.values()} == {"proven", "unsampled"}
    assert {r["coefficient"] for r in first.values()} == {1.0, None}
    assert {r["status"] for r in early.values()} == {"proven"}
    assert {r["status"] for r in last.values()} == {"proven"}
    assert last["quick"]["coefficient"] == 1.0
    assert last["steady"]["coefficient"] == pytest.approx(0.5, abs=0.08)
    assert last["quick"]["expected_share"] == pytest.approx(2 / 3, abs=0.05)
    assert last["steady"]["expected_share"] == pytest.approx(1 / 3, abs=0.05)
    assert last["quick"]["samples"] + last["steady"]["samples"] == 300
    assert last["quick"]["samples"] > last["steady"]["samples"]


def test_the_default_policy_gives_the_twice_as_fast_route_nearly_all_traffic(store, clock):
    """thompson-load: the unsampled route takes part in the draw with the prior its node's
    record gives (ADR-0018), no scout due; once both are measured the faster one takes
    nearly every draw."""
    model = make_model(num_layers=30)
    first, last = serve_scripted_client(model, clock, 100, (1, 100))

    assert (first["steady"]["scout_due"], first["quick"]["scout_due"]) == (False, False)
    assert first["steady"]["status"] == "unsampled"
    assert 0.1 < first["steady"]["expected_share"] < 0.9
    assert not last["steady"]["scout_due"]
    assert last["quick"]["expected_share"] >= 0.95
    assert last["quick"]["expected_share"] + last["steady"]["expected_share"] == pytest.approx(1)
    assert last["steady"]["status"] == "proven"
    assert last["quick"]["samples"] + last["steady"]["samples"] == 100
    assert last["quick"]["samples"] >= 90


def test_it_refuses_an_anonymous_caller_with_a_401_in_the_error_shape(mixed):
    response = APIClient().get("/v1/routing", {"model": mixed.key})

    assert response.status_code == status.HTTP_401_UNAUTHORIZED
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert "gpu-abc.test" not in response.content.decode()


def test_it_refuses_a_wrong_api_key(mixed):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer mk-not-a-key")

    response = client.get("/v1/routing", {"model": mixed.key})

    assert response.status_code == status.HTTP_401_UNAUTHORIZED
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_it_refuses_a_signed_in_user_who_is_not_staff(mixed):
    client = APIClient()
    client.force_login(User.objects.create_user("plain-user", password="x"))

    response = client.get("/v1/routing", {"model": mixed.key})

    assert response.status_code == status.HTTP_403_FORBIDDEN
    assert response.json()["error"]["code"] == "staff_only"


def test_an_api_key_client_sees_the_routes_without_any_node_endpoint(mixed):
    body = table(mixed.key, client=key_client())

    hops = [hop for route in body["models"][0]["routes"] for hop in route["hops"]]
    assert hops and all(set(hop) == {"node_id", "start_layer", "end_layer"} for hop in hops)
    assert "gpu-abc.test" not in str(body)


def test_staff_see_the_node_endpoints(mixed):
    hops = [hop for route in table(mixed.key)["models"][0]["routes"] for hop in route["hops"]]

    assert {hop["endpoint"] for hop in hops} == {
        "http://gpu-abc.test:7000",
        "http://cpu-def.test:7000",
    }
