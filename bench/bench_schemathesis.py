"""The long schemathesis run: the tracker's schema against a live tracker, many examples.

The same run as ``tests/tracker/completions/test_schema_fuzz.py`` (a real runtracker
over a fresh database, PostgreSQL when DATABASE_URL names one; a real API key;
a node registered with a real wallet for the heartbeats;
every phase; the checks not_a_server_error, status_code_conformance,
content_type_conformance and response_schema_conformance) with
``EXAMPLES`` examples per operation instead of the test's 10, and new
requests each run: a random seed, printed (``SCHEMATHESIS_SEED=<seed>``
repeats a run). A ratio means nothing here: it prints the examples run and
the failures, and exits 1 on any failure.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.schema_checks import (
    FUZZED_TRACKER_SETTINGS,
    operations_of,
    registered_node,
    schemathesis_run,
)
from tracker_app.localnet import LocalNetwork, fresh_process_database
from tracker_app.localnet.stand_in_nodes import challenge_responder

EXAMPLES = 200


def main() -> None:
    seed = int(os.environ.get("SCHEMATHESIS_SEED") or random.randrange(2**32))
    workdir = Path(tempfile.mkdtemp(prefix="meshnet-schemathesis-"))
    began = time.perf_counter()
    with (
        fresh_process_database() as database_url,
        challenge_responder() as responder,
        LocalNetwork.throwaway(
            workdir=workdir, database_url=database_url, env=FUZZED_TRACKER_SETTINGS
        ) as network,
    ):
        network.start_tracker()
        run = schemathesis_run(
            network.url,
            api_key=network.create_api_key("bench"),
            node=registered_node(network.url, responder),
            max_examples=EXAMPLES,
            seed=seed,
            workdir=workdir,
            timeout=1800,
        )
        operations = operations_of(network.url)
    seconds = time.perf_counter() - began
    if run.failures or run.returncode:
        print(run.output)
    print(f"schemathesis: {EXAMPLES} examples per operation, every phase, seed {seed}")
    print(
        f"  operations tested   {run.operations} of {len(operations)} (the schema itself unfuzzed)"
    )
    print(f"  examples run        {run.examples}")
    for method, path in operations:
        label = f"{method} {path}"
        if label in run.report["valid_rates"]:
            print(f"    accepted  {run.accepted(label):5d}  {label}")
    print(f"  failures            {run.failures}")
    print(f"  seconds             {seconds:.0f} (report: {workdir / 'schemathesis.json'})")
    if run.failures or run.returncode:
        sys.exit(1)


if __name__ == "__main__":
    main()
