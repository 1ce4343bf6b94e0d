"""RoutePolicyConfig: the default policy and its knobs, read from the settings at call time,
ranges enforced, and the policy object its name builds."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from routing_app.policies.adr0021 import Adr0021Policy
from routing_app.policies.config import POLICY_ADR0021, RoutePolicyConfig
from routing_app.policies.thompson import ThompsonLoadPolicy


def test_it_defaults_to_the_thompson_load_policy_with_the_adr_values():
    assert RoutePolicyConfig().to_dict() == {
        "policy": "thompson-load",
        "explore_share": 0.3,
        "weight_alpha": 1.0,
        "stats_half_life": 600.0,
        "min_sample_tokens": 8,
        "max_unsampled_seconds": 900.0,
        "load_exponent": 0.5,
    }


def test_it_reads_the_settings_as_they_are_when_called():
    with override_settings(
        MESHNET_ROUTE_EXPLORE_SHARE=0.1,
        MESHNET_ROUTE_WEIGHT_ALPHA=2.0,
        MESHNET_ROUTE_STATS_HALF_LIFE=60.0,
        MESHNET_ROUTE_MIN_SAMPLE_TOKENS=4,
        MESHNET_ROUTE_POLICY="adr0021",
        MESHNET_ROUTE_MAX_UNSAMPLED=30.0,
        MESHNET_ROUTE_LOAD_EXPONENT=1.5,
    ):
        config = RoutePolicyConfig.from_settings()

    assert config == RoutePolicyConfig(
        policy="adr0021",
        explore_share=0.1,
        weight_alpha=2.0,
        stats_half_life=60.0,
        min_sample_tokens=4,
        max_unsampled_seconds=30.0,
        load_exponent=1.5,
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("explore_share", 1.5, "MESHNET_ROUTE_EXPLORE_SHARE must be at most 1.0"),
        ("explore_share", -0.1, "MESHNET_ROUTE_EXPLORE_SHARE must be at least 0.0"),
        ("weight_alpha", 0.0, "MESHNET_ROUTE_WEIGHT_ALPHA must be greater than 0.0"),
        ("stats_half_life", -1.0, "MESHNET_ROUTE_STATS_HALF_LIFE must be greater than 0.0"),
        ("min_sample_tokens", 0, "MESHNET_ROUTE_MIN_SAMPLE_TOKENS must be at least 1"),
        ("policy", "greedy", "MESHNET_ROUTE_POLICY must be one of thompson-load, adr0021"),
        ("max_unsampled_seconds", 0.5, "MESHNET_ROUTE_MAX_UNSAMPLED must be at least 1.0"),
        ("load_exponent", 5.0, "MESHNET_ROUTE_LOAD_EXPONENT must be at most 4.0"),
    ],
)
def test_it_refuses_an_out_of_range_value_naming_the_setting(field, value, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        RoutePolicyConfig(**{field: value})


def test_it_refuses_an_invalid_setting_when_read():
    with (
        override_settings(MESHNET_ROUTE_EXPLORE_SHARE=2.0),
        pytest.raises(ImproperlyConfigured, match="EXPLORE_SHARE"),
    ):
        RoutePolicyConfig.from_settings()


def test_it_builds_the_policy_its_name_says_with_that_policys_knobs():
    thompson = RoutePolicyConfig(max_unsampled_seconds=120.0, load_exponent=1.5).route_policy()
    adr0021 = RoutePolicyConfig(
        policy=POLICY_ADR0021, explore_share=0.1, weight_alpha=2.0
    ).route_policy()

    assert isinstance(thompson, ThompsonLoadPolicy)
    assert (thompson.max_unsampled_seconds, thompson.load_exponent) == (120.0, 1.5)
    assert isinstance(adr0021, Adr0021Policy)
    assert (adr0021.explore_share, adr0021.weight_alpha) == (0.1, 2.0)
