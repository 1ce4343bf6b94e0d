"""The deployment's settings a completion proxy runs under: read from Django's settings,
any of them overridden where a caller says so."""

from __future__ import annotations

from decimal import Decimal

from django.test import override_settings

from tracker_app.completions.proxy_terms import (
    PROGRESS_INTERVAL_SECONDS,
    CompletionResult,
    ProxySettings,
)

DEPLOYMENT = override_settings(
    MESHNET_BUSY_DEADLINE=12.0,
    MESHNET_HOP_STEP_TIMEOUT=4.0,
    MESHNET_NETWORK_FEE_SHARE=Decimal("0.07"),
    MESHNET_REQUEST_DEADLINE=900.0,
    MESHNET_KEY_LEASE_SECONDS=30.0,
    MESHNET_NODE_HEARTBEAT_INTERVAL=5.0,
)


@DEPLOYMENT
def test_the_proxy_runs_under_the_deployments_deadlines_and_fee() -> None:
    terms = ProxySettings.from_settings()

    assert (terms.busy_deadline, terms.step_timeout, terms.fee_share) == (
        12.0,
        4.0,
        Decimal("0.07"),
    )
    assert (terms.request_deadline, terms.key_lease_seconds) == (900.0, 30.0)
    assert terms.busy_claim_grace == 10.0  # two heartbeat intervals
    assert terms.progress_interval == PROGRESS_INTERVAL_SECONDS


@DEPLOYMENT
def test_a_caller_overrides_only_what_it_names() -> None:
    terms = ProxySettings.from_settings(busy_deadline=0.5, clock=lambda: 1.0)

    assert (terms.busy_deadline, terms.step_timeout, terms.clock()) == (0.5, 4.0, 1.0)


def test_a_request_ends_with_neither_reply_nor_error_when_it_was_streamed() -> None:
    streamed = CompletionResult()

    assert (streamed.reply, streamed.error) == (None, None)
