"""The dashboard's pages, assets and the selectors that build its snapshot."""

from __future__ import annotations

import json
import re
import time
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework import status

from nodes_app.models import NodeStatus
from nodes_app.services import node_heartbeat
from tests.support.dashboard import (
    PASSWORD,
    TINY,
    api_key,
    completed_request,
    failed_request,
    make_node,
    staff_user,
    tiny_model,
)
from tests.support.endpoint_gate import isolated_gate
from tracker_app.completions import console
from tracker_app.dashboard import snapshot as dashboard
from tracker_app.models import AuditRun, Refund, RefundReason

ROOT = Path(settings.BASE_DIR)
TABS = ["Overview", "Routing (learned)", "Call wall", "Chat", "Billing"]


@pytest.fixture(autouse=True)
def _fresh_series(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "route_series", console.RouteSeries())


# --- pages -------------------------------------------------------------------


@pytest.mark.django_db
def test_an_anonymous_visitor_is_sent_to_the_sign_in_page(client: Client) -> None:
    response = client.get("/dashboard/")

    assert response.status_code == status.HTTP_302_FOUND
    assert response["Location"] == "/dashboard/login/?next=/dashboard/"


@pytest.mark.django_db
def test_a_signed_in_user_who_is_not_staff_is_sent_to_the_sign_in_page(client: Client) -> None:
    client.force_login(staff_user("visitor", is_staff=False))

    response = client.get("/dashboard/")

    assert response.status_code == status.HTTP_302_FOUND
    assert response["Location"].startswith("/dashboard/login/")


@pytest.mark.django_db
def test_staff_see_the_five_tabs_drawn_from_an_embedded_snapshot(client: Client) -> None:
    make_node("head-node", 0, 3)
    client.force_login(staff_user())

    response = client.get("/dashboard/")

    assert response.status_code == status.HTTP_200_OK
    page = response.content.decode()
    tabs = re.findall(r'<button type="button" role="tab"[^>]*>([^<]+)', page)
    assert [tab.strip() for tab in tabs] == TABS
    embedded = re.search(
        r'<script id="dashboard-snapshot" type="application/json">(.*?)</script>', page
    )
    assert embedded is not None
    snapshot = json.loads(embedded[1])
    [tiny] = [m for m in snapshot["models"] if m["key"] == TINY]
    assert [n["id"] for n in tiny["nodes"]] == ["head-node"]
    assert set(snapshot) >= {"models", "routing", "calls", "billing", "server_time"}
    assert 'name="csrf-token"' in page
    assert response["Cache-Control"].startswith("max-age=0")


@pytest.mark.django_db
def test_the_root_url_leads_to_the_dashboard(client: Client) -> None:
    response = client.get("/")

    assert response.status_code == status.HTTP_302_FOUND
    assert response["Location"] == reverse("dashboard")


@pytest.mark.django_db
def test_staff_sign_in_and_land_on_the_dashboard(client: Client) -> None:
    staff_user("operator")

    form = client.get("/dashboard/login/")
    response = client.post(
        "/dashboard/login/", {"username": "operator", "password": PASSWORD}, follow=False
    )

    assert form.status_code == status.HTTP_200_OK
    assert response.status_code == status.HTTP_302_FOUND
    assert response["Location"] == "/dashboard/"


@pytest.mark.django_db
def test_a_user_who_is_not_staff_cannot_sign_in(client: Client) -> None:
    staff_user("visitor", is_staff=False)

    response = client.post("/dashboard/login/", {"username": "visitor", "password": PASSWORD})

    assert response.status_code == status.HTTP_200_OK
    assert "staff account" in response.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_signing_out_ends_the_session(client: Client) -> None:
    client.force_login(staff_user())

    response = client.post("/dashboard/logout/")

    assert response.status_code == status.HTTP_302_FOUND
    assert client.get("/dashboard/").status_code == status.HTTP_302_FOUND


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/static/dashboard/dashboard.css",
        "/static/dashboard/js/main.js",
        "/static/vendor/uplot-1.6.32/uPlot.iife.min.js",
        "/static/admin/css/base.css",
    ],
)
def test_the_tracker_serves_the_dashboards_assets_itself(client: Client, path: str) -> None:
    response = client.get(path)

    assert response.status_code == status.HTTP_200_OK
    b"".join(response.streaming_content)  # type: ignore[attr-defined]
    response.close()


# --- style and markup rules ---------------------------------------------------


def test_every_colour_of_the_stylesheet_is_a_custom_property_of_root() -> None:
    css = (ROOT / "static" / "dashboard" / "dashboard.css").read_text()
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    root_blocks = re.findall(r":root\s*\{[^}]*\}", css)
    outside = css
    for block in root_blocks:
        outside = outside.replace(block, "")

    assert len(root_blocks) == 2  # light, and dark under prefers-color-scheme
    assert "prefers-color-scheme: dark" in css
    assert re.findall(r"#[0-9a-fA-F]{3,8}\b", outside) == []
    assert re.findall(r"\b(?:rgba?|hsla?)\(", outside) == []


def test_templates_extend_one_base_and_carry_no_inline_event_handlers() -> None:
    templates = sorted((ROOT / "templates").rglob("*.html"))
    pages = [t for t in templates if t.parent.name == "dashboard"]

    assert pages
    for page in pages:
        assert page.read_text().startswith('{% extends "base.html" %}'), page
    for template in templates:
        text = template.read_text()
        assert not re.search(r"\son[a-z]+\s*=", text), template
        assert "<script>" not in text, template
        assert "//cdn" not in text and "https://" not in text, template


def test_the_vendored_chart_library_keeps_its_version_and_licence() -> None:
    vendor = ROOT / "static" / "vendor" / "uplot-1.6.32"

    assert "MIT License" in (vendor / "LICENSE").read_text()
    assert "(v1.6.32)" in (vendor / "uPlot.iife.min.js").read_text()[:100]


# --- selectors -----------------------------------------------------------------


@pytest.mark.django_db
def test_the_overview_shows_which_node_serves_which_layers_and_the_gaps() -> None:
    make_node("head", 0, 1)
    make_node("tail-gone", 2, 3, status=NodeStatus.OFFLINE, seconds_silent=60)
    make_node("long-gone", 2, 3, status=NodeStatus.OFFLINE, seconds_silent=2 * 3600)

    [tiny] = [m for m in dashboard.models_overview() if m["key"] == TINY]

    assert [(n["id"], n["shard_start"], n["shard_end"], n["status"]) for n in tiny["nodes"]] == [
        ("head", 0, 1, "online"),
        ("tail-gone", 2, 3, "offline"),
    ]
    assert tiny["gaps"] == [[2, 3]]
    assert tiny["num_layers"] == 4
    node = tiny["nodes"][0]
    assert node["endpoint"] == "http://head.test:7000"
    assert node["last_heartbeat_at"] == pytest.approx(node["registered_at"])


@pytest.mark.django_db
def test_the_overview_shows_each_nodes_precision() -> None:
    make_node("old", 0, 1)
    quantised = make_node("quantised", 2, 3)
    quantised.precision = "bfloat16+int8"
    quantised.save()

    [tiny] = [m for m in dashboard.models_overview() if m["key"] == TINY]

    assert [(n["id"], n["precision"]) for n in tiny["nodes"]] == [
        ("old", "float32"),
        ("quantised", "bfloat16+int8"),
    ]


@pytest.mark.django_db
def test_the_overview_shows_each_nodes_prefix_cache_as_its_last_heartbeat_reported() -> None:
    make_node("cold", 0, 1)
    warm = make_node("warm", 2, 3)
    node_heartbeat(
        node=warm, active_sessions=1, queue_depth=0, measured_tps=50.0,
        prefix_cache_load=0.5, prefix_hits=9, now=timezone.now(), gate=isolated_gate(),
    )  # fmt: skip

    [tiny] = [m for m in dashboard.models_overview() if m["key"] == TINY]

    assert [(n["id"], n["prefix_cache_load"], n["prefix_hits"]) for n in tiny["nodes"]] == [
        ("cold", 0.0, 0),
        ("warm", 0.5, 9),
    ]


@pytest.mark.django_db
def test_a_model_is_fully_covered_once_online_nodes_serve_every_layer() -> None:
    make_node("head", 0, 2)
    make_node("overlap", 1, 3)

    [tiny] = [m for m in dashboard.models_overview() if m["key"] == TINY]

    assert tiny["gaps"] == []


@pytest.mark.django_db
def test_the_recent_calls_come_from_the_request_records_with_their_cost() -> None:
    head = make_node("head", 0, 3)
    key = api_key()
    done = completed_request(key=key, hops=[head], route=f"{TINY} | head[0-3]", mode="scout")
    cancelled = failed_request(key=key, model=tiny_model(), cancelled=True)

    calls = {c["request_id"]: c for c in dashboard.calls_recent()}

    finished = calls[str(done.pk)]
    assert (finished["state"], finished["route"], finished["mode"]) == (
        "completed",
        f"{TINY} | head[0-3]",
        "scout",
    )
    assert (finished["tokens"], finished["cost"]) == (500, "0.020000")
    assert finished["api"] == "chat.completions"
    stopped = calls[str(cancelled.pk)]
    assert (stopped["state"], stopped["cost"], stopped["error"]) == (
        "cancelled",
        None,
        "hop x failed",
    )
    assert "tokens" not in stopped  # the console's live count stays on the wall
    assert dashboard.call_record(request_id=str(done.pk)) == finished
    assert dashboard.call_record(request_id="not-a-uuid") is None


@pytest.mark.django_db
def test_a_recent_call_shows_the_prompt_tokens_its_route_took_from_the_prefix_caches() -> None:
    head = make_node("head", 0, 3)
    key = api_key()
    plain = completed_request(key=key, hops=[head])
    reused = completed_request(key=key, hops=[head], cached_tokens=640)

    calls = {c["request_id"]: c for c in dashboard.calls_recent()}

    assert calls[str(plain.pk)]["cached_tokens"] == 0
    assert (calls[str(reused.pk)]["prompt_tokens"], calls[str(reused.pk)]["cached_tokens"]) == (
        1000,
        640,
    )


@pytest.mark.django_db
def test_a_call_whose_client_left_shows_the_tokens_it_was_billed_for() -> None:
    head = make_node("head", 0, 3)
    left = completed_request(key=api_key(), hops=[head], completion_tokens=4, left=True)

    [call] = [c for c in dashboard.calls_recent() if c["request_id"] == str(left.pk)]

    assert (call["state"], call["error"], call["tokens"]) == (
        "cancelled",
        "client disconnected",
        4,
    )
    assert call["cost"] is not None


@pytest.mark.django_db
def test_billing_shows_charges_per_key_earnings_per_wallet_and_the_work_units() -> None:
    head = make_node("head", 0, 1, wallet="aa" * 32)
    tail = make_node("tail", 2, 3, wallet="bb" * 32)
    alice, bob = api_key("alice"), api_key("bob")
    completed_request(key=alice, hops=[head, tail])
    completed_request(key=alice, hops=[head, tail])
    refunded = completed_request(
        key=bob, hops=[head, tail], prompt_tokens=500, completion_tokens=250
    )
    failed_request(key=bob, model=tiny_model())
    now = timezone.now()
    audit = AuditRun.objects.create(started_at=now, window_start=now)
    Refund.objects.create(
        billing=refunded.billing,
        amount=Decimal("0.010000"),
        reason=RefundReason.CORRUPT_ROUTE,
        audit_run=audit,
    )

    billing = dashboard.billing_summary()

    assert billing["totals"] == {
        "charged": "0.050000",
        "network_fees": "0.002500",
        "refunded": "0.010000",
    }
    assert [
        (k["name"], k["requests"], k["charged"], k["refunded"]) for k in billing["api_keys"]
    ] == [
        ("alice", 2, "0.040000", "0.000000"),
        ("bob", 1, "0.010000", "0.010000"),
    ]
    earned = {w["wallet"]: w["earned"] for w in billing["wallets"]}
    assert earned == {"aa" * 32: "0.023750", "bb" * 32: "0.023750"}
    newest = billing["records"][0]
    assert newest["api"] == "chat.completions"
    assert [(u["node_id"], u["units"]) for u in newest["work_units"]] == [
        ("head", 750 * 2),
        ("tail", 750 * 2),
    ]


@pytest.mark.django_db
def test_the_routing_section_is_the_routing_table_with_each_routes_speed_over_time() -> None:
    make_node("solo", 0, 3)
    signature = f"{TINY} | solo[0-3]"
    console.route_series.record(model_key=TINY, signature=signature, tokens_per_second=80, at=1e9)
    console.route_series.record(
        model_key=TINY, signature=signature, tokens_per_second=90.0, at=time.time()
    )

    section = dashboard.routing_section(model_key=TINY)

    [model] = section["models"]
    assert [r["signature"] for r in model["routes"]] == [signature]
    assert [tps for _, tps in model["series"][signature]] == [90.0]  # the old point aged out
    assert set(section["config"]) >= {"explore_share", "weight_alpha"}
