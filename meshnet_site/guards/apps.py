from django.apps import AppConfig


class GuardsConfig(AppConfig):
    name = "meshnet_site.guards"
    label = "guards"
    verbose_name = "Durable guards"
    default_auto_field = "django.db.models.BigAutoField"
