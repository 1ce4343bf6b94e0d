"""A stranger flooding a node's hop link: many links, each sending big frames of forged plans.

Run as its own process (``python -m tests.support.link_flood ENDPOINT ...``): ``--links``
workers, spread over ``--sources`` loopback addresses (127.0.0.2, ...), each opening a
link and sending frames of ``--frame-mib`` MiB on it, one after another, until the node
closes it — each as many opening steps as a 240 KiB header holds (or the frame), each
with a plan signed by a key the node does not trust, their hidden states filling the
rest — then again, for ``--seconds``. Every second it prints ``frames=N refused=N``
(links refused at the handshake) so a test can see the flood running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import secrets
import time
import uuid

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from nodes_app.protocol.signed_plan import PlanHop, SignedPlan
from nodes_app.runtime.head.hop_links import link_url
from nodes_app.runtime.wire.entries import ForwardStep, LinkStep
from nodes_app.runtime.wire.frames import encode_requests
from nodes_app.shared.signing import sign_plan

HIDDEN = 64  # the tiny model's
HEADER_BUDGET = 240 * 1024  # under a node's bound for a first frame


def forged_frame(endpoint: str, node_id: str, layers: tuple[int, int], frame_bytes: int) -> bytes:
    """One frame of opening steps for ``node_id`` with plans signed by a stranger's key."""
    key = Ed25519PrivateKey.generate()
    plans: list[str] = []
    hops = (
        PlanHop("head", "http://127.0.0.1:9", 0, layers[0] - 1),
        PlanHop(node_id, endpoint, layers[0], layers[1]),
    )
    header = 0
    while header < min(HEADER_BUDGET, frame_bytes // 2):
        plan = SignedPlan(
            request_id=f"flood-{uuid.uuid4().hex}",
            model="tiny-random-llama",
            hops=hops,
            expires_at=int(time.time()) + 60,
            nonce=secrets.token_hex(16),
        )
        plan = dataclasses.replace(plan, signature=sign_plan(key, plan.signed_fields()))
        plans.append(plan.to_header())
        header += len(plans[-1]) + 400

    def frame_of(rows: int) -> bytes:
        entries = []
        for step_id, plan_header in enumerate(plans, start=1):
            step = ForwardStep(
                session_id=f"{plan_header[:8]}.{step_id}",
                start=layers[0],
                end=layers[1],
                position=0,
                dtype="float32",
                shape=(1, rows, HIDDEN),
                sampling=None,
            )
            body = bytes(rows * HIDDEN * 4)
            entries.append(LinkStep(step_id, step, body, secrets.token_hex(32), plan_header))
        return encode_requests(entries)

    header = len(frame_of(1)) - len(plans) * HIDDEN * 4
    return frame_of(max(1, (frame_bytes - header) // (len(plans) * HIDDEN * 4)))


class Counts:
    frames = 0
    refused = 0


async def worker(url: str, source: str, frame: bytes, until: float, counts: Counts) -> None:
    while time.monotonic() < until:
        try:
            async with connect(
                url,
                max_size=None,
                compression=None,
                open_timeout=10,
                close_timeout=1,
                ping_interval=None,
                local_addr=(source, 0),
            ) as websocket:
                # Frame after frame on the link, answers read and dropped, until it closes.
                reader = asyncio.create_task(_drain(websocket))
                while not reader.done() and time.monotonic() < until:
                    counts.frames += 1
                    await websocket.send(frame)
                reader.cancel()
        except InvalidStatus:
            counts.refused += 1
            await asyncio.sleep(0.05)
        except (OSError, TimeoutError, WebSocketException):
            await asyncio.sleep(0.05)


async def _drain(websocket: ClientConnection) -> None:
    with contextlib.suppress(WebSocketException):
        async for _ in websocket:
            pass


async def flood(args: argparse.Namespace) -> None:
    layers = (int(args.layers.split("-")[0]), int(args.layers.split("-")[1]))
    frame = forged_frame(args.endpoint, args.node_id, layers, int(args.frame_mib * 2**20))
    url = link_url(args.endpoint)
    until = time.monotonic() + args.seconds
    counts = Counts()
    sources = [f"127.0.0.{2 + i % args.sources}" for i in range(args.links)]
    tasks = [asyncio.create_task(worker(url, s, frame, until, counts)) for s in sources]
    print(f"flooding with frames of {len(frame)} bytes", flush=True)
    while time.monotonic() < until:
        await asyncio.sleep(1)
        print(f"frames={counts.frames} refused={counts.refused}", flush=True)
    await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--layers", required=True, help="the node's layers, A-B")
    parser.add_argument("--links", type=int, default=64)
    parser.add_argument("--sources", type=int, default=8)
    parser.add_argument("--frame-mib", type=float, default=57)
    parser.add_argument("--seconds", type=float, default=60)
    asyncio.run(flood(parser.parse_args()))


if __name__ == "__main__":
    main()
