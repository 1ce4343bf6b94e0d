"""LanguageModel and TopologyEpoch moved to nodes_app (see nodes_app 0002): state only.

Their tables and rows now belong to nodes_app; routing_app keeps no table.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("routing_app", "0002_catalogue"),
        ("nodes_app", "0002_languagemodel_topologyepoch_from_routing_app"),
        # Every foreign key to the models points at nodes_app before they leave here.
        ("tracker_app", "0003_chatrequest_model_from_nodes_app"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="TopologyEpoch"),
                migrations.DeleteModel(name="LanguageModel"),
            ],
        ),
    ]
