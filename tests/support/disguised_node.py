"""A node from the project's own code that corrupts only what it thinks no probe sees.

``python -m tests.support.disguised_node MODE ARGS…`` runs ``manage.py ARGS…``
(``runnode …``) with one twist, by mode:

- ``fixed-probe``: as the last hop, it answers honestly only a session that
  opens the way the fixed probe does (greedy with ``top_logprobs`` 5, which
  the last hop sees on the opening step, with the prompt's length); every
  other session gets a wrong token at every position;
- ``first-12``: as the last hop, honest for the first 12 tokens of every
  generation (what the fixed probe compares), wrong after;
- ``ignore-stops``: as a head, it never applies the client's stop sequences.

:func:`add_disguised_node` starts one joined to a test network.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from tracker_app.localnet import LocalNetwork, ManagedProcess, NodeProcess, free_port
from tracker_app.localnet.processes import node_argv

MODES = ("fixed-probe", "first-12", "ignore-stops")
# What the fixed probe compares, and the alternatives it asks for (tracker_app.probes).
HONEST_TOKENS = 12
PROBE_TOP_LOGPROBS = 5


def _disguise_tail(mode: str) -> None:
    from nodes_app.runtime.engine.core import NodeService
    from nodes_app.runtime.wire.entries import Choice

    forward = NodeService.hop_forward
    # session id -> (honest for the whole session, prompt length)
    opened: dict[str, tuple[bool, int]] = {}

    async def disguised(self: NodeService, session: Any, step: Any, hidden: Any) -> Any:
        result = await forward(self, session, step, hidden)
        if not isinstance(result, Choice):
            return result
        if step.position == 0:
            opened[step.session_id] = (step.logprobs == PROBE_TOP_LOGPROBS, step.shape[1])
        honest, prompt = opened.get(step.session_id, (False, 0))
        produced = 1 if step.position == 0 else step.position - prompt + 2
        if mode == "fixed-probe" and honest:
            return result
        if mode == "first-12" and produced <= HONEST_TOKENS:
            return result
        wrong = (result.token_id + 1) % self.admission.vocab_size
        return dataclasses.replace(result, token_id=wrong)

    NodeService.hop_forward = disguised  # type: ignore[method-assign]


def _ignore_stops() -> None:
    from nodes_app.runtime.head import output
    from nodes_app.runtime.head.text import StopMatcher

    class Deaf(StopMatcher):
        def __init__(self, stops: list[str]) -> None:
            super().__init__([])

    output.StopMatcher = Deaf  # type: ignore[misc]


def main(argv: list[str]) -> None:
    mode, *command = argv
    if mode not in MODES:
        raise SystemExit(f"mode must be one of {MODES}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "meshnet_site.settings")
    if mode == "ignore-stops":
        _ignore_stops()
    else:
        _disguise_tail(mode)
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *command])


def add_disguised_node(
    network: LocalNetwork, name: str, model: str, layers: tuple[int, int], mode: str
) -> NodeProcess:
    """Start a ``runnode`` with ``mode``'s twist joined to ``network``; not waited for."""
    port = free_port(network.host)
    argv = node_argv(
        model=model,
        layers=layers,
        port=port,
        tracker=network.url,
        host=network.host,
        wallet_key=network.workdir / "wallets" / f"wallet-{name}.key",
    )
    # node_argv is ``python manage.py runnode …``: the same command, through this module.
    argv = [sys.executable, "-m", "tests.support.disguised_node", mode, *argv[2:]]
    log = network.workdir / f"node-{name}.log"
    process = ManagedProcess(f"node-{name}", argv, env=network.env, log_path=log)
    node = NodeProcess(name, model, layers, f"http://{network.host}:{port}", process)
    network.nodes[name] = node
    network._started(process)
    return node


if __name__ == "__main__":
    main(sys.argv[1:])
