"""ChatRequest's model now lives in nodes_app (see nodes_app 0002): state only.

The column and its foreign key already point at the renamed table.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes_app", "0002_languagemodel_topologyepoch_from_routing_app"),
        ("tracker_app", "0002_chatrequest_billingrecord_workunit_and_more"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="chatrequest",
                    name="model",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="requests",
                        to="nodes_app.languagemodel",
                    ),
                ),
            ],
        ),
    ]
