import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes_app", "0010_node_prefix_cache_figures"),
    ]

    operations = [
        migrations.AddField(
            model_name="languagemodel",
            name="draft",
            field=models.ForeignKey(
                blank=True,
                help_text="A smaller catalogue model with the same tokenizer that heads of this model run whole to guess its next tokens (speculative decoding, ADR-0028); empty: guesses from the prompt only",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="drafts_for",
                to="nodes_app.languagemodel",
            ),
        ),
    ]
