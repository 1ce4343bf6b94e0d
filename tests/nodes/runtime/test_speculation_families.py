"""Every served family answers the same tokens with speculation on and off, split and whole:
greedy, and sampled under a seed.

A head's :class:`RouteDriver` over in-process hops (``tests/support/in_process_route``:
the head, every hop's engine and the link's codec, no processes), on each
family's tiny random checkpoint, whole and split in two (for the hybrid
families between linear-attention and full-attention layers). The prompt
repeats itself, so prompt-lookup drafts are proposed, accepted where the
model repeats too and rejected where it does not; the route's timing is fixed
so that every draft pays (up to eight a round). The answer must be the one
``"speculation": "off"`` gives, token for token, and never longer than
``max_tokens``; the usage reports the drafts sent and accepted. A sampled
answer draws once per delivered token from the same seeded generator either
way, so under one seed it too is the same answer (ADR-0028).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.checkpoints import FAMILIES, LAYERS, tiny_checkpoint
from tests.support.in_process_route import FixedTimings, InProcessRoute
from tests.support.sse import completion

PROMPT = "the mesh runs the layers; " * 4 + "the mesh"
TOKENS = 20
SPLITS = {"whole": [(0, LAYERS - 1)], "two hops": [(0, 2), (3, LAYERS - 1)]}


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("speculation-families")
    return {family: root / family for family in FAMILIES}


@pytest.fixture
def route(request: pytest.FixtureRequest, directories: dict[str, Path]) -> Iterator[InProcessRoute]:
    family, split = request.param
    directory = directories[family]
    if not directory.exists():
        tiny_checkpoint(family, directory)
    served = InProcessRoute(directory, SPLITS[split])
    yield served
    served.close()


@pytest.mark.parametrize(
    "route",
    [(family, split) for family in sorted(FAMILIES) for split in sorted(SPLITS)],
    indirect=True,
    ids=lambda value: "-".join(value),
)
def test_answers_are_the_same_with_speculation_on_and_off(route: InProcessRoute) -> None:
    off = route.generate(route.body(PROMPT, max_tokens=TOKENS, speculation="off"))
    on = route.generate(route.body(PROMPT, max_tokens=TOKENS), timings=FixedTimings())

    _, plain_ids, plain_last = completion(off)
    text, ids, last = completion(on)
    assert ids == plain_ids and text == completion(off)[0]
    assert len(ids) <= TOKENS
    assert last["choices"][0]["finish_reason"] == plain_last["choices"][0]["finish_reason"]
    usage = last["usage"]
    assert usage["completion_tokens"] == len(ids)
    assert 0 <= usage["accepted_tokens"] <= usage["drafted_tokens"] > 0
    assert "drafted_tokens" not in plain_last["usage"]

    sampled: dict[str, Any] = {"max_tokens": TOKENS, "temperature": 0.3, "top_p": 0.95, "seed": 11}
    off = route.generate(route.body(PROMPT, speculation="off", **sampled))
    on = route.generate(route.body(PROMPT, **sampled), timings=FixedTimings())
    assert completion(on)[1] == completion(off)[1]
