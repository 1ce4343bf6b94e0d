from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing_app"
    verbose_name = "Routing"

    def ready(self) -> None:
        from nodes_app.signals import topology_changed
        from routing_app.exclusions.receivers import probe_on_topology_change

        topology_changed.connect(probe_on_topology_change, dispatch_uid="routing-probe")
