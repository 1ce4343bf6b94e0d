"""Start a whole network on this machine (what `make demo` runs)."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from nodes_app.models import Node, NodeStatus
from tracker_app.launcher import Network, TopologyError, topology_load
from tracker_app.services import api_key_create


class Command(BaseCommand):
    help = "Start tracker, worker and nodes on this machine; Ctrl-C stops everything."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--topology", type=Path, default=None, help="JSON topology file")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            topology = topology_load(options["topology"])
        except TopologyError as exc:
            raise CommandError(str(exc)) from None
        network = Network(
            topology, log_dir=Path(settings.BASE_DIR) / "var" / "logs", say=self.stdout.write
        )
        try:
            network.start()
            self.stdout.write("waiting for the nodes to load their shards and register…")
            # Only this topology's endpoints: rows of an earlier run do not count.
            network.wait_for_nodes(
                lambda: Node.objects.filter(
                    status=NodeStatus.ONLINE, endpoint__in=topology.node_endpoints
                ).count(),
                timeout=300,
            )
            self.print_welcome(topology.tracker_url)
            while True:
                network.check_alive()
                time.sleep(1)
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
        except (RuntimeError, TimeoutError) as exc:
            raise CommandError(str(exc)) from None
        finally:
            network.stop()

    def print_welcome(self, tracker_url: str) -> None:
        login = "your existing superuser"
        user_model = get_user_model()
        if not user_model.objects.filter(is_superuser=True).exists():
            password = secrets.token_urlsafe(12)
            user_model.objects.create_superuser("admin", password=password)
            login = f"user admin, password {password}"
        key = api_key_create(name="demo").plain
        self.stdout.write(
            "\n".join(
                [
                    "",
                    f"Meshnet is up. Dashboard: {tracker_url}/dashboard/  ({login})",
                    f"  admin:     {tracker_url}/admin/",
                    f"  routing:   {tracker_url}/v1/routing",
                    f"  API key:   {key}",
                    "Press Ctrl-C to stop everything.",
                    "",
                ]
            )
        )
