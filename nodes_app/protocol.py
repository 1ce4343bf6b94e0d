"""The tracker↔node protocol: everything that crosses between them, defined once.

Both sides import this module (the tracker builds a :class:`GenerateRequest`
and parses the head's frames; the head parses the request and encodes the
frames), so the two can never disagree on a field, a header name or a limit.
It needs nothing but the standard library: no Django, no torch.

What it holds (docs/adr/0002-node-runtime.md has the prose contract):

- ``POST {head}/v1/generate``: :class:`GenerateRequest` (chat messages or a
  raw prompt; logprobs, top_logprobs, echo) with its plan of
  :class:`PlanHop`, sampling as :class:`SamplingParams` (penalties and
  logit_bias included), the limits (:data:`MAX_STOPS`,
  :data:`MAX_STOP_LENGTH`, :data:`MAX_REQUEST_ID`, :data:`TOP_LOGPROBS_MAX`,
  :data:`LOGIT_BIAS_MAX_ENTRIES`, :data:`ECHO_MAX_SCORES`).
- The head's answer: an SSE stream (:func:`sse_event`, :func:`sse_data`) of
  :class:`ChunkFrame` (OpenAI ``chat.completion.chunk`` plus
  ``meshnet_token_ids``, each token's :class:`TokenLogprob` when asked, an
  echo's prompt logprobs on the first, usage on the last) ending
  ``data: [DONE]``, or an :class:`ErrorFrame` (``hop_failed`` /
  ``hop_busy``) before ``[DONE]``.
- The hop link's path and frame limit (``/v1/link``; the frame and tensor
  codec is torch's, in the node runtime: ``nodes_app.runtime.wire``).
- The tracker's signature on a plan (:class:`SignedPlan`: what it covers,
  its header form for hop sessions, :data:`MAX_PLAN_VALIDITY`), the
  per-session capability (:data:`CAPABILITY`) and where a tracker publishes
  its key (:data:`TRACKER_KEY_PATH`); signing itself is ``nodes_app.signing``.

Anything malformed raises :class:`ProtocolError` with the machine-readable
``code`` a node answers in its 400 and a message that names the field.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from itertools import pairwise
from typing import Any, TypeGuard

# The hop link: one websocket per head→hop pair carrying binary frames of steps
# and answers (the frame codec needs torch: ``nodes_app.runtime.wire``). A node
# refuses a frame over its frame limit (runnode --max-frame-bytes) by closing the link.
LINK_PATH = "/v1/link"
LINK_MAX_FRAME_BYTES = 64 * 2**20
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

# Sampling ranges, checked by the tracker on the client's request and again
# by every node (``SamplingParams.from_mapping``): a value outside them is the
# requester's 400, never a crash on the node that samples.
TEMPERATURE_MAX = 2.0  # OpenAI's range is 0..2
# top_p is compared with float32 cumulative probabilities: below float32's
# smallest positive value it rounds to 0 and the cut-off drops every token.
# 1e-6 sits well above float32's epsilon (1.2e-7), the resolution of a sum of
# probabilities, so every top_p accepted means something distinct from 0, and
# any smaller top_p would keep only the best token anyway.
TOP_P_MIN = 1e-6
# More than any vocabulary (top_k at or above the vocabulary keeps every token).
TOP_K_MAX = 1_000_000
# torch.Generator.manual_seed takes a signed 64-bit integer.
SEED_MAX = 2**63 - 1
# OpenAI's frequency/presence penalties, applied by the last hop.
PENALTY_MIN, PENALTY_MAX = -2.0, 2.0
# OpenAI's logit_bias: at most this many token ids, each biased by -100..100.
LOGIT_BIAS_MAX_ENTRIES = 300
LOGIT_BIAS_MAX = 100.0
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


# What a node may report about itself (registration, heartbeats): far above
# any real node, far below what overflows a database column.
MAX_REPORTED_SESSIONS = 100_000
MAX_REPORTED_QUEUE_DEPTH = 1_000_000
MAX_REPORTED_TPS = 1_000_000.0
MAX_LAYERS = 10_000

# A node's precision (runnode --dtype / --quantize), reported at registration as
# one label: the dtype it computes in, then "+int8" when its weights are int8.
DTYPE_CHOICES = ("float32", "bfloat16", "float16")
QUANTIZE_CHOICES = ("none", "int8", "int4")
PRECISIONS = tuple(
    dtype if quantize == "none" else f"{dtype}+{quantize}"
    for dtype in DTYPE_CHOICES
    for quantize in QUANTIZE_CHOICES
)
DEFAULT_PRECISION = "float32"


def precision_label(dtype: str, quantize: str = "none") -> str:
    """What a node with ``dtype`` activations and ``quantize`` weights reports (PRECISIONS)."""
    label = dtype if quantize == "none" else f"{dtype}+{quantize}"
    if label not in PRECISIONS:
        raise ProtocolError(f"unknown precision {label!r}", code="bad_precision")
    return label


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
# What a head streams after a step that gave the client no text (a token held
# back by the detokenizer or a stop sequence): an SSE comment, so the head's
# stream is never silent for longer than one step.
SSE_STEP_COMMENT = b": step\n\n"


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


# Error frame codes. A full hop is not a broken one: the tracker waits on
# ``hop_busy`` and bans the named node on ``hop_failed``.
HOP_FAILED = "hop_failed"
HOP_BUSY = "hop_busy"
# A hop that did not answer a step within its step timeout (a kind of hop_failed).
HOP_TIMED_OUT = "hop_timeout"

SSE_DONE = "[DONE]"

# Matched whole (``fullmatch``: ``$`` would let a trailing newline through).
_HEX_SIGNATURE = re.compile(r"[0-9a-f]{128}")
_CAPABILITY = re.compile(r"[0-9a-f]{64}")
_NONCE = re.compile(r"[0-9a-f]{0,64}")
_ERROR_CODE = re.compile(r"[a-z_]{1,40}")


def relayable_code(value: Any) -> str | None:
    """``value`` if it has the form of an error code (``^[a-z_]{1,40}$``), else None.

    What a node or tracker may repeat of another node's error: never its
    message (an untrusted node could put anything there), only its code.
    """
    return value if isinstance(value, str) and _ERROR_CODE.fullmatch(value) else None


class ProtocolError(ValueError):
    """Input that breaks the protocol; ``code`` is what a node's 400 would carry."""

    def __init__(self, message: str, *, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: Any) -> TypeGuard[int]:
    """A non-negative integer (a token id, a token count)."""
    return _is_int(value) and value >= 0


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` 0 (or ``top_k`` 1) is greedy; ``seed`` None draws a fresh seed.

    Travels as top-level fields of the generate request and as the
    ``sampling`` field of a last-hop step on the link. Construction does not validate (the
    tracker builds it from its own checked fields); :meth:`from_mapping` does.

    ``presence_penalty``, ``frequency_penalty`` and ``logit_bias`` change the
    logits before the token is chosen, as OpenAI defines them: a token's logit
    loses ``frequency_penalty`` × the times it occurs in the completion so far
    (resumed tokens included) and ``presence_penalty`` once if it occurs at
    all, and gains its ``logit_bias``. ``logit_bias`` is ``(token id, bias)``
    pairs in increasing id order (:func:`logit_bias_pairs` builds it from
    OpenAI's JSON object); whether the ids are in the vocabulary only a node
    can tell.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether the completion's own tokens change the logits (a non-zero penalty)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def to_json(self) -> dict[str, Any]:
        """The JSON fields; penalties and logit_bias only when set (old peers never see them)."""
        data: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
        }
        if self.presence_penalty:
            data["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty:
            data["frequency_penalty"] = self.frequency_penalty
        if self.logit_bias:
            data["logit_bias"] = {str(token): bias for token, bias in self.logit_bias}
        return data

    @classmethod
    def from_mapping(cls, data: Any) -> SamplingParams:
        """Checked params from JSON fields (absent ones take the defaults).

        Raises :class:`ProtocolError` ``bad_sampling`` naming the field unless
        temperature is a finite number in 0..:data:`TEMPERATURE_MAX`, top_p a
        finite number in :data:`TOP_P_MIN`..1, top_k an integer in
        0..:data:`TOP_K_MAX`, seed null or an integer in 0..:data:`SEED_MAX`,
        each penalty a finite number in :data:`PENALTY_MIN`..:data:`PENALTY_MAX`
        and logit_bias as :func:`logit_bias_pairs` requires.
        """
        if not isinstance(data, Mapping):
            raise ProtocolError("sampling parameters must be an object", code="bad_sampling")
        seed = data.get("seed")
        return cls(
            temperature=_sampling_number(data, "temperature", 0.0, 0.0, TEMPERATURE_MAX),
            top_p=_sampling_number(data, "top_p", 1.0, TOP_P_MIN, 1.0),
            top_k=_sampling_integer(data.get("top_k", 0), "top_k", TOP_K_MAX),
            seed=None if seed is None else _sampling_integer(seed, "seed", SEED_MAX),
            presence_penalty=_sampling_number(
                data, "presence_penalty", 0.0, PENALTY_MIN, PENALTY_MAX
            ),
            frequency_penalty=_sampling_number(
                data, "frequency_penalty", 0.0, PENALTY_MIN, PENALTY_MAX
            ),
            logit_bias=logit_bias_pairs(data.get("logit_bias")),
        )


# One spelling per id (no sign, no leading zero, nothing after it: ``fullmatch``, since
# ``$`` would also match before a trailing newline), so no two keys name the same id.
_TOKEN_KEY = re.compile(r"0|[1-9][0-9]{0,9}")


def logit_bias_pairs(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias`` object (token id as a decimal string → bias) as sorted pairs.

    None is no bias. Raises :class:`ProtocolError` ``bad_sampling`` unless it
    is an object of at most :data:`LOGIT_BIAS_MAX_ENTRIES` entries, each key a
    token id written in decimal (its one spelling: ``"5"``, never ``"05"`` or
    ``"5\\n"``, so two keys never bias one id twice) and each value a finite number in
    -:data:`LOGIT_BIAS_MAX`..:data:`LOGIT_BIAS_MAX`.
    """
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ProtocolError(
            "logit_bias must be an object of token ids to numbers", code="bad_sampling"
        )
    if len(value) > LOGIT_BIAS_MAX_ENTRIES:
        raise ProtocolError(
            f"logit_bias takes at most {LOGIT_BIAS_MAX_ENTRIES} token ids", code="bad_sampling"
        )
    pairs: list[tuple[int, float]] = []
    for key, bias in value.items():
        if not isinstance(key, str) or not _TOKEN_KEY.fullmatch(key):
            raise ProtocolError(
                f"logit_bias key {str(key)[:20]!r} is not a token id", code="bad_sampling"
            )
        if not isinstance(bias, int | float) or isinstance(bias, bool) or not math.isfinite(bias):
            raise ProtocolError(f"logit_bias[{key}] must be a number", code="bad_sampling")
        if not -LOGIT_BIAS_MAX <= bias <= LOGIT_BIAS_MAX:
            raise ProtocolError(
                f"logit_bias[{key}] must lie in {-LOGIT_BIAS_MAX:g}..{LOGIT_BIAS_MAX:g}",
                code="bad_sampling",
            )
        pairs.append((int(key), float(bias)))
    return tuple(sorted(pairs))


def _sampling_number(
    data: Mapping[str, Any], name: str, default: float, low: float, high: float
) -> float:
    value = data.get(name, default)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ProtocolError(f"{name} must be a number", code="bad_sampling")
    if not math.isfinite(value) or not low <= value <= high:
        raise ProtocolError(f"{name} must lie in {low:g}..{high:g}", code="bad_sampling")
    return float(value)


def _sampling_integer(value: Any, name: str, high: int) -> int:
    if not _is_int(value):
        raise ProtocolError(f"{name} must be an integer", code="bad_sampling")
    if not 0 <= value <= high:
        raise ProtocolError(f"{name} must lie in 0..{high}", code="bad_sampling")
    return value


def stop_sequences(value: Any) -> list[str]:
    """``stop`` as a list: None → [], a string → [it]; the one rule both sides apply.

    Raises :class:`ProtocolError` unless it is at most :data:`MAX_STOPS`
    non-empty strings of at most :data:`MAX_STOP_LENGTH` characters.
    """
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ProtocolError("stop must be a non-empty string or a list of them")
    if len(stops) > MAX_STOPS:
        raise ProtocolError(f"stop takes at most {MAX_STOPS} sequences")
    if any(len(stop) > MAX_STOP_LENGTH for stop in stops):
        raise ProtocolError(f"each stop sequence is at most {MAX_STOP_LENGTH} characters")
    return list(stops)


@dataclass(frozen=True)
class PlanHop:
    """One hop of the signed plan: a node and the layers it runs for this request."""

    node_id: str
    endpoint: str
    start_layer: int
    end_layer: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, raw: Any, index: int) -> PlanHop:
        if not isinstance(raw, dict):
            raise ProtocolError(f"plan.hops[{index}] must be an object", code="invalid_plan")
        try:
            node_id, endpoint = raw["node_id"], raw["endpoint"]
            start, end = raw["start_layer"], raw["end_layer"]
        except KeyError as missing:
            raise ProtocolError(
                f"plan.hops[{index}] lacks {missing}", code="invalid_plan"
            ) from None
        if not isinstance(node_id, str) or not node_id or not isinstance(endpoint, str):
            raise ProtocolError(
                f"plan.hops[{index}] needs a string node_id and endpoint", code="invalid_plan"
            )
        if not (_is_int(start) and _is_int(end)):
            raise ProtocolError(f"plan.hops[{index}] layers must be integers", code="invalid_plan")
        return cls(node_id=node_id, endpoint=endpoint.rstrip("/"), start_layer=start, end_layer=end)


def _plan_hops(raw_hops: Any) -> tuple[PlanHop, ...]:
    """The hops of a plan: at least one, from layer 0, covering the layers contiguously."""
    if not isinstance(raw_hops, list) or not raw_hops:
        raise ProtocolError(
            "plan must be an object with a non-empty hops list", code="invalid_plan"
        )
    hops = tuple(PlanHop.parse(raw, i) for i, raw in enumerate(raw_hops))
    if hops[0].start_layer != 0:
        raise ProtocolError("hop 0 must start at layer 0", code="invalid_plan")
    for previous, hop in pairwise(hops):
        if hop.start_layer != previous.end_layer + 1 or hop.end_layer < hop.start_layer:
            raise ProtocolError(
                f"hop {hop.node_id} must start at layer {previous.end_layer + 1}: "
                "hops must cover the layers contiguously",
                code="invalid_plan",
            )
    return hops


def _plan_seal(plan: Mapping[str, Any]) -> tuple[int, str, str]:
    """A plan's ``expires_at``, ``nonce`` and ``signature``: (0, "", "") when it is unsigned."""
    expires_at, nonce = plan.get("expires_at", 0), plan.get("nonce", "")
    signature = plan.get("signature", "")
    if not is_count(expires_at):
        raise ProtocolError("plan.expires_at must be unix seconds", code="invalid_plan")
    if not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
        raise ProtocolError("plan.nonce must be at most 64 hex digits", code="invalid_plan")
    if not isinstance(signature, str) or (signature and not _HEX_SIGNATURE.fullmatch(signature)):
        raise ProtocolError("plan.signature must be 128 hex digits", code="invalid_plan")
    return expires_at, nonce, signature


@dataclass(frozen=True)
class SignedPlan:
    """A route as the tracker signed it: which nodes run which layers of one request.

    The signature (``nodes_app.signing.sign_plan``) covers :meth:`signed_fields`:
    request id, model, every hop's node id, endpoint and layers, and
    ``expires_at`` (unix seconds; after it the plan opens no session) and a
    ``nonce``, so that two sends of one request (a retry, a failover on the
    same route) are two plans, each opening its own sessions. An unsigned
    plan has ``signature`` "" (only ``--dev-open`` nodes take one).
    """

    request_id: str
    model: str
    hops: tuple[PlanHop, ...]
    expires_at: int = 0
    nonce: str = ""
    signature: str = ""

    def signed_fields(self) -> dict[str, Any]:
        """Exactly what the signature covers."""
        return {
            "request_id": self.request_id,
            "model": self.model,
            "hops": [hop.to_json() for hop in self.hops],
            "expires_at": self.expires_at,
            "nonce": self.nonce,
        }

    def to_header(self) -> str:
        """The plan as the value of :data:`PLAN`: base64url of its compact JSON."""
        data = {**self.signed_fields(), "signature": self.signature}
        raw = json.dumps(data, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def from_header(cls, value: str) -> SignedPlan:
        """Parse a :data:`PLAN` header; :class:`ProtocolError` ``invalid_plan`` if malformed."""
        if len(value) > MAX_PLAN_HEADER:
            raise ProtocolError(f"{PLAN} is too long", code="invalid_plan")
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            data = json.loads(raw)
        except (ValueError, binascii.Error):
            raise ProtocolError(f"{PLAN} is not base64url JSON", code="invalid_plan") from None
        if not isinstance(data, dict):
            raise ProtocolError(f"{PLAN} must hold an object", code="invalid_plan")
        request_id, model = data.get("request_id"), data.get("model")
        if not isinstance(request_id, str) or not request_id or len(request_id) > MAX_REQUEST_ID:
            raise ProtocolError("plan.request_id must name the request", code="invalid_plan")
        if not isinstance(model, str) or not model:
            raise ProtocolError("plan.model must name the model", code="invalid_plan")
        expires_at, nonce, signature = _plan_seal(data)
        hops = _plan_hops(data.get("hops"))
        return cls(request_id, model, hops, expires_at, nonce, signature)


def capability_valid(value: str) -> bool:
    """Whether ``value`` has the form of a session capability (64 hex digits)."""
    return bool(_CAPABILITY.fullmatch(value))


@dataclass(frozen=True)
class GenerateRequest:
    """The body of ``POST {head}/v1/generate``.

    The prompt is either chat ``messages`` (the model's chat template applied)
    or a raw text ``prompt`` (the legacy completions endpoint: tokenised as the
    tokenizer does by default, no template); exactly one is given.
    ``max_tokens`` is the budget of the whole completion, resumed tokens
    included: the head prefills the prompt plus ``resume_token_ids`` and
    streams only new tokens. ``hops[0]`` is the head itself. ``expires_at``,
    ``nonce`` and ``signature`` are the tracker's seal on the plan (see :attr:`plan`).

    ``logprobs``: every frame with token ids also carries each token's
    logprob and its ``top_logprobs`` best alternatives. ``echo``: the first
    frame also carries the prompt's own token logprobs (each given the
    tokens before it); ``max_tokens`` may then be 0 (the prompt is run, no
    token is generated). Logprobs are the model's log-softmax of the last
    hop's float32 logits before temperature, penalties and logit_bias.
    """

    request_id: str
    model: str
    hops: tuple[PlanHop, ...]
    messages: list[dict[str, str]]
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    resume_token_ids: list[int] = field(default_factory=list)
    expires_at: int = 0
    nonce: str = ""
    signature: str = ""
    prompt: str | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    echo: bool = False

    @property
    def plan(self) -> SignedPlan:
        """The request's plan with the tracker's seal (unsigned: ``signature`` "")."""
        return SignedPlan(
            self.request_id, self.model, self.hops, self.expires_at, self.nonce, self.signature
        )

    @property
    def prompt_characters(self) -> int:
        """Characters the head tokenises: the raw prompt's, or every message's content."""
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(message["content"]) for message in self.messages)

    def to_json(self) -> dict[str, Any]:
        """The JSON object the tracker sends (sampling fields at the top level).

        Fields at their defaults (``prompt``, ``logprobs``, ``top_logprobs``,
        ``echo``, penalties, logit_bias) are left out, so a request that uses
        none of them is the body older heads know.
        """
        plan: dict[str, Any] = {"model": self.model, "hops": [hop.to_json() for hop in self.hops]}
        if self.signature:
            plan.update(expires_at=self.expires_at, nonce=self.nonce, signature=self.signature)
        prompt: dict[str, Any] = (
            {"messages": self.messages} if self.prompt is None else {"prompt": self.prompt}
        )
        scoring: dict[str, Any] = {}
        if self.logprobs:
            scoring.update(logprobs=True, top_logprobs=self.top_logprobs)
        if self.echo:
            scoring["echo"] = True
        return {
            "request_id": self.request_id,
            **prompt,
            "max_tokens": self.max_tokens,
            **self.sampling.to_json(),
            **scoring,
            "stop": self.stop,
            "resume_token_ids": self.resume_token_ids,
            "plan": plan,
        }

    @classmethod
    def parse(cls, body: Any) -> GenerateRequest:
        """Validate a decoded JSON body; :class:`ProtocolError` names the first bad field.

        Checks everything that holds for any node: types, limits, and a plan
        whose hops start at layer 0 and cover the layers contiguously. Whether
        this node is hop 0, serves the model, and which layer is the last is
        for the node to check against its own shard.
        """
        if not isinstance(body, dict):
            raise ProtocolError("body must be a JSON object")
        request_id = body.get("request_id")
        if not isinstance(request_id, str) or not request_id or len(request_id) > MAX_REQUEST_ID:
            raise ProtocolError(
                f"request_id must be a non-empty string of at most {MAX_REQUEST_ID} characters"
            )
        messages, prompt = _prompt_of(body)
        logprobs, top_logprobs, echo = _scoring_of(body)
        max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        least = 0 if echo else 1
        if not _is_int(max_tokens) or max_tokens < least:
            raise ProtocolError(
                f"max_tokens must be an integer of at least {least}"
                + ("" if echo else " (0 only with echo)")
            )
        sampling = SamplingParams.from_mapping(
            {key: body[key] for key in _SAMPLING_FIELDS if key in body}
        )
        stop = stop_sequences(body.get("stop"))
        resume = body.get("resume_token_ids") or []
        if not isinstance(resume, list) or not all(is_count(t) for t in resume):
            raise ProtocolError("resume_token_ids must be a list of token ids")
        plan = body.get("plan")
        if not isinstance(plan, dict):
            raise ProtocolError(
                "plan must be an object with a non-empty hops list", code="invalid_plan"
            )
        hops = _plan_hops(plan.get("hops"))
        model = plan.get("model")
        if not isinstance(model, str) or not model:
            raise ProtocolError("plan.model must name the model", code="invalid_plan")
        expires_at, nonce, signature = _plan_seal(plan)
        return cls(
            request_id=request_id,
            model=model,
            hops=hops,
            messages=messages,
            max_tokens=max_tokens,
            sampling=sampling,
            stop=stop,
            resume_token_ids=list(resume),
            expires_at=expires_at,
            nonce=nonce,
            signature=signature,
            prompt=prompt,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            echo=echo,
        )


# The sampling fields that are single values (a tracker checks them as a node does;
# logit_bias, the rest, needs the node's vocabulary too).
SAMPLING_VALUES = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "presence_penalty",
    "frequency_penalty",
)
_SAMPLING_FIELDS = (*SAMPLING_VALUES, "logit_bias")


def _prompt_of(body: dict[str, Any]) -> tuple[list[dict[str, str]], str | None]:
    """A request's chat messages or raw prompt (exactly one of them): ``(messages, prompt)``."""
    messages, prompt = body.get("messages"), body.get("prompt")
    if (messages is None) == (prompt is None):
        raise ProtocolError("give exactly one of messages and prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise ProtocolError("prompt must be a string")
        return [], prompt
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("messages must be a non-empty list")
    for message in messages:
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise ProtocolError("each message needs a string role and a string content")
    return [{"role": m["role"], "content": m["content"]} for m in messages], None


def _or_default(value: Any, default: Any) -> Any:
    return default if value is None else value


def _scoring_of(body: dict[str, Any]) -> tuple[bool, int, bool]:
    """``(logprobs, top_logprobs, echo)``: what a request asks to be reported besides its text."""
    # null is the default too (clients and trackers send it for "not set").
    logprobs, top, echo = (
        _or_default(body.get("logprobs"), False),
        _or_default(body.get("top_logprobs"), 0),
        _or_default(body.get("echo"), False),
    )
    if not isinstance(logprobs, bool) or not isinstance(echo, bool):
        raise ProtocolError("logprobs and echo must be booleans")
    if not _is_int(top) or not 0 <= top <= TOP_LOGPROBS_MAX:
        raise ProtocolError(f"top_logprobs must be an integer in 0..{TOP_LOGPROBS_MAX}")
    if top and not logprobs:
        raise ProtocolError("top_logprobs needs logprobs")
    return logprobs, top, echo


@dataclass(frozen=True)
class Usage:
    """Token counts of a completion; the JSON form adds ``total_tokens``."""

    prompt_tokens: int
    completion_tokens: int

    def to_json(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    @classmethod
    def parse(cls, raw: Any) -> Usage:
        if not isinstance(raw, dict):
            raise ProtocolError("usage must be an object")
        prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
        if not (is_count(prompt) and is_count(completion)):
            raise ProtocolError("usage needs non-negative integer prompt and completion tokens")
        return cls(prompt_tokens=prompt, completion_tokens=completion)


def completion_chunk(
    *,
    completion_id: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """OpenAI's ``chat.completion.chunk``: the head's frames and the tracker's client
    chunks share this one shape; ``logprobs`` (entries, see :class:`TokenLogprob`)
    becomes the choice's ``logprobs.content``; ``extra`` adds top-level fields
    (usage, meshnet…)."""
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs}
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
        **extra,
    }


@dataclass(frozen=True)
class TopLogprob:
    """One alternative at a position: its token, its logprob and its UTF-8 bytes."""

    token: str
    logprob: float
    utf8: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return _entry_json(self.token, self.logprob, self.utf8)

    @classmethod
    def parse(cls, raw: Any) -> TopLogprob:
        token, utf8 = _token_of(raw)
        logprob = raw.get("logprob")
        if not logprob_valid(logprob):
            raise ProtocolError("a logprob must be a finite number of at most 0")
        return cls(token, float(logprob), utf8)


@dataclass(frozen=True)
class TokenLogprob:
    """One token's entry in OpenAI's logprobs shape: token, logprob, bytes, top_logprobs.

    How a head writes a token (``nodes_app.runtime.text.TokenPieces``):
    ``bytes`` are the token's own UTF-8 bytes — a byte-level BPE piece may hold
    only part of a character — and ``token`` is those bytes decoded with
    ``errors="replace"`` (a partial character shows as U+FFFD). A special
    token (end of turn, role markers: what the text leaves out) has no bytes
    and its written form as ``token`` (``"<|im_end|>"``). So the concatenated
    ``bytes`` of a completion's entries are the UTF-8 of its text, up to
    where a stop string cut it (decoded with ``errors="replace"`` if the
    model produced bytes that are not UTF-8, as the text is; for byte-level
    tokenizers, as the shipped models use: a SentencePiece tokenizer writes a
    word's leading space as a space, which its decoder drops at the start).
    ``logprob`` is None only for a prompt's first token (nothing precedes
    it), whose ``top_logprobs`` is then empty; ``top_logprobs`` holds the
    best alternatives at the position, best first (the chosen token may be
    among them).
    """

    token: str
    logprob: float | None
    utf8: tuple[int, ...]
    top_logprobs: tuple[TopLogprob, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            **_entry_json(self.token, self.logprob, self.utf8),
            "top_logprobs": [top.to_json() for top in self.top_logprobs],
        }

    @classmethod
    def parse(cls, raw: Any, *, first_of_prompt: bool = False) -> TokenLogprob:
        """An entry from JSON; only a prompt's first entry has (and must have) a null logprob."""
        token, utf8 = _token_of(raw)
        logprob, tops = raw.get("logprob"), raw.get("top_logprobs")
        if not isinstance(tops, list) or len(tops) > TOP_LOGPROBS_MAX:
            raise ProtocolError(
                f"top_logprobs must be a list of at most {TOP_LOGPROBS_MAX} alternatives"
            )
        if first_of_prompt:
            if logprob is not None or tops:
                raise ProtocolError("a prompt's first token has a null logprob and no alternatives")
            return cls(token, None, utf8)
        if not logprob_valid(logprob):
            raise ProtocolError("a logprob must be a finite number of at most 0")
        return cls(token, float(logprob), utf8, tuple(TopLogprob.parse(top) for top in tops))


def _entry_json(token: str, logprob: float | None, utf8: tuple[int, ...]) -> dict[str, Any]:
    """The fields a token's entry and an alternative share."""
    return {"token": token, "logprob": logprob, "bytes": list(utf8)}


def _token_of(raw: Any) -> tuple[str, tuple[int, ...]]:
    if not isinstance(raw, dict):
        raise ProtocolError("a logprob entry must be an object")
    token, utf8 = raw.get("token"), raw.get("bytes")
    if not isinstance(token, str):
        raise ProtocolError("a logprob entry's token must be a string")
    if not isinstance(utf8, list) or not all(_is_int(b) and 0 <= b <= 255 for b in utf8):
        raise ProtocolError("a logprob entry's bytes must be a list of byte values")
    return token, tuple(utf8)


def logprob_valid(value: Any) -> bool:
    """Whether ``value`` can be a logprob: a finite number of at most 0 (not a bool)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value <= 0
    )


@dataclass(frozen=True)
class ChunkFrame:
    """One chunk of the head's stream.

    ``token_ids`` are the ids whose text this chunk completes (text is held
    back while it could still be an incomplete character or the start of a
    stop string). The first frame has ``role``; the last has
    ``finish_reason`` (``stop`` or ``length``) and ``usage``, whose
    ``completion_tokens`` counts resumed and new tokens.

    With the request's ``logprobs``, ``logprobs`` holds one entry per token
    id, in order (JSON: ``choices[0].logprobs.content``). With ``echo``, the
    first frame holds ``prompt_token_ids`` and ``prompt_logprobs``, one entry
    per prompt token (JSON: top-level ``meshnet_prompt_token_ids`` and
    ``meshnet_prompt_logprobs``).
    """

    content: str = ""
    token_ids: tuple[int, ...] = ()
    role: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None

    def to_json(self, *, completion_id: str, created: int, model: str) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if self.role is not None:
            delta["role"] = self.role
        if self.content or self.role is not None:
            delta["content"] = self.content
        extra: dict[str, Any] = {}
        if self.token_ids:
            extra["meshnet_token_ids"] = list(self.token_ids)
        if self.prompt_token_ids is not None and self.prompt_logprobs is not None:
            extra["meshnet_prompt_token_ids"] = list(self.prompt_token_ids)
            extra["meshnet_prompt_logprobs"] = [entry.to_json() for entry in self.prompt_logprobs]
        if self.usage is not None:
            extra["usage"] = self.usage.to_json()
        return completion_chunk(
            completion_id=completion_id,
            created=created,
            model=model,
            delta=delta,
            finish_reason=self.finish_reason,
            logprobs=[entry.to_json() for entry in self.logprobs] if self.logprobs else None,
            **extra,
        )

    def event(self, *, completion_id: str, created: int, model: str) -> bytes:
        """This frame as a head streams it: one SSE event of :meth:`to_json`.

        An echo's prompt entries (up to :data:`ECHO_MAX_SCORES` values) are
        written to JSON one by one: a worker thread writing a large echo then
        lets the event loop run between entries, where one ``json.dumps`` of
        the whole frame would hold the GIL throughout.
        """
        if not self.prompt_logprobs:
            return sse_event(
                self.to_json(completion_id=completion_id, created=created, model=model)
            )
        payload = replace(self, prompt_logprobs=()).to_json(
            completion_id=completion_id, created=created, model=model
        )
        del payload["meshnet_prompt_logprobs"]
        head = json.dumps(payload, separators=(",", ":"))
        entries = ",".join(
            json.dumps(entry.to_json(), separators=(",", ":")) for entry in self.prompt_logprobs
        )
        return sse_event(f'{head[:-1]},"meshnet_prompt_logprobs":[{entries}]}}')


@dataclass(frozen=True)
class ErrorFrame:
    """The head's last frame when a downstream hop failed (or was full: :data:`HOP_BUSY`).

    ``node_id`` names the hop to blame; a tracker trusts it only for a node
    of the route it sent.
    """

    message: str
    code: str = HOP_FAILED
    node_id: str | None = None
    type: str = "upstream_error"

    @property
    def busy(self) -> bool:
        return self.code == HOP_BUSY

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"message": self.message, "type": self.type, "code": self.code}
        if self.node_id is not None:
            error["node_id"] = self.node_id
        return {"error": error}


def parse_frame(payload: Any) -> ChunkFrame | ErrorFrame:
    """A head frame from its decoded JSON; :class:`ProtocolError` if it is malformed.

    A chunk's logprobs, when present, must hold exactly one entry per token
    id; prompt logprobs come with the prompt's token ids, one entry each.
    """
    if not isinstance(payload, dict):
        raise ProtocolError("a frame must be a JSON object")
    if "error" in payload:
        error = payload["error"]
        if not isinstance(error, dict):
            raise ProtocolError("an error frame's error must be an object")
        node_id = error.get("node_id")
        return ErrorFrame(
            message=str(error.get("message") or "hop failed"),
            code=str(error.get("code") or HOP_FAILED),
            node_id=None if node_id is None else str(node_id),
            type=str(error.get("type") or "upstream_error"),
        )
    choices = payload.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ProtocolError("a chunk has exactly one choice")
    choice = choices[0]
    delta = choice.get("delta") or {}
    if not isinstance(delta, dict):
        raise ProtocolError("a chunk's delta must be an object")
    content, role, finish = (
        delta.get("content") or "",
        delta.get("role"),
        choice.get("finish_reason"),
    )
    if not isinstance(content, str) or not isinstance(role, str | None):
        raise ProtocolError("a chunk's delta has a string content and role")
    if not isinstance(finish, str | None):
        raise ProtocolError("finish_reason must be a string")
    token_ids = _token_ids(payload.get("meshnet_token_ids", []), "meshnet_token_ids")
    usage = payload.get("usage")
    prompt_ids, prompt_logprobs = _prompt_logprobs(payload)
    return ChunkFrame(
        content=content,
        token_ids=token_ids,
        role=role,
        finish_reason=finish or None,
        usage=None if usage is None else Usage.parse(usage),
        logprobs=_content_logprobs(choice.get("logprobs"), len(token_ids)),
        prompt_token_ids=prompt_ids,
        prompt_logprobs=prompt_logprobs,
    )


def _token_ids(raw: Any, name: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(is_count(t) for t in raw):
        raise ProtocolError(f"{name} must be a list of token ids")
    return tuple(raw)


def _content_logprobs(raw: Any, tokens: int) -> tuple[TokenLogprob, ...]:
    """A chunk's ``logprobs`` (None or ``{"content": [entry per token id]}``)."""
    if raw is None:
        return ()
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list) or len(content) != tokens:
        raise ProtocolError("a chunk's logprobs.content must hold one entry per token id")
    return tuple(TokenLogprob.parse(entry) for entry in content)


def _prompt_logprobs(
    payload: dict[str, Any],
) -> tuple[tuple[int, ...] | None, tuple[TokenLogprob, ...] | None]:
    """An echo's prompt token ids and their entries (the first with a null logprob), or Nones."""
    raw_ids, raw_entries = (
        payload.get("meshnet_prompt_token_ids"),
        payload.get("meshnet_prompt_logprobs"),
    )
    if raw_ids is None and raw_entries is None:
        return None, None
    ids = _token_ids(raw_ids, "meshnet_prompt_token_ids")
    if not isinstance(raw_entries, list) or len(raw_entries) != len(ids):
        raise ProtocolError("meshnet_prompt_logprobs must hold one entry per prompt token")
    entries = tuple(
        TokenLogprob.parse(entry, first_of_prompt=index == 0)
        for index, entry in enumerate(raw_entries)
    )
    return ids, entries


def sse_event(payload: Mapping[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <compact JSON>`` (or a bare string: :data:`SSE_DONE`)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


def sse_data(line: str) -> Any:
    """The payload of one SSE line: its decoded JSON, :data:`SSE_DONE` as the string, or None.

    None for blank lines, comments and other fields. Raises
    :class:`ProtocolError` when a ``data:`` line is not JSON.
    """
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data:
        return None
    if data == SSE_DONE:
        return SSE_DONE
    try:
        return json.loads(data)
    except ValueError as error:
        raise ProtocolError(f"an event's data is not JSON: {error}") from None


def sse_frames(lines: Iterable[str]) -> list[Any]:
    """Every payload of a whole SSE body's lines, :data:`SSE_DONE` kept (tests, benchmarks)."""
    return [payload for line in lines if (payload := sse_data(line)) is not None]
