"""The protocol's limits, header names and paths: what both sides enforce and call things.

The hop link's path and frame limit, the credential names a session's opening
step carries, where a tracker publishes its key, the bounds of a generate
request (stop sequences, request id, echo), and the step deadlines.
"""

from __future__ import annotations

import math

# The hop link: one websocket per head→hop pair carrying binary frames of steps
# and answers (the frame codec needs torch: ``nodes_app.runtime.wire``). A node
# refuses a frame over its frame limit (runnode --max-frame-bytes) by closing the link.
LINK_PATH = "/v1/link"
LINK_MAX_FRAME_BYTES = 64 * 2**20
# Until a link has shown a valid plan or capability, a node reads frames of at
# most LINK_FIRST_FRAME_BYTES (a larger one is refused as it arrives, unread: a
# head opens each link with a small hello frame). After that a frame's JSON
# header, parsed whole on the node's event loop (~50 ms a MiB on a loaded core),
# is bounded before it is parsed to LINK_MAX_HEADER_BYTES plus an eighth of the
# frame's bytes. An honest header is a few hundred bytes a step, a plan (at
# most MAX_PLAN_HEADER) on an opening step and id lists no longer than the
# step's positions (8 bytes an id against >= 128 bytes of hidden state a
# position); the head splits what it sends so that its headers fit.
LINK_FIRST_FRAME_BYTES = 256 * 1024
LINK_MAX_HEADER_BYTES = 2**20


def link_header_limit(frame_bytes: int, *, trusted: bool) -> int:
    """The largest header a node parses in a frame of ``frame_bytes`` bytes."""
    if not trusted:
        return LINK_FIRST_FRAME_BYTES
    return LINK_MAX_HEADER_BYTES + frame_bytes // 8


# A hop closes a link that carried no valid step for its idle timeout with this
# code (private use, RFC 6455 4000-4999): nothing sent after it was read, so the
# head resends what it had in flight on a new link.
LINK_CLOSE_IDLE = 4000
# What a session's opening step carries besides its fields: the tracker-signed
# plan (base64url JSON, see SignedPlan.to_header) and the session's capability, a
# secret the head chooses per hop session, carried by every step and cancel.
# These names label the credentials wherever they travel (``trust`` reads them).
PLAN = "X-Meshnet-Plan"
CAPABILITY = "X-Meshnet-Capability"
# Named in the refusal of a last-hop step that lacks its sampling parameters.
SAMPLING = "sampling"

# Where a tracker publishes the ed25519 key it signs plans with (anonymous GET:
# {"algorithm": "ed25519", "public_key": "<hex>"}); nodes pin it at registration.
TRACKER_KEY_PATH = "/.well-known/meshnet-tracker-key"
TRACKER_KEY_ALGORITHM = "ed25519"

# Limits both sides enforce. OpenAI allows 4 stop sequences; the tracker
# refuses more before anything reaches a node, and the node refuses them too.
MAX_STOPS = 4
MAX_STOP_LENGTH = 256
MAX_REQUEST_ID = 100
# The head names a hop session ``<request_id>.<12 hex>``, so this leaves room.
MAX_SESSION_ID = 128
DEFAULT_MAX_TOKENS = 256
# A signed plan may open sessions until its ``expires_at``; a node refuses one
# that claims to stay valid longer than this (it remembers used plans until
# they expire, so this bounds that memory), and a header larger than this.
MAX_PLAN_VALIDITY = 600
MAX_PLAN_HEADER = 8192

# OpenAI's top_logprobs range (chat completions; the legacy ``logprobs`` int maps onto it).
TOP_LOGPROBS_MAX = 20
# An echo reports a logprob and its alternatives for every prompt token: a head
# refuses (400 ``prompt_too_long``) a prompt whose echo_scores exceed this. The
# head's first SSE frame costs Python time per value (~0.2 s of CPU per 2^14,
# written on a worker thread: the event loop waits at most ~16 ms at a time;
# ADR-0002). At this bound an evaluation harness's usual echo (logprobs 1)
# still scores 8192 prompt tokens.
ECHO_MAX_SCORES = 2**14


def echo_scores(prompt_tokens: int, top_logprobs: int) -> int:
    """Logprobs an echo of ``prompt_tokens`` reports: one per token and its alternatives."""
    return prompt_tokens * (1 + top_logprobs)


# A head's defaults for what it reads of a generate request before tokenising
# (runnode --max-request-bytes / --max-prompt-chars). The tracker's own body
# limit (MESHNET_MAX_REQUEST_BYTES, 1 MiB by default) stays below them, so a
# request the tracker accepted is never refused by an honest head for its size.
GENERATE_MAX_BYTES = 8 * 2**20
GENERATE_MAX_PROMPT_CHARS = 2_000_000

# Step deadlines (ADR-0004, "Deadlines"). A node has one step timeout (runnode
# --step-timeout, MESHNET_HOP_STEP_TIMEOUT: STEP_TIMEOUT_SECONDS by default) to
# answer a step of up to STEP_TIMEOUT_POSITIONS positions: every decode step, and
# the prefill of a short prompt. A longer prefill gets one step timeout more per
# block of as many positions, so a long prompt on a slow CPU node is not taken
# for a hung one, while a hung decode step is found within one step timeout.
STEP_TIMEOUT_SECONDS = 30.0
STEP_TIMEOUT_RANGE = (1.0, 600.0)  # as MESHNET_HOP_STEP_TIMEOUT allows
STEP_TIMEOUT_POSITIONS = 512


# An echo's step costs the last hop its final norm, LM head, log-softmax and
# top-k at every prompt position, not at the last one only: SmolLM2's layers
# 15-29 took 1.3-2.4 times as long for a 512- or 2048-position prefill with an
# echo as without (one torch thread, a loaded 2-CPU machine). That hop gets this
# many times the limit for it.
ECHO_STEP_TIME_FACTOR = 3


def step_time_limit(step_timeout: float, positions: int, *, echo: bool = False) -> float:
    """Seconds one node may take to answer a step of ``positions`` positions.

    ``echo``: the step is an echo's prefill on the hop ending at the last
    layer (:data:`ECHO_STEP_TIME_FACTOR` times as long).
    """
    blocks = max(1, math.ceil(positions / STEP_TIMEOUT_POSITIONS))
    return step_timeout * blocks * (ECHO_STEP_TIME_FACTOR if echo else 1)


# Prefix reuse (docs/adr/0027-prefix-reuse.md): a prompt is hashed in blocks of
# PREFIX_BLOCK_TOKENS token ids, a chain of one hash (PREFIX_HASH_HEX hex digits)
# per full block; a head claims at most PREFIX_MAX_BLOCKS blocks from each hop
# (a quarter of a million positions: past any context served) and a hop refuses
# a longer or malformed list (400 ``bad_field``). The scope that seeds a chain is
# at most PREFIX_MAX_SCOPE characters.
PREFIX_BLOCK_TOKENS = 32
PREFIX_HASH_HEX = 32
PREFIX_MAX_BLOCKS = 8192
PREFIX_MAX_SCOPE = 200
