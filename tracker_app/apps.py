from django.apps import AppConfig


class TrackerConfig(AppConfig):
    name = "tracker_app"
    verbose_name = "Tracker"

    def ready(self) -> None:
        # Connects the dashboard's receivers (pushes after a request finishes).
        from tracker_app.dashboard import live  # noqa: F401
