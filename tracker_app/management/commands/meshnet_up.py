"""Start a whole network on this machine (what `make demo` runs)."""

from __future__ import annotations

import secrets
import signal
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tracker_app.localnet import LocalNetwork, ProcessExited, Topology, TopologyError, topology_load
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
        log_dir = Path(settings.VAR_DIR) / "logs"
        # The parts run in process groups of their own: a terminal's Ctrl-C
        # reaches only this command, and a SIGTERM (a service manager's stop)
        # must stop them as Ctrl-C does, not orphan them.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            network = LocalNetwork.operator(
                log_dir=log_dir, say=self.stdout.write, host=topology.host
            )
            with network:
                self.start(network, topology)
                self.print_welcome(topology.tracker_url)
                while True:
                    network.check_alive()
                    time.sleep(1)
        except KeyboardInterrupt:
            self.stdout.write("\nstopped.")
        except (ProcessExited, TimeoutError) as exc:
            raise CommandError(str(exc)) from None

    def start(self, network: LocalNetwork, topology: Topology) -> None:
        """Tracker, worker, then every node; returns once every node registered."""
        network.start_tracker(port=topology.port)
        network.start_worker("--concurrency", "1")
        for node in topology.nodes:
            network.add_node(
                str(node.port),
                model=node.model,
                layers=node.layer_range,
                port=node.port,
                threads=node.threads,
                device=node.device,
                wait=False,
            )
        if topology.nodes:
            self.stdout.write("waiting for the nodes to load their shards and register…")
        network.wait_for_nodes(timeout=300)

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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
