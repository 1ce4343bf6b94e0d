"""Settings come from the environment and fail loudly on bad values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError

from meshnet_site import environment as env_
from routing_app.policies.config import RoutePolicyConfig
from tracker_app.management.commands.runtracker import Command as RunTracker

ROOT = Path(__file__).resolve().parents[2]


def settings_in_subprocess(env: dict[str, str]) -> dict[str, object]:
    """Load the real settings module in a fresh process with exactly ``env``."""
    code = (
        "import json, django; from django.conf import settings; django.setup();"
        "print(json.dumps({'db': settings.DATABASES['default']['ENGINE'],"
        " 'db_name': settings.DATABASES['default']['NAME'],"
        " 'layer': settings.CHANNEL_LAYERS['default']['BACKEND'],"
        " 'broker': settings.CELERY_BROKER_URL,"
        " 'explore': settings.MESHNET_ROUTE_EXPLORE_SHARE}))"
    )
    base = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "meshnet_site.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**base, **env}, capture_output=True, text=True
    )
    if result.returncode != 0:
        return {"error": result.stderr}
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def test_no_environment_means_sqlite_in_memory_layer_and_a_serverless_broker() -> None:
    loaded = settings_in_subprocess({})

    assert loaded["db"] == "django.db.backends.sqlite3"
    assert str(loaded["db_name"]).endswith("var/meshnet.sqlite3")
    assert loaded["layer"] == "channels.layers.InMemoryChannelLayer"
    assert loaded["broker"] == "filesystem://"


def test_database_and_redis_urls_select_postgresql_and_redis() -> None:
    loaded = settings_in_subprocess(
        {
            "DATABASE_URL": "postgres://meshnet@db.internal:5432/meshnet",
            "REDIS_URL": "redis://cache.internal:6379/0",
            "DJANGO_SECRET_KEY": "k",
        }
    )

    assert loaded["db"] == "django.db.backends.postgresql"
    assert loaded["db_name"] == "meshnet"
    assert loaded["layer"] == "channels_redis.pubsub.RedisPubSubChannelLayer"
    assert loaded["broker"] == "redis://cache.internal:6379/0"


def test_a_shared_database_requires_a_secret_key() -> None:
    loaded = settings_in_subprocess({"DATABASE_URL": "postgres://meshnet@db/meshnet"})

    assert "DJANGO_SECRET_KEY must be set" in str(loaded["error"])


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("MESHNET_ROUTE_EXPLORE_SHARE", "1.5", "at most 1.0"),
        ("MESHNET_ROUTE_EXPLORE_SHARE", "-0.1", "at least 0.0"),
        ("MESHNET_ROUTE_WEIGHT_ALPHA", "0", "greater than 0.0"),
        ("MESHNET_ROUTE_STATS_HALF_LIFE", "soon", "must be a number"),
        ("MESHNET_ROUTE_MIN_SAMPLE_TOKENS", "0", "at least 1"),
        ("MESHNET_MAX_CHOICES", "0", "at least 1"),
        ("MESHNET_MAX_CHOICES", "129", "at most 128"),
        ("MESHNET_MAX_CHOICES", "2.5", "must be an integer"),
        ("DJANGO_DEBUG", "maybe", "must be a boolean"),
        ("REDIS_URL", "localhost:6379", "must start with redis://"),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable(name: str, value: str, words: str) -> None:
    loaded = settings_in_subprocess({name: value})

    assert "ImproperlyConfigured" in str(loaded["error"])
    assert name in str(loaded["error"])
    assert words in str(loaded["error"])


def test_route_settings_take_their_environment_values() -> None:
    assert settings_in_subprocess({"MESHNET_ROUTE_EXPLORE_SHARE": "0.05"})["explore"] == 0.05


def test_a_request_may_ask_for_four_choices_unless_the_operator_says_otherwise() -> None:
    assert env_.MAX_CHOICES.read({}) == 4
    assert env_.MAX_CHOICES.read({"MESHNET_MAX_CHOICES": "16"}) == 16


def test_readers_use_defaults_when_unset() -> None:
    assert env_.env_float({}, "X", 0.3, minimum=0, maximum=1) == 0.3
    assert env_.env_int({}, "X", 8, minimum=1) == 8
    assert env_.env_bool({}, "X", default=False) is False
    assert env_.env_list({}, "X", ["a"]) == ["a"]
    assert env_.env_list({"X": "a, b,,"}, "X", []) == ["a", "b"]


def test_the_embedded_secret_key_is_generated_once_and_kept(tmp_path: Path) -> None:
    first = env_.secret_key({}, tmp_path)
    second = env_.secret_key({}, tmp_path)

    assert first == second and len(first) > 40
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0


def test_the_tracker_key_file_defaults_to_the_state_folder_and_must_be_absolute(
    tmp_path: Path,
) -> None:
    assert env_.tracker_key_file({}, tmp_path) == tmp_path / "tracker_key"
    chosen = {"MESHNET_TRACKER_KEY_FILE": str(tmp_path / "keys" / "signing")}
    assert env_.tracker_key_file(chosen, tmp_path) == tmp_path / "keys" / "signing"
    with pytest.raises(ImproperlyConfigured, match="MESHNET_TRACKER_KEY_FILE"):
        env_.tracker_key_file({"MESHNET_TRACKER_KEY_FILE": "relative/key"}, tmp_path)


def test_a_plan_is_valid_for_a_minute_unless_told_and_never_past_what_nodes_accept() -> None:
    assert env_.PLAN_VALIDITY.read({}) == 60.0
    assert env_.PLAN_VALIDITY.read({"MESHNET_PLAN_VALIDITY": "600"}) == 600.0
    for outside in ("0.5", "601"):
        with pytest.raises(ImproperlyConfigured, match="MESHNET_PLAN_VALIDITY"):
            env_.PLAN_VALIDITY.read({"MESHNET_PLAN_VALIDITY": outside})


def test_postgresql_gives_up_connecting_after_a_few_seconds_unless_the_url_says_otherwise() -> None:
    default = env_.database_config({"DATABASE_URL": "postgres://u@db/meshnet"}, Path("/tmp"))
    chosen = env_.database_config(
        {"DATABASE_URL": "postgres://u@db/meshnet?connect_timeout=30"}, Path("/tmp")
    )

    assert default["OPTIONS"]["connect_timeout"] == env_.DATABASE_CONNECT_TIMEOUT
    assert int(chosen["OPTIONS"]["connect_timeout"]) == 30


def test_an_unparseable_database_url_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        env_.database_config({"DATABASE_URL": "nonsense://x"}, Path("/tmp"))


# (setting, runtracker flag or None, RoutePolicyConfig field, a value just outside, the edge inside)
ROUTE_BOUNDS = [
    (env_.ROUTE_EXPLORE_SHARE, "route_explore_share", "explore_share", 1.01, 1.0),
    (env_.ROUTE_EXPLORE_SHARE, "route_explore_share", "explore_share", -0.01, 0.0),
    (env_.ROUTE_WEIGHT_ALPHA, "route_weight_alpha", "weight_alpha", 0.0, 0.001),
    (env_.ROUTE_STATS_HALF_LIFE, "route_stats_half_life", "stats_half_life", 0.0, 0.001),
    (env_.ROUTE_MIN_SAMPLE_TOKENS, None, "min_sample_tokens", 0, 1),
    (env_.ROUTE_MAX_UNSAMPLED, "route_max_unsampled", "max_unsampled_seconds", 0.5, 1.0),
    (env_.ROUTE_LOAD_EXPONENT, "route_load_exponent", "load_exponent", 4.5, 4.0),
    (env_.ROUTE_LOAD_EXPONENT, "route_load_exponent", "load_exponent", -0.1, 0.0),
]


def test_the_route_policy_is_read_by_name_and_an_unknown_one_is_refused() -> None:
    assert env_.ROUTE_POLICY.read({}) == "thompson-load"
    assert env_.ROUTE_POLICY.read({"MESHNET_ROUTE_POLICY": " adr0021 "}) == "adr0021"
    with pytest.raises(ImproperlyConfigured, match="MESHNET_ROUTE_POLICY must be one of"):
        env_.ROUTE_POLICY.read({"MESHNET_ROUTE_POLICY": "fastest"})


@pytest.mark.parametrize(("setting", "flag", "field", "outside", "inside"), ROUTE_BOUNDS)
def test_the_environment_the_routing_config_and_runtracker_refuse_the_same_route_values(
    setting: env_.NumberSetting, flag: str | None, field: str, outside: float, inside: float
) -> None:
    too_far: dict[str, Any] = {field: outside}
    with pytest.raises(ImproperlyConfigured, match=setting.name):
        setting.read({setting.name: str(outside)})
    with pytest.raises(ImproperlyConfigured, match=setting.name):
        RoutePolicyConfig(**too_far)
    if flag is not None:
        with pytest.raises(CommandError, match="--" + flag.replace("_", "-")):
            RunTracker().apply_route_overrides({flag: outside})


@pytest.mark.parametrize(("setting", "flag", "field", "outside", "inside"), ROUTE_BOUNDS)
def test_the_environment_and_the_routing_config_accept_the_edge_of_each_route_range(
    setting: env_.NumberSetting, flag: str | None, field: str, outside: float, inside: float
) -> None:
    assert setting.read({setting.name: str(inside)}) == inside
    at_the_edge: dict[str, Any] = {field: inside}
    assert getattr(RoutePolicyConfig(**at_the_edge), field) == inside


def test_a_routing_config_built_in_code_has_the_settings_defaults() -> None:
    # The test run sets no MESHNET_ROUTE_* variable, so the settings hold their defaults.
    assert RoutePolicyConfig() == RoutePolicyConfig.from_settings()


def test_the_state_folder_is_the_projects_var_unless_set(tmp_path: Path) -> None:
    assert env_.var_dir({}, tmp_path) == tmp_path / "var"
    assert env_.var_dir({"MESHNET_VAR_DIR": "/srv/meshnet"}, tmp_path) == Path("/srv/meshnet")


def test_a_relative_state_folder_is_refused_not_resolved_against_the_cwd(tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match="MESHNET_VAR_DIR"):
        env_.var_dir({"MESHNET_VAR_DIR": "var"}, tmp_path)


def test_the_metrics_token_is_optional_but_never_short() -> None:
    assert env_.metrics_token({}) == ""
    assert env_.metrics_token({"MESHNET_METRICS_TOKEN": " a-token-long-enough-1 "}) == (
        "a-token-long-enough-1"
    )
    with pytest.raises(ImproperlyConfigured, match="MESHNET_METRICS_TOKEN"):
        env_.metrics_token({"MESHNET_METRICS_TOKEN": "short"})


@pytest.mark.parametrize("url", ["", "sqlite:///{tmp}/tracker.sqlite3"])
def test_every_sqlite_database_waits_for_the_write_lock(tmp_path: Path, url: str) -> None:
    # A SQLite DATABASE_URL (throwaway networks, benchmarks) shares the file
    # between processes as the default does: without these, two nodes
    # registering at once made the tracker answer 500 "database is locked".
    env = {"DATABASE_URL": url.format(tmp=tmp_path)} if url else {}
    config = env_.database_config(env, tmp_path)

    assert config["ENGINE"] == "django.db.backends.sqlite3"
    assert config["OPTIONS"] == {"timeout": 20, "transaction_mode": "IMMEDIATE"}
