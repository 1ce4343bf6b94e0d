"""Schemathesis against a live tracker finds nothing the schema does not say.

A real runtracker over a database of its own, and ``schemathesis run`` on the
schema it serves: requests generated for every operation (examples, boundary
values, valid and invalid data, then stateful sequences), each answer held to
four checks: no 5xx, a documented status, a documented content type, a body
matching the documented schema. Every request carries a real API key, but a
heartbeat, which carries a real node's id and token (a node registered with a
real wallet signature before the run); a deregistration's node id is fuzzed. A
registration's signature over its body cannot be generated, so registrations
are fuzzed for their refusals here; the signed happy path is checked in
``test_schema.py``. No node serves (the registered one's shard completes no
route), so a chat request never reaches generation. This is the
short, deterministic run; ``bench/bench_schemathesis.py`` runs the long one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.schema_checks import (
    FUZZED_TRACKER_SETTINGS,
    operations_of,
    registered_node,
    schemathesis_run,
)
from tests.support.network import Network, start_network
from tracker_app.localnet import fresh_process_database
from tracker_app.localnet.stand_in_nodes import ChallengeResponder

EXAMPLES = 10


@pytest.fixture
def fuzzed_tracker(tmp_path: Path) -> Iterator[Network]:
    with fresh_process_database() as database_url:
        yield from start_network(database_url, tmp_path, **FUZZED_TRACKER_SETTINGS)


def test_no_generated_request_gets_a_server_error_or_an_undocumented_answer(
    fuzzed_tracker: Network, responder: ChallengeResponder, tmp_path: Path
) -> None:
    run = schemathesis_run(
        fuzzed_tracker.url,
        api_key=fuzzed_tracker.api_key,
        node=registered_node(fuzzed_tracker.url, responder),
        max_examples=EXAMPLES,
        workdir=tmp_path,
    )

    assert run.failures == 0 and run.returncode == 0, run.output
    # Every operation was tested but the schema document, which schemathesis reads.
    assert run.operations == len(operations_of(fuzzed_tracker.url)) - 1, run.output
    assert run.examples > 100
    # Heartbeats ran as the registered node, not only into their refusals.
    assert run.accepted("POST /api/nodes/{node_id}/heartbeat") > 0, run.output
