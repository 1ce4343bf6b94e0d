"""A node's precision (runnode --dtype / --quantize); rows from before it computed in float32."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes_app", "0005_languagemodel_context_length"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="precision",
            field=models.CharField(
                default="float32",
                help_text="Compute dtype, then +int8 when the weights are quantised (e.g. bfloat16+int8)",
                max_length=32,
            ),
        ),
    ]
