"""The deadline settings (MESHNET_HOP_STEP_TIMEOUT, MESHNET_BUSY_DEADLINE): a value out of
range is refused by name; the step timeout's default and range are the nodes' own.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from meshnet_site.environment import BUSY_DEADLINE, HOP_STEP_TIMEOUT
from nodes_app.protocol.limits import STEP_TIMEOUT_RANGE, STEP_TIMEOUT_SECONDS


@pytest.mark.parametrize(
    ("setting", "value"),
    [(BUSY_DEADLINE, "0"), (BUSY_DEADLINE, "86400"), (HOP_STEP_TIMEOUT, "0.5"),
     (HOP_STEP_TIMEOUT, "3600"), (HOP_STEP_TIMEOUT, "soon")],
)  # fmt: skip
def test_deadlines_out_of_range_are_refused_by_name(setting: Any, value: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=setting.name):
        setting.read({setting.name: value})


def test_a_node_without_django_defaults_to_the_trackers_step_timeout() -> None:
    assert HOP_STEP_TIMEOUT.default == STEP_TIMEOUT_SECONDS
    assert (HOP_STEP_TIMEOUT.minimum, HOP_STEP_TIMEOUT.maximum) == STEP_TIMEOUT_RANGE
    assert HOP_STEP_TIMEOUT.read({}) == 30.0 and BUSY_DEADLINE.read({}) == 120.0
