"""Step deadlines: a long prefill and an echo's last hop get longer to answer."""

from __future__ import annotations

from nodes_app.protocol.limits import ECHO_STEP_TIME_FACTOR, STEP_TIMEOUT_POSITIONS, step_time_limit


def test_an_echos_last_hop_gets_longer_for_scoring_every_prompt_position() -> None:
    assert step_time_limit(30.0, 1, echo=True) == 30.0 * ECHO_STEP_TIME_FACTOR
    blocks = step_time_limit(30.0, 2 * STEP_TIMEOUT_POSITIONS, echo=True)
    assert blocks == 60.0 * ECHO_STEP_TIME_FACTOR
