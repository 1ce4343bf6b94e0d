"""The API each request came through (ADR-0024): Chat Completions, the legacy
Completions, Anthropic Messages or OpenAI Responses; blank for requests recorded before."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tracker_app", "0009_api_key_in_flight_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="chatrequest",
            name="api",
            field=models.CharField(
                blank=True,
                choices=[
                    ("chat.completions", "Chat Completions"),
                    ("completions", "Completions (legacy)"),
                    ("messages", "Anthropic Messages"),
                    ("responses", "OpenAI Responses"),
                ],
                help_text="The API the request came through",
                max_length=24,
            ),
        ),
    ]
