"""Migrations carry an existing tracker database forward without losing a row.

The catalogue and topology epochs moved from routing_app to nodes_app; a
database migrated before the move must come out of ``migrate`` with its
models, epochs, nodes, requests, bills and the operator's permissions intact.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from nodes_app.shared.catalogue import SHIPPED

# The latest migrations before the move (auth's for the operator's permissions).
BEFORE_THE_MOVE = [
    ("auth", "0012_alter_user_first_name_max_length"),
    ("routing_app", "0002_catalogue"),
    ("nodes_app", "0001_initial"),
    ("tracker_app", "0002_chatrequest_billingrecord_workunit_and_more"),
]

# Schema changes cannot run inside a test's transaction (SQLite refuses).
pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def migrate(targets: list[tuple[str, str]]) -> Any:
    """Migrate the test database to ``targets``; the app registry of that state."""
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return MigrationExecutor(connection).loader.project_state(targets).apps


@pytest.fixture
def latest() -> Iterator[list[tuple[str, str]]]:
    """Every app's latest migration; the database is left there whatever the test does."""
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    yield leaves
    migrate(leaves)


def fill_before_the_move(apps: Any) -> None:
    """A tracker that served a request: a model, its epoch, a node, a billed request."""
    LanguageModel = apps.get_model("routing_app", "LanguageModel")
    TopologyEpoch = apps.get_model("routing_app", "TopologyEpoch")
    Node = apps.get_model("nodes_app", "Node")
    ApiKey = apps.get_model("tracker_app", "ApiKey")
    ChatRequest = apps.get_model("tracker_app", "ChatRequest")
    BillingRecord = apps.get_model("tracker_app", "BillingRecord")
    WorkUnit = apps.get_model("tracker_app", "WorkUnit")
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    User = apps.get_model("auth", "User")

    model = LanguageModel.objects.create(
        key="legacy-model",
        display_name="A model served before the move",
        num_layers=12,
        weight_source="hf:legacy/model",
        prompt_price_per_1k=Decimal("0.123456"),
        completion_price_per_1k=Decimal("0.654321"),
    )
    TopologyEpoch.objects.create(model=model, number=7, reason="join: legacy-node")
    node = Node.objects.create(
        id="legacy-node",
        wallet="ab" * 32,
        endpoint="http://10.0.0.9:7001",
        model=model,
        shard_start=0,
        shard_end=11,
        hardware="cpu",
        token_hash="0" * 64,
        registered_at=NOW,
        last_heartbeat_at=NOW,
    )
    key = ApiKey.objects.create(name="alice", prefix="mk-abcdef", key_hash="f" * 64)
    request = ChatRequest.objects.create(
        api_key=key,
        model=model,
        route_signature="legacy-model | legacy-node[0-11]",
        status="completed",
        prompt_tokens=10,
        completion_tokens=20,
        started_at=NOW,
        finished_at=NOW,
    )
    billing = BillingRecord.objects.create(
        request=request,
        prompt_charge=Decimal("0.001235"),
        completion_charge=Decimal("0.013086"),
        charge=Decimal("0.014321"),
        network_fee=Decimal("0.000716"),
    )
    WorkUnit.objects.create(
        billing=billing,
        node=node,
        start_layer=0,
        end_layer=11,
        tokens=30,
        units=360,
        amount=Decimal("0.013605"),
    )
    # An operator allowed to edit the catalogue in the admin.
    model_type, _ = ContentType.objects.get_or_create(
        app_label="routing_app", model="languagemodel"
    )
    change, _ = Permission.objects.get_or_create(
        content_type=model_type,
        codename="change_languagemodel",
        defaults={"name": "Can change model"},
    )
    User.objects.create(username="catalogue-editor").user_permissions.add(change)


def test_moving_the_catalogue_to_nodes_app_keeps_every_row(
    latest: list[tuple[str, str]],
) -> None:
    fill_before_the_move(migrate(BEFORE_THE_MOVE))

    apps = migrate(latest)

    LanguageModel = apps.get_model("nodes_app", "LanguageModel")
    model = LanguageModel.objects.get(key="legacy-model")
    assert (model.num_layers, model.weight_source) == (12, "hf:legacy/model")
    assert (model.prompt_price_per_1k, model.completion_price_per_1k) == (
        Decimal("0.123456"),
        Decimal("0.654321"),
    )
    assert (model.epoch.number, model.epoch.reason) == (7, "join: legacy-node")
    node = apps.get_model("nodes_app", "Node").objects.get(pk="legacy-node")
    assert node.model == model
    request = apps.get_model("tracker_app", "ChatRequest").objects.get(model=model)
    assert request.billing.charge == Decimal("0.014321")
    assert [(unit.node_id, unit.route_signature) for unit in request.billing.work_units.all()] == [
        ("legacy-node", "legacy-model | legacy-node[0-11]")
    ]  # backfilled by tracker 0006
    editor = apps.get_model("auth", "User").objects.get(username="catalogue-editor")
    [permission] = editor.user_permissions.all()
    assert (permission.content_type.app_label, permission.codename) == (
        "nodes_app",
        "change_languagemodel",
    )


def test_a_migrated_database_holds_every_model_the_catalogue_ships(
    latest: list[tuple[str, str]],
) -> None:
    migrate(BEFORE_THE_MOVE)
    apps = migrate(latest)

    rows = apps.get_model("nodes_app", "LanguageModel").objects.in_bulk(field_name="key")
    for entry in SHIPPED:
        row = rows[entry.key]
        assert (row.num_layers, row.weight_source) == (entry.num_layers, entry.weight_source)
        assert row.prompt_price_per_1k == entry.prompt_price_per_1k
        assert row.completion_price_per_1k == entry.completion_price_per_1k
        assert row.epoch.number == 0
