"""Create the rows of every model ``nodes_app.shared.catalogue`` ships that the database lacks.

The catalogue module is the one list of shipped models; this migration reads
it rather than holding a copy. ``routing_app`` 0002 keeps its own frozen list:
a migration already applied never runs again, so rewriting it would change
nothing for existing databases and only make history lie.

Rows that exist are left as they are: prices and names belong to the
operator once the row exists. Only the fields this migration knows are
copied, so a field added to catalogue entries later cannot break it.
"""

from django.db import migrations

from nodes_app.shared.catalogue import SHIPPED


def create_missing_rows(apps, schema_editor):
    LanguageModel = apps.get_model("nodes_app", "LanguageModel")
    TopologyEpoch = apps.get_model("nodes_app", "TopologyEpoch")
    alias = schema_editor.connection.alias
    for entry in SHIPPED:
        model, _ = LanguageModel.objects.using(alias).get_or_create(
            key=entry.key,
            defaults={
                "display_name": entry.display_name,
                "num_layers": entry.num_layers,
                "weight_source": entry.weight_source,
                "prompt_price_per_1k": entry.prompt_price_per_1k,
                "completion_price_per_1k": entry.completion_price_per_1k,
            },
        )
        TopologyEpoch.objects.using(alias).get_or_create(model=model)


class Migration(migrations.Migration):
    dependencies = [("nodes_app", "0002_languagemodel_topologyepoch_from_routing_app")]

    # Going back keeps the rows: they may hold requests and nodes by then.
    operations = [migrations.RunPython(create_missing_rows, migrations.RunPython.noop)]
