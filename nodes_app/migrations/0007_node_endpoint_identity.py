"""Each node's endpoint identity (the address and port it reaches), which bans and the
one-wallet-per-endpoint rule compare instead of the URL's spelling (ADR-0008).

Existing rows get theirs from their host: an address as written, a name as it
resolves now (its first address; a name that does not resolve keeps the name).
The periodic re-proof takes a node whose identity no longer matches offline,
so a row filled from a stale answer is corrected within one interval.
"""

import ipaddress
import socket
from urllib.parse import urlsplit

from django.db import migrations, models


def _identity(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    host = (parts.hostname or "").rstrip(".")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            address = ipaddress.ip_address(str(infos[0][4][0]).split("%", 1)[0])
        except (OSError, UnicodeError, IndexError, ValueError):
            return f"{host}:{port}"[:64]
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return f"loopback:{port}"
    text = f"[{address}]" if address.version == 6 else str(address)
    return f"{text}:{port}"


def fill_identities(apps, schema_editor):  # type: ignore[no-untyped-def]
    Node = apps.get_model("nodes_app", "Node")
    for node in Node.objects.only("pk", "endpoint").iterator():
        Node.objects.filter(pk=node.pk).update(endpoint_identity=_identity(node.endpoint))


class Migration(migrations.Migration):
    dependencies = [
        ("nodes_app", "0006_node_precision"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="endpoint_identity",
            field=models.CharField(
                blank=True,
                db_index=True,
                editable=False,
                help_text="The address and port the endpoint reaches (loopback:PORT for any "
                "loopback address): what bans and the one-wallet-per-endpoint rule compare",
                max_length=64,
            ),
        ),
        migrations.RunPython(fill_identities, migrations.RunPython.noop),
    ]
