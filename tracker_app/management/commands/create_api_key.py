"""Create a client API key; the key alone is printed on the last line."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from tracker_app.api_keys.services import api_key_create


class Command(BaseCommand):
    help = "Create a client API key for /v1/chat/completions and print it (shown once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Who or what the key is for")

    def handle(self, *args: Any, **options: Any) -> None:
        issued = api_key_create(name=options["name"])
        self.stderr.write(f"API key {issued.api_key.prefix}… created for {options['name']!r}.")
        self.stdout.write(issued.plain)
