"""A node's capacity settings as command-line options, shared by ``runnode`` and ``python -m``.

Torch-free on purpose: ``manage.py runnode`` registers these options when
Django loads its commands, and torch must not load then. What the settings
do is ADR-0010's: sessions are admitted against a KV budget, decode steps
are batched with a bounded wait, prefills run in chunks.
"""

from __future__ import annotations

import argparse

# Defaults of the scheduler (nodes_app.runtime.engine.scheduler).
DEFAULT_MAX_WAIT_SECONDS = 0.002
DEFAULT_PREFILL_CHUNK = 128


def _positive_mib(value: str) -> float:
    try:
        mib = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of MiB: {value!r}") from None
    if not mib > 0:
        raise argparse.ArgumentTypeError("must be more than 0 MiB")
    return mib


def _wait_ms(value: str) -> float:
    try:
        ms = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {value!r}") from None
    if not 0 <= ms <= 1000:
        raise argparse.ArgumentTypeError("must be between 0 and 1000 ms")
    return ms


def _count(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {value!r}")
    return int(value)


def add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kv-budget``, ``--max-sessions``, ``--batch-wait-ms``, ``--prefill-chunk``."""
    parser.add_argument(
        "--kv-budget",
        type=_positive_mib,
        metavar="MIB",
        help="MiB of KV cache the node admits sessions for; a session reserves what its "
        "positions may take, past the budget the node answers 503 node_busy "
        "(default: half the memory free at start, RAM or the GPU's)",
    )
    parser.add_argument(
        "--max-sessions",
        type=_count,
        metavar="N",
        help="optional ceiling on concurrent sessions, on top of the KV budget (default: none)",
    )
    parser.add_argument(
        "--batch-wait-ms",
        type=_wait_ms,
        default=DEFAULT_MAX_WAIT_SECONDS * 1000,
        metavar="MS",
        help="longest a decode step waits for other active sessions' steps to batch with "
        f"(a lone step never waits; default {DEFAULT_MAX_WAIT_SECONDS * 1000:g})",
    )
    parser.add_argument(
        "--prefill-chunk",
        type=_count,
        default=DEFAULT_PREFILL_CHUNK,
        metavar="POSITIONS",
        help="positions of a prefill run at a time, between decode batches "
        f"(default {DEFAULT_PREFILL_CHUNK})",
    )
