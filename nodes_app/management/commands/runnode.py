"""``manage.py runnode``: serve a shard of a model and join the tracker (nodes_app.runtime.node)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from meshnet_site.environment import HOP_STEP_TIMEOUT
from nodes_app.protocol.limits import (
    GENERATE_MAX_BYTES,
    GENERATE_MAX_PROMPT_CHARS,
    LINK_MAX_FRAME_BYTES,
)
from nodes_app.runtime.engine.capacity import add_capacity_arguments
from nodes_app.runtime.engine.sessions import IDLE_TIMEOUT_SECONDS
from nodes_app.runtime.engine.trust import DEV_OPEN_HELP, tracker_key_argument
from nodes_app.runtime.hop.link_guard import add_link_arguments, link_policy_from
from nodes_app.runtime.loading.precision import add_precision_arguments

AUTO = "auto"
GIB = 2**30


def _layers(value: str) -> tuple[int, int] | None:
    if value == AUTO:
        return None
    first, sep, last = value.partition("-")
    if not sep or not first.isdigit() or not last.isdigit() or int(last) < int(first):
        raise argparse.ArgumentTypeError(
            f"layers must be 'auto' or look like A-B with A <= B, not {value!r}"
        )
    return int(first), int(last)


def _gigabytes(value: str) -> float:
    try:
        gb = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of GB: {value!r}") from None
    if not gb > 0:
        raise argparse.ArgumentTypeError("must be more than 0 GB")
    return gb


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {value!r}")
    return int(value)


class Command(BaseCommand):
    help = (
        "Load layers A-B of a model (or the range the tracker places this node at), serve "
        "them over HTTP, register and heartbeat with a tracker."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", required=True, help="catalogue key, e.g. smollm2-135m")
        parser.add_argument(
            "--layers",
            type=_layers,
            default=None,
            metavar="A-B|auto",
            help="the layers to serve, inclusive; 'auto' (the default) asks the tracker: "
            "layers no node serves first, else the stage with the least capacity, as many "
            "of them as this node's memory holds (ADR-0019)",
        )
        parser.add_argument(
            "--memory-gb",
            type=_gigabytes,
            metavar="GB",
            help="memory (GiB) this node may use for the shard's weights and its KV budget: "
            "--layers auto sizes the range to it, and the KV budget defaults to half of it "
            "(default: the memory free at start, RAM or the GPU's)",
        )
        parser.add_argument("--port", required=True, type=int)
        parser.add_argument(
            "--tracker", required=True, help="tracker URL, e.g. http://127.0.0.1:8000"
        )
        parser.add_argument(
            "--tracker-key",
            type=tracker_key_argument,
            metavar="HEX",
            help="the tracker's plan-signing key (ed25519, hex): the node refuses to start if "
            "the tracker publishes another (default: trust the published key on first use)",
        )
        parser.add_argument("--dev-open", action="store_true", help=DEV_OPEN_HELP)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"])
        add_precision_arguments(parser)
        parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
        parser.add_argument(
            "--wallet-key", type=Path, help="default $MESHNET_VAR_DIR/wallets/node-<port>.key"
        )
        parser.add_argument("--weights", help="local directory, .gguf file or hub id for KEY")
        parser.add_argument(
            "--draft-weights",
            metavar="PATH",
            help="a head's draft model (same tokenizer; speculative decoding): a local "
            "directory or .gguf file (default: the draft the tracker names for KEY, from where "
            "the tracker reads it)",
        )
        parser.add_argument("--advertise", help="URL other nodes reach this one at")
        add_capacity_arguments(parser)
        parser.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT_SECONDS)
        parser.add_argument(
            "--max-request-bytes",
            type=_positive,
            default=GENERATE_MAX_BYTES,
            help=f"largest /v1/generate body read, in bytes (default {GENERATE_MAX_BYTES})",
        )
        parser.add_argument(
            "--max-frame-bytes",
            type=_positive,
            default=LINK_MAX_FRAME_BYTES,
            help="largest hop-link frame read, in bytes; a larger one closes the link "
            f"(default {LINK_MAX_FRAME_BYTES})",
        )
        add_link_arguments(parser)
        parser.add_argument(
            "--max-prompt-chars",
            type=_positive,
            default=GENERATE_MAX_PROMPT_CHARS,
            help="most characters of message content tokenised per request "
            f"(default {GENERATE_MAX_PROMPT_CHARS})",
        )
        parser.add_argument(
            "--step-timeout",
            type=float,
            metavar="SECONDS",
            help="seconds a downstream hop has to answer one step of a generation this node "
            "heads (a prefill gets this much more per 512 positions); a hop past it is reported "
            f"hung (default $MESHNET_HOP_STEP_TIMEOUT, else {HOP_STEP_TIMEOUT.default:g})",
        )
        parser.add_argument(
            "--corrupt-hidden-states",
            type=float,
            default=0.0,
            metavar="SCALE",
            help="TEST ONLY: add Gaussian noise of this scale to every hidden state the node "
            "outputs, so it computes wrong answers (what the tracker's route probe must catch)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        step_timeout = options["step_timeout"]
        if step_timeout is None:
            step_timeout = settings.MESHNET_HOP_STEP_TIMEOUT
        try:
            HOP_STEP_TIMEOUT.check(step_timeout, label="--step-timeout")
        except ImproperlyConfigured as error:
            raise CommandError(str(error)) from None
        # torch is imported here, never when Django loads the app.
        from nodes_app.runtime.engine.kv import DEFAULT_BUDGET_SHARE
        from nodes_app.runtime.node import NodeOptions, run_node
        from nodes_app.shared.model_errors import ModelSourceError, UnsupportedModelError

        kv_budget_mib = options["kv_budget"]
        memory_gb = options["memory_gb"]
        if memory_gb is not None and kv_budget_mib is None:
            kv_budget_mib = memory_gb * GIB * DEFAULT_BUDGET_SHARE / 2**20
        placement = None
        if options["layers"] is None:
            from nodes_app.runtime.autoplace import PlacementRefused, place_node
            from nodes_app.runtime.tracker_client import RegistrationError

            try:
                placed = place_node(
                    tracker=options["tracker"],
                    model=options["model"],
                    weights=options["weights"],
                    dtype=options["dtype"],
                    quantize=options["quantize"],
                    device=options["device"],
                    memory_bytes=None if memory_gb is None else int(memory_gb * GIB),
                    kv_budget_bytes=None if kv_budget_mib is None else int(kv_budget_mib * 2**20),
                )
            except (PlacementRefused, RegistrationError, ModelSourceError) as error:
                raise CommandError(str(error)) from error
            start, end, placement = placed.start, placed.end, placed.reason
        else:
            start, end = options["layers"]
        node = NodeOptions(
            model=options["model"],
            start=start,
            end=end,
            port=options["port"],
            host=options["host"],
            device=options["device"],
            dtype=options["dtype"],
            quantize=options["quantize"],
            threads=options["threads"],
            weights=options["weights"],
            draft_weights=options["draft_weights"],
            tracker=options["tracker"],
            wallet_key=options["wallet_key"]
            or Path(settings.VAR_DIR) / "wallets" / f"node-{options['port']}.key",
            advertise=options["advertise"],
            kv_budget_mib=kv_budget_mib,
            max_sessions=options["max_sessions"],
            batch_wait_ms=options["batch_wait_ms"],
            prefill_chunk=options["prefill_chunk"],
            idle_timeout=options["idle_timeout"],
            corrupt_hidden_states=options["corrupt_hidden_states"],
            tracker_key=options["tracker_key"],
            dev_open=options["dev_open"],
            max_request_bytes=options["max_request_bytes"],
            max_frame_bytes=options["max_frame_bytes"],
            link_policy=link_policy_from(options),
            max_prompt_chars=options["max_prompt_chars"],
            step_timeout=step_timeout,
            placement=placement,
        )
        try:
            status = run_node(node)
        except (ModelSourceError, UnsupportedModelError) as error:
            raise CommandError(str(error)) from error
        if status:
            raise CommandError("the node stopped with an error (see above)")
