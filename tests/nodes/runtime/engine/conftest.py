"""Fixtures the engine's tests share: where each family's tiny checkpoint lives."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checkpoints import FAMILIES


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One directory per family, made (``tiny_checkpoint``) by the first test that needs it,
    so the family table and the prefix-reuse table build each checkpoint once."""
    root = tmp_path_factory.mktemp("families")
    return {family: root / family for family in FAMILIES}
