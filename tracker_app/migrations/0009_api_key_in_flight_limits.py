"""Each API key's share of the network (ADR-0004, "Auth and limits"): its own limits on
requests and KV tokens in flight (blank: the deployment's), and one lease row per request
in flight."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tracker_app", "0008_servedanswer"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="max_kv_tokens_in_flight",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="KV tokens its requests in flight may reserve in all, (prompt + max_tokens) × choices each (blank: the deployment's default)",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="apikey",
            name="max_requests_in_flight",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Requests this key may have in flight at once (blank: the deployment's default)",
                null=True,
            ),
        ),
        migrations.CreateModel(
            name="KeyLease",
            fields=[
                ("request_id", models.UUIDField(primary_key=True, serialize=False)),
                ("tokens", models.PositiveBigIntegerField()),
                ("expires_at", models.DateTimeField()),
                (
                    "api_key",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="leases",
                        to="tracker_app.apikey",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        fields=["api_key", "expires_at"], name="tracker_app_api_key_84e6d9_idx"
                    )
                ],
            },
        ),
    ]
