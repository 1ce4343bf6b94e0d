"""Files that several processes, or threads of one, may create at once."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def create_once(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600) unless it exists already.

    Safe however many processes and threads race to create it (trackers and a
    worker share one key file; a tracker's first requests come in side by
    side): each writes the whole text under a name of its own and links it
    into place, so the first link wins and nobody reads half a file.
    """
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        with contextlib.suppress(FileExistsError):  # another caller's text won
            os.link(draft, path)
    finally:
        draft.unlink()
