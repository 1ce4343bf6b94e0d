"""Start the whole demo network on this machine (what `make demo` runs); the steps live in
tracker_app.localnet.demo."""

from __future__ import annotations

import secrets
import signal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tracker_app.api_keys.services import api_key_create, api_key_lookup
from tracker_app.localnet import LocalNetwork, ProcessExited, TopologyError, demo, topology_load
from tracker_app.models import ApiKey

# The demo's own login and key. The marker (in the user's last name, shown in the
# admin) is how the demo tells its user from an operator's of the same name.
DEMO_USERNAME = "meshnet-demo"
DEMO_MARKER = "created by meshnet_up"
DEMO_KEY_NAME = "meshnet-demo"


class Command(BaseCommand):
    help = (
        "Start a tracker, a worker with beat and a topology's nodes on this machine, warm up "
        "every route and print the dashboard URL, login and API key; Ctrl-C stops everything."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--topology",
            default=None,
            help="a shipped topology name (mixed, split, tiny) or a TOML file; default mixed",
        )
        parser.add_argument(
            "--port-base",
            type=int,
            default=None,
            help="put the tracker on this port and the nodes on the next ones, in file order",
        )
        parser.add_argument(
            "--no-warm-up", action="store_true", help="skip the one request per candidate route"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            topology = topology_load(options["topology"])
        except TopologyError as exc:
            raise CommandError(str(exc)) from None
        if options["port_base"] is not None:
            topology = topology.with_port_base(options["port_base"])
        var_dir = Path(settings.VAR_DIR)
        say = self.stdout.write
        # The parts run in process groups of their own: a terminal's Ctrl-C
        # reaches only this command, and a SIGTERM (a service manager's stop)
        # must stop them as Ctrl-C does, not orphan them. SIGINT is handled
        # explicitly too: a command started in the background by a script
        # inherits it ignored, and Python then leaves it ignored.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _interrupt)
        try:
            with demo.demo_lock(var_dir):
                demo.check_ports_free(topology)
                say(f"topology {topology.source}; state in {var_dir}")
                call_command("migrate", interactive=False, verbosity=0)
                credentials, is_new = self.credentials(var_dir)
                network = LocalNetwork.operator(
                    log_dir=var_dir / "logs", say=say, host=topology.host
                )
                with network:
                    demo.start_network(network, topology, say=say)
                    demo.wait_for_nodes(network, say=say)
                    demo.wait_for_routes(network, topology, say=say)
                    if not options["no_warm_up"]:
                        demo.warm_up(network, topology, credentials.api_key, say=say)
                    say(
                        demo.ready_block(
                            network.url, topology, credentials, password_shown=is_new,
                            credentials_path=var_dir / demo.CREDENTIALS_FILE,
                        )
                    )  # fmt: skip
                    demo.run_until_stopped(network)
        except KeyboardInterrupt:
            say("\nstopped.")
        except (demo.DemoAlreadyRunning, ProcessExited, TimeoutError) as exc:
            raise CommandError(str(exc)) from None

    def credentials(self, var_dir: Path) -> tuple[demo.DemoCredentials, bool]:
        """The stored demo login and key when both still work here, else new ones (stored);
        and whether they are new (the password is printed only then).

        Only the demo's own user (``DEMO_USERNAME``, carrying ``DEMO_MARKER``) is ever
        created or given a new password; a user of that name the demo did not create is
        refused (CommandError), never touched. A new key revokes the demo's earlier ones.
        """
        stored = demo.credentials_load(var_dir)
        users = get_user_model().objects
        if (
            stored is not None
            and users.filter(username=stored.username, is_staff=True).exists()
            and api_key_lookup(plain=stored.api_key) is not None
        ):
            return stored, False
        password = secrets.token_urlsafe(12)
        user = users.filter(username=DEMO_USERNAME).first()
        if user is None:
            users.create_superuser(DEMO_USERNAME, password=password, last_name=DEMO_MARKER)
        elif user.last_name != DEMO_MARKER:
            # The database is shared and this account is someone's own: resetting its
            # password would lock its owner out.
            raise CommandError(
                f"a user named {DEMO_USERNAME!r} exists that meshnet_up did not create; "
                "rename or delete it, or run the demo on its own database"
            )
        else:
            # demo.json was lost or belongs to another database: the demo's own user
            # gets a new password, printed below and stored like the first.
            user.set_password(password)
            user.is_staff = user.is_superuser = True
            user.save()
        # The lost demo.json's key must not stay live with no one knowing it.
        ApiKey.objects.filter(name=DEMO_KEY_NAME, revoked=False).update(revoked=True)
        created = demo.DemoCredentials(
            username=DEMO_USERNAME,
            password=password,
            api_key=api_key_create(name=DEMO_KEY_NAME).plain,
        )
        demo.credentials_save(var_dir, created)
        return created, True


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
