from django.apps import AppConfig


class NodesConfig(AppConfig):
    name = "nodes_app"
    verbose_name = "Nodes"
