"""``runnode --layers auto``: count what this node holds, ask the tracker where to serve.

The tracker answers ``GET /api/nodes/placement?model=KEY&layers=N`` with a
range and the reason for it (ADR-0019: uncovered layers first, then the
stage with the least capacity, sized to ``N``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from nodes_app.runtime.loading.footprint import MIB, memory_free, memory_hold, model_footprint
from nodes_app.runtime.tracker_client import RegistrationError
from nodes_app.shared.sources import resolve_source

PLACEMENT_PATH = "/api/nodes/placement"


class PlacementRefused(Exception):
    """No range for this node: its memory holds no layer, or the tracker said no (why)."""


@dataclass(frozen=True, slots=True)
class Placement:
    start: int
    end: int
    reason: str  # the tracker's rule, then this node's memory arithmetic


def place_node(
    *,
    tracker: str,
    model: str,
    weights: str | None,
    dtype: str,
    quantize: str,
    device: str,
    memory_bytes: int | None,
    kv_budget_bytes: int | None,
    retry_for: float = 30.0,
) -> Placement:
    """The layers this node should serve, as the tracker places a node that holds what
    its memory (``memory_bytes``, else what is free now) holds of ``model``."""
    footprint = model_footprint(
        resolve_source(model, weights), dtype=dtype, quantize=quantize, device=device
    )
    hold = memory_hold(
        footprint,
        memory_bytes=memory_free(device) if memory_bytes is None else memory_bytes,
        kv_budget_bytes=kv_budget_bytes,
    )
    if hold.layers < 1:
        raise PlacementRefused(
            f"this node's memory holds no whole layer of {model}: {hold.summary()}; "
            "give it more (--memory-gb), a smaller --kv-budget or a lower precision "
            f"(--dtype, --quantize); one layer needs "
            f"{(footprint.layer_bytes + footprint.ends_bytes) / MIB:.1f} MiB with the "
            "embeddings and LM head, on top of the KV budget"
        )
    url = tracker.rstrip("/") + PLACEMENT_PATH
    deadline = time.monotonic() + retry_for
    while True:
        try:
            response = httpx.get(url, params={"model": model, "layers": hold.layers}, timeout=30)
            break
        except httpx.TransportError as error:
            if time.monotonic() > deadline:
                raise RegistrationError(f"tracker unreachable: {error}") from error
            time.sleep(1.0)
    try:
        offer = response.json()
    except ValueError:
        offer = {}
    if response.status_code != 200:
        said = offer.get("error", {}) if isinstance(offer, dict) else {}
        raise PlacementRefused(
            f"the tracker placed no range (HTTP {response.status_code}): "
            f"{said.get('message', response.text[:300])} ({said.get('code', '?')})"
        )
    return Placement(
        start=int(offer["start_layer"]),
        end=int(offer["end_layer"]),
        reason=f"{offer['reason']}; {hold.summary()}",
    )
