from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing_app"
    verbose_name = "Routing"
