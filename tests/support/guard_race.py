"""One contender of a race on the durable guards, run as its own process.

``python -m tests.support.guard_race OP VALUE THREADS TIMES NOW GO_FILE OUT`` sets
Django up on ``DATABASE_URL``, says it is ready (``OUT.ready``), waits for
``GO_FILE`` to exist, then runs OP in THREADS threads at once, each TIMES
times, and writes every result to OUT as one JSON list. OP is ``claim`` (claim_once of
VALUE) or ``hit`` (count_hit of VALUE in a one-hour window); NOW is the Unix
time both use. Started by :func:`tests.support.guards.race_in_processes`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import django


def main(
    op: str, value: str, threads: int, times: int, now: datetime, go_file: Path, out: Path
) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "meshnet_site.settings")
    django.setup()
    from django.db import connection

    from meshnet_site.guards.services import claim_once, count_hit

    def once() -> int | bool:
        if op == "claim":
            return claim_once("race", value, until=now + timedelta(hours=1), now=now)
        return count_hit(value, window_seconds=3600, now=now)

    results: list[int | bool] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def contend() -> None:
        start.wait()
        try:
            for _ in range(times):
                result = once()
                with lock:
                    results.append(result)
        finally:
            connection.close()

    out.with_suffix(".ready").touch()
    while not go_file.exists():
        time.sleep(0.01)
    workers = [threading.Thread(target=contend) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    op, value, threads, times, now, go_file, out = sys.argv[1:8]
    main(
        op,
        value,
        int(threads),
        int(times),
        datetime.fromtimestamp(float(now), tz=UTC),
        Path(go_file),
        Path(out),
    )
