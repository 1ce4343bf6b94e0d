"""The tracker's management commands as an operator uses them."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from tracker_app.api_keys.services import api_key_lookup
from tracker_app.localnet import manage_argv, run_command
from tracker_app.management.commands.runtracker import Command as RunTracker
from tracker_app.models import ApiKey


@pytest.mark.django_db
def test_create_api_key_prints_the_key_alone_on_the_last_line_and_stores_only_a_hash() -> None:
    out = io.StringIO()

    call_command("create_api_key", "alice", stdout=out, stderr=io.StringIO())

    key = out.getvalue().strip().splitlines()[-1]
    assert key.startswith("mk-") and " " not in key
    stored = ApiKey.objects.get(name="alice")
    assert key not in stored.key_hash and stored.key_hash != key
    assert api_key_lookup(plain=key) == stored
    assert api_key_lookup(plain=key + "x") is None


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("route_explore_share", 1.2, "--route-explore-share must be at most 1.0"),
        ("route_explore_share", -0.5, "--route-explore-share must be at least 0.0"),
        ("route_weight_alpha", 0.0, "--route-weight-alpha must be greater than 0.0"),
        ("route_stats_half_life", -1.0, "--route-stats-half-life must be greater than 0.0"),
        ("route_policy", "greedy", "--route-policy must be one of thompson-load, adr0021"),
        ("route_max_unsampled", 0.0, "--route-max-unsampled must be at least 1.0"),
        ("route_load_exponent", 9.0, "--route-load-exponent must be at most 4.0"),
    ],
)
def test_runtracker_refuses_out_of_range_routing_flags(
    flag: str, value: float | str, words: str
) -> None:
    with pytest.raises(CommandError, match=words):
        RunTracker().apply_route_overrides({flag: value})


@pytest.fixture
def restored_route_settings() -> Iterator[None]:
    names = ["MESHNET_ROUTE_EXPLORE_SHARE", "MESHNET_ROUTE_WEIGHT_ALPHA", "MESHNET_ROUTE_POLICY"]
    saved = {name: getattr(settings, name) for name in names}
    yield
    for name, value in saved.items():
        setattr(settings, name, value)


@pytest.mark.usefixtures("restored_route_settings")
def test_runtracker_flags_override_the_environment_settings() -> None:
    RunTracker().apply_route_overrides(
        {
            "route_explore_share": 0.1,
            "route_weight_alpha": 2.0,
            "route_stats_half_life": None,
            "route_policy": "adr0021",
        }
    )

    assert settings.MESHNET_ROUTE_POLICY == "adr0021"
    assert settings.MESHNET_ROUTE_EXPLORE_SHARE == 0.1
    assert settings.MESHNET_ROUTE_WEIGHT_ALPHA == 2.0
    assert settings.MESHNET_ROUTE_STATS_HALF_LIFE == 600.0


def test_runtracker_refuses_a_database_that_is_not_migrated(tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path}/empty.sqlite3"}
    env["DJANGO_SECRET_KEY"] = "k"
    result = run_command(manage_argv("runtracker", "--port", "1"), env=env, timeout=60)

    assert result.returncode != 0
    assert "run `manage.py migrate`" in result.stderr
