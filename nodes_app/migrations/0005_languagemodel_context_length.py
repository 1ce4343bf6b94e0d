"""A model's context length, read from its weights when it is added (``add_model``).

The shipped rows get theirs here, frozen as they stand today (SmolLM2's GGUF
says 8192; the tiny model's built-in tokenizer takes 4096). A row that
already has a value is left as it is.
"""

from django.db import migrations, models

SHIPPED_CONTEXT_LENGTHS = {"smollm2-135m": 8192, "tiny-random-llama": 4096}


def fill_shipped_context_lengths(apps, schema_editor):
    LanguageModel = apps.get_model("nodes_app", "LanguageModel")
    alias = schema_editor.connection.alias
    for key, context_length in SHIPPED_CONTEXT_LENGTHS.items():
        LanguageModel.objects.using(alias).filter(key=key, context_length=None).update(
            context_length=context_length
        )


class Migration(migrations.Migration):
    dependencies = [("nodes_app", "0004_endpoint_reproof_and_prune_schedules")]

    operations = [
        migrations.AddField(
            model_name="languagemodel",
            name="context_length",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Positions the model was trained for, read from its weights "
                "(empty: not stated)",
                null=True,
            ),
        ),
        migrations.RunPython(fill_shipped_context_lengths, migrations.RunPython.noop),
    ]
