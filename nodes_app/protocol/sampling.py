"""How the last hop chooses a token: :class:`SamplingParams`, their ranges and ``logit_bias``.

The ranges are checked by the tracker on the client's request and again by
every node; both sides call :meth:`SamplingParams.from_mapping`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodes_app.protocol.decoding import is_int
from nodes_app.protocol.errors import ProtocolError

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
# The largest constraint (an llguidance grammar, JSON) a request may carry: a JSON
# schema of some hundred properties compiles to a few tens of KiB.
GRAMMAR_MAX_CHARS = 256 * 1024


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
SAMPLING_FIELDS = (*SAMPLING_VALUES, "logit_bias", "grammar")


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

    ``grammar`` constrains the completion (ADR-0022): an llguidance grammar
    (its JSON form; the tracker builds it from ``response_format``) that the
    last hop enforces by masking every token that cannot continue it. Whether
    it compiles only a node with the tokenizer can tell for sure.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether the completion's own tokens change the logits (a non-zero penalty)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def history_dependent(self) -> bool:
        """Whether a choice depends on the completion so far (a penalty or a grammar):
        a resumed completion's last hop must be given the tokens already generated."""
        return self.penalized or self.grammar is not None

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
        if self.grammar is not None:
            data["grammar"] = self.grammar
        return data

    @classmethod
    def from_mapping(cls, data: Any) -> SamplingParams:
        """Checked params from JSON fields (absent ones take the defaults).

        Raises :class:`ProtocolError` ``bad_sampling`` naming the field unless
        temperature is a finite number in 0..:data:`TEMPERATURE_MAX`, top_p a
        finite number in :data:`TOP_P_MIN`..1, top_k an integer in
        0..:data:`TOP_K_MAX`, seed null or an integer in 0..:data:`SEED_MAX`,
        each penalty a finite number in :data:`PENALTY_MIN`..:data:`PENALTY_MAX`,
        logit_bias as :func:`logit_bias_pairs` requires and grammar null or a
        string of at most :data:`GRAMMAR_MAX_CHARS`.
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
            grammar=_grammar(data.get("grammar")),
        )


def _grammar(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ProtocolError("grammar must be a non-empty string", code="bad_sampling")
    if len(value) > GRAMMAR_MAX_CHARS:
        raise ProtocolError(
            f"grammar takes at most {GRAMMAR_MAX_CHARS} characters", code="bad_sampling"
        )
    return value


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
    if not is_int(value):
        raise ProtocolError(f"{name} must be an integer", code="bad_sampling")
    if not 0 <= value <= high:
        raise ProtocolError(f"{name} must lie in 0..{high}", code="bad_sampling")
    return value
