"""Running a node: load the shard, benchmark it, serve it, and (optionally) join a tracker.

``runnode`` calls :func:`run_node` with a tracker; ``python -m nodes_app.runtime``
calls it without one (tests and quick looks). SIGTERM or Ctrl-C stops serving,
deregisters, and returns 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import platform
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx
import torch
import uvicorn

from nodes_app.protocol.limits import (
    GENERATE_MAX_BYTES,
    GENERATE_MAX_PROMPT_CHARS,
    LINK_MAX_FRAME_BYTES,
    STEP_TIMEOUT_SECONDS,
)
from nodes_app.protocol.registration import DraftNamed
from nodes_app.runtime.engine.benchmark import measure_decode_tps
from nodes_app.runtime.engine.capacity import DEFAULT_MAX_WAIT_SECONDS, DEFAULT_PREFILL_CHUNK
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.kv import bytes_per_position
from nodes_app.runtime.engine.runner import ShardRunner
from nodes_app.runtime.engine.sessions import IDLE_TIMEOUT_SECONDS
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.hop.link_guard import LinkPolicy
from nodes_app.runtime.loading.draft import load_draft
from nodes_app.runtime.loading.shard import LoadedShard, load_shard
from nodes_app.runtime.server import NodeIdentity, create_app, public_health
from nodes_app.runtime.tracker_client import (
    NodeAnnouncement,
    RegistrationError,
    TrackerClient,
    TrackerRegistration,
)
from nodes_app.shared.model_errors import ModelSourceError, UnsupportedModelError
from nodes_app.shared.signing import load_or_create_wallet
from nodes_app.shared.sources import parse_source, resolve_source

# How long an idle client connection stays open. Longer than the clients keep one in
# their pools (the tracker's and a head's httpx pools: 5 s at most): with uvicorn's
# default, also 5 s, a request could go out on a connection the node was closing,
# and the node was banned for it (seen under 200 concurrent chats).
KEEP_ALIVE_SECONDS = 30


@dataclass(frozen=True)
class NodeOptions:
    model: str
    start: int
    end: int
    port: int
    host: str = "127.0.0.1"
    device: str = "cpu"
    # Compute dtype ("auto": float32 on CPU, float16 on accelerators) and weight quantisation.
    dtype: str = "auto"
    quantize: str = "none"
    threads: int | None = None
    weights: str | None = None
    tracker: str | None = None
    wallet_key: Path | None = None
    node_id: str | None = None
    advertise: str | None = None
    # MiB of KV cache admitted (None: half the memory free at start); an optional count cap.
    kv_budget_mib: float | None = None
    max_sessions: int | None = None
    batch_wait_ms: float = DEFAULT_MAX_WAIT_SECONDS * 1000
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    idle_timeout: float = IDLE_TIMEOUT_SECONDS
    # What a head reads of a /v1/generate request before tokenising it.
    max_request_bytes: int = GENERATE_MAX_BYTES
    max_prompt_chars: int = GENERATE_MAX_PROMPT_CHARS
    # The largest hop-link frame this node reads (a larger one closes the link).
    max_frame_bytes: int = LINK_MAX_FRAME_BYTES
    # Who may hold a hop link and for how long (runnode --link-* options).
    link_policy: LinkPolicy = field(default_factory=LinkPolicy)
    # Seconds a downstream hop has to answer one step of a generation this node heads.
    step_timeout: float = STEP_TIMEOUT_SECONDS
    # TEST ONLY: noise added to every hidden state this node outputs (0: none).
    corrupt_hidden_states: float = 0.0
    # The tracker key (hex) the operator pins; None: trust the tracker's on first use.
    tracker_key: str | None = None
    # TESTS AND BENCHMARKS ONLY: serve unsigned plans and capability-less steps.
    dev_open: bool = False
    # Why the tracker placed the node at start-end (runnode --layers auto); None: chosen.
    placement: str | None = None
    # Where a head loads its draft model from (ADR-0028); None: where the tracker reads
    # the one it names for the model, if it names one.
    draft_weights: str | None = None

    @property
    def endpoint(self) -> str:
        if self.advertise:
            return self.advertise.rstrip("/")
        host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.gethostname()
        return f"http://{host}:{self.port}"


def parse_layers(value: str) -> tuple[int, int]:
    """``"A-B"`` as ``(A, B)``; raises ValueError for anything else."""
    first, sep, last = value.partition("-")
    if not sep or not first.strip().isdigit() or not last.strip().isdigit():
        raise ValueError(f"layers must look like A-B (e.g. 0-14), not {value!r}")
    start, end = int(first), int(last)
    if end < start:
        raise ValueError(f"layers {value}: the end must not be before the start")
    return start, end


def device_name(device: str) -> str:
    if device == "cuda" and torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    return platform.processor() or platform.machine() or device


def run_node(options: NodeOptions, *, out: TextIO = sys.stdout) -> int:
    # One line per heartbeat and per hop request would drown the node's own output.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if options.threads:
        torch.set_num_threads(options.threads)
    shard = load_shard(
        model_key=options.model,
        source=resolve_source(options.model, options.weights),
        start=options.start,
        end=options.end,
        device=options.device,
        dtype=options.dtype,
        quantize=options.quantize,
    )
    print(shard.summary(), file=out, flush=True)
    gate = PlanGate(tracker_key=options.tracker_key, dev_open=options.dev_open)
    service = NodeService(
        shard,
        node_id=options.node_id or f"local-{options.port}",
        kv_budget=None if options.kv_budget_mib is None else int(options.kv_budget_mib * 2**20),
        max_sessions=options.max_sessions,
        batch_wait=options.batch_wait_ms / 1000,
        prefill_chunk=options.prefill_chunk,
        idle_timeout=options.idle_timeout,
        corrupt_hidden_states=options.corrupt_hidden_states,
        gate=gate,
        max_request_bytes=options.max_request_bytes,
        max_prompt_chars=options.max_prompt_chars,
        step_timeout=options.step_timeout,
    )
    store = service.store
    print(
        f"KV budget {store.kv_budget / 2**20:.0f} MiB"
        f"{' (half the memory free at start)' if options.kv_budget_mib is None else ''}, "
        f"{bytes_per_position(shard, shard.start, shard.end)} bytes a position over the shard; "
        f"batch wait {options.batch_wait_ms:g} ms, prefill chunk {options.prefill_chunk}"
        + (f", at most {store.max_sessions} sessions" if store.max_sessions else ""),
        file=out,
        flush=True,
    )
    if options.dev_open:
        print(
            "WARNING: --dev-open: this node serves unsigned plans and steps without a "
            "capability, from anyone (for tests and benchmarks only)",
            file=out,
            flush=True,
        )
    if options.corrupt_hidden_states:
        print(
            f"WARNING: test-only corruption: noise of scale {options.corrupt_hidden_states} "
            "is added to every hidden state this node outputs",
            file=out,
            flush=True,
        )
    service.benchmark_tps = measure_decode_tps(service.runner)
    print(
        f"benchmark: {service.benchmark_tps:.1f} decode steps/s over layers "
        f"{shard.start}-{shard.end} with {torch.get_num_threads()} thread(s)",
        file=out,
        flush=True,
    )
    # What is loaded by now (torch, transformers, the shard) lives as long as the
    # process: out of the collector's sight, a full collection does not walk it
    # while serving, nor for seconds at exit.
    gc.freeze()
    return asyncio.run(_serve(options, shard, service, out))


async def load_head_draft(
    options: NodeOptions, service: NodeService, named: DraftNamed | None, out: TextIO
) -> None:
    """Load the draft model onto a head (ADR-0028): the one the tracker names for the model,
    from ``--draft-weights`` when given, else from where the tracker reads it.

    On the torch thread, before the node says it serves. A draft that does not
    load (another tokenizer, weights not found here) is reported and left out:
    the head drafts from the prompt only, as without one.
    """
    spec = options.draft_weights or (named.weight_source if named else None)
    if spec is None or not service.can_head:
        return
    key = named.key if named else "draft"
    shard = service.shard
    try:
        source = parse_source(spec)
        draft = await service.compute(
            lambda: load_draft(
                key=key,
                source=source,
                tokenizer=shard.tokenizer,
                device=options.device,
                dtype=shard.dtype,
                quantize=shard.quantize,
            )
        )
    except (ModelSourceError, UnsupportedModelError, OSError) as error:
        print(f"draft model {key} not loaded: {error}", file=out, flush=True)
        return
    service.draft = ShardRunner(draft)
    print(f"draft model: {draft.summary()}", file=out, flush=True)


class _Server(uvicorn.Server):
    # uvicorn re-raises SIGTERM after serve() returns, which would kill the
    # process before it deregisters; the node handles signals itself.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve(
    options: NodeOptions, shard: LoadedShard, service: NodeService, out: TextIO
) -> int:
    wallet = load_or_create_wallet(options.wallet_key) if options.wallet_key else None
    # The tracker proves the endpoint by challenging it while the node
    # registers, so the wallet answers challenges from the first request on.
    identity = NodeIdentity(wallet, options.endpoint) if wallet is not None else None
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
        tracker: TrackerClient | None = None
        if options.tracker:
            if wallet is None:
                raise ValueError("a node that registers needs its wallet key file")
            tracker = TrackerClient(options.tracker, wallet, client)
            if not await _pin_tracker_key(tracker, options, service, out):
                return 1
        return await _serve_joined(options, shard, service, tracker, identity, out)


async def _pin_tracker_key(
    tracker: TrackerClient, options: NodeOptions, service: NodeService, out: TextIO
) -> bool:
    """Pin the key the tracker signs plans with, before serving; False if the node must not start.

    With ``--tracker-key`` the published key must be that one; without, the
    published key is trusted on first use (for the life of this process).
    """
    try:
        published = await tracker.signing_key()
    except RegistrationError as error:
        print(f"error: {error}", file=out, flush=True)
        return False
    if options.tracker_key is not None and published != options.tracker_key:
        print(
            f"error: the tracker publishes signing key {published}, not the pinned "
            f"{options.tracker_key}: refusing to serve it",
            file=out,
            flush=True,
        )
        return False
    service.gate.pin(published)
    how = "pinned by --tracker-key" if options.tracker_key else "trusted on first use"
    print(f"tracker signing key {published} ({how})", file=out, flush=True)
    return True


async def _serve_joined(
    options: NodeOptions,
    shard: LoadedShard,
    service: NodeService,
    tracker: TrackerClient | None,
    identity: NodeIdentity | None,
    out: TextIO,
) -> int:
    config = uvicorn.Config(
        create_app(
            service,
            identity=identity,
            max_frame_bytes=options.max_frame_bytes,
            link_policy=options.link_policy,
        ),
        host=options.host,
        port=options.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        # Hop links: frames are bounded as they arrive, and carry tensors that
        # do not compress (deflate would cost more than it saves).
        ws="websockets-sansio",
        ws_max_size=options.max_frame_bytes,
        ws_per_message_deflate=False,
    )
    server = _Server(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            print(f"could not serve on {options.host}:{options.port}", file=out, flush=True)
            return 1
        await asyncio.sleep(0.05)

    status = 0
    registration: TrackerRegistration | None = None
    if tracker is not None:
        announcement = NodeAnnouncement(
            endpoint=options.endpoint,
            model=options.model,
            shard_start=shard.start,
            shard_end=shard.end,
            num_layers=shard.num_layers,
            hardware=shard.device.type,
            device_name=device_name(options.device),
            precision=shard.precision,
            benchmark_tps=service.benchmark_tps,
        )
        try:
            registration = await tracker.register(announcement)
        except RegistrationError as error:
            print(f"error: {error}", file=out, flush=True)
            stop.set()
            status = 1
        else:
            service.node_id = registration.node_id
    if not stop.is_set():
        await load_head_draft(options, service, registration.draft if registration else None, out)
    if not stop.is_set():
        # The one ready line; the harness (tracker_app.localnet) waits for its
        # "node <id> serving " prefix.
        print(
            f"node {service.node_id} serving {shard.model_key} layers "
            f"{shard.start}-{shard.end} at {options.endpoint} on {shard.device.type} "
            f"{shard.precision} "
            f"(+{shard.rss_added_bytes / 2**20:.0f} MiB, benchmark "
            f"{service.benchmark_tps:.1f} tok/s)"
            + (f"; placed by the tracker: {options.placement}" if options.placement else ""),
            file=out,
            flush=True,
        )
    while not stop.is_set():
        interval = registration.heartbeat_interval if registration else 3600.0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)
        if stop.is_set() or tracker is None or registration is None:
            continue
        try:
            health = public_health(service.health())
            code = await tracker.heartbeat(
                registration,
                active_sessions=len(service.store),
                queue_depth=service.queued,
                tps=service.meter.tps or service.benchmark_tps,
                prefix_cache_load=health["prefix_cache_load"],
                prefix_hits=health["prefix_hits"],
            )
            if code in (401, 404):
                registration = await tracker.register(announcement)
                service.node_id = registration.node_id
        except (httpx.HTTPError, RegistrationError) as error:
            print(f"heartbeat failed: {error}", file=out, flush=True)
    server.should_exit = True
    if tracker is not None and registration is not None:
        try:
            await tracker.deregister(registration)
            print(f"node {registration.node_id} deregistered", file=out, flush=True)
        except (httpx.HTTPError, RegistrationError) as error:
            print(f"deregistration failed: {error}", file=out, flush=True)
    await serving
    return status
