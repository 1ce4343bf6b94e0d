"""The completion pipeline's fixtures: a network of fake heads (tests.support.fake_heads)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_heads import Net, fake_network


@pytest.fixture
def net() -> Iterator[Net]:
    yield from fake_network()
