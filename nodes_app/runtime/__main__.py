"""Serve a shard without a tracker: ``python -m nodes_app.runtime --model K --layers A-B --port P``.

For tests and quick looks; ``manage.py runnode`` is the operator's command.
Without a tracker the node obeys plans signed by ``--tracker-key``, or with
``--dev-open`` anyone's; with neither it refuses every plan.
"""

from __future__ import annotations

import argparse
import sys

from nodes_app.protocol.limits import (
    GENERATE_MAX_BYTES,
    GENERATE_MAX_PROMPT_CHARS,
    LINK_MAX_FRAME_BYTES,
    STEP_TIMEOUT_RANGE,
    STEP_TIMEOUT_SECONDS,
)
from nodes_app.runtime.engine.capacity import add_capacity_arguments
from nodes_app.runtime.engine.sessions import IDLE_TIMEOUT_SECONDS
from nodes_app.runtime.engine.trust import DEV_OPEN_HELP, tracker_key_argument
from nodes_app.runtime.hop.link_guard import add_link_arguments, link_policy_from
from nodes_app.runtime.loading.precision import add_precision_arguments
from nodes_app.runtime.node import NodeOptions, parse_layers, run_node


def step_timeout_argument(value: str) -> float:
    """``--step-timeout``'s argparse type: seconds within ``STEP_TIMEOUT_RANGE``.

    At 0 every hop would time out at once and be banned for it.
    """
    low, high = STEP_TIMEOUT_RANGE
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not low <= seconds <= high:
        raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g} seconds")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodes_app.runtime")
    parser.add_argument("--model", required=True)
    parser.add_argument("--layers", required=True, type=parse_layers)
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"])
    add_precision_arguments(parser)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--weights")
    parser.add_argument("--draft-weights", help="a head's draft model (ADR-0028)")
    parser.add_argument("--node-id")
    add_capacity_arguments(parser)
    parser.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT_SECONDS)
    parser.add_argument(
        "--corrupt-hidden-states",
        type=float,
        default=0.0,
        metavar="SCALE",
        help="TEST ONLY: add noise of this scale to every hidden state the node outputs",
    )
    parser.add_argument("--tracker-key", type=tracker_key_argument, metavar="HEX")
    parser.add_argument("--dev-open", action="store_true", help=DEV_OPEN_HELP)
    parser.add_argument("--max-request-bytes", type=int, default=GENERATE_MAX_BYTES)
    parser.add_argument("--max-frame-bytes", type=int, default=LINK_MAX_FRAME_BYTES)
    add_link_arguments(parser)
    parser.add_argument("--max-prompt-chars", type=int, default=GENERATE_MAX_PROMPT_CHARS)
    parser.add_argument("--step-timeout", type=step_timeout_argument, default=STEP_TIMEOUT_SECONDS)
    args = parser.parse_args(argv)
    start, end = args.layers
    options = NodeOptions(
        model=args.model,
        start=start,
        end=end,
        port=args.port,
        host=args.host,
        device=args.device,
        dtype=args.dtype,
        quantize=args.quantize,
        threads=args.threads,
        weights=args.weights,
        draft_weights=args.draft_weights,
        node_id=args.node_id,
        kv_budget_mib=args.kv_budget,
        max_sessions=args.max_sessions,
        batch_wait_ms=args.batch_wait_ms,
        prefill_chunk=args.prefill_chunk,
        idle_timeout=args.idle_timeout,
        corrupt_hidden_states=args.corrupt_hidden_states,
        tracker_key=args.tracker_key,
        dev_open=args.dev_open,
        max_request_bytes=args.max_request_bytes,
        max_frame_bytes=args.max_frame_bytes,
        link_policy=link_policy_from(args),
        max_prompt_chars=args.max_prompt_chars,
        step_timeout=args.step_timeout,
    )
    return run_node(options)


if __name__ == "__main__":
    sys.exit(main())
