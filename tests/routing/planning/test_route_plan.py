"""Route plans: a plan that exists runs every layer once, in order, from its head."""

from __future__ import annotations

import pytest

from routing_app.planning.route_plan import Hop, RoutePlan
from routing_app.planning.search import enumerate_routes
from tests.support.routing import record


def test_it_cannot_build_a_plan_whose_downstream_hop_restarts_at_layer_zero():
    """The ADR-0020 bug (downstream start_layer 0 after a 0-21 head) is unconstructible."""
    with pytest.raises(ValueError, match="must start at layer 22"):
        RoutePlan(
            "qwen",
            39,
            (Hop("gpu-abc", "http://gpu", 0, 21), Hop("cpu-def", "http://cpu", 0, 39)),
        )


def test_it_refuses_a_plan_that_stops_short_of_the_last_layer():
    with pytest.raises(ValueError, match="last layer is 39"):
        RoutePlan("qwen", 39, (Hop("gpu-abc", "http://gpu", 0, 21),))


def test_it_writes_the_signature_with_the_layers_each_hop_runs():
    plans = enumerate_routes(
        model_key="smollm2-135m",
        num_layers=30,
        nodes=[record("gpu-abc", 0, 21, tps=500.0), record("cpu-def", 10, 29, tps=50.0)],
    )

    assert [plan.signature for plan in plans] == ["smollm2-135m | gpu-abc[0-21] -> cpu-def[22-29]"]
