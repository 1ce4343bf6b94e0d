from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "meshnet_site.outbox"
    label = "outbox"
    verbose_name = "Dashboard outbox"
    default_auto_field = "django.db.models.BigAutoField"
