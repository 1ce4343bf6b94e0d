"""The embedded Celery broker: kombu's filesystem transport, each message whole before
a worker can see it.

kombu's own ``Channel._put`` creates the message's file in the queue folder and
then writes it. A worker polling the folder can take the file while it is still
empty, fail to decode it and stop ("Unrecoverable error: JSONDecodeError";
kombu issue #1551). Here that stopped ``meshnet_up``'s worker, and with it the
whole demo. This channel writes each message under a hidden draft name in the
same folder, which ``_get`` passes over (it takes only ``<name>.<queue>.msg``),
and renames it into place: a rename within one folder is atomic.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    # kombu's own base classes name the message differently (payload, message).
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Put ``payload`` on ``queue``: written whole, then moved into the folder."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        draft = os.path.join(self.data_folder_out, f".draft-{name}")
        try:
            with open(draft, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(draft, final)
        except OSError as error:
            raise ChannelError(f"Cannot add file {final!r} to directory") from error


class Transport(filesystem.Transport):
    Channel = Channel
