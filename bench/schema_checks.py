"""The tracker's OpenAPI schema, as a live tracker serves it, held to schemathesis' checks.

``CHECKS`` are the four checks every answer is held to: no 5xx, a documented
status, a documented content type, a body that matches the documented schema.
``assert_conforms`` runs them on one real answer; ``schemathesis_run`` runs
``schemathesis run`` (its CLI, every phase) against a live tracker and reads
its JSON report. ``bench/bench_schemathesis.py`` and the schema tests share it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tracker_app.localnet.stand_in_nodes import ChallengeResponder, proven_registration

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]

# A completion (chat or text) for a model no node serves is answered 503 no_route:
# the documented answer of a tracker without capacity, not a crash.
# not_a_server_error still fails every other 5xx, and every 5xx of every other operation.
SCHEMATHESIS_CONFIG = """
[[operations]]
include-path = "/v1/chat/completions"
include-method = "POST"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]

[[operations]]
include-path = "/v1/completions"
include-method = "POST"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]
"""

# A fuzzed tracker counts every request against the rate limits; limits this high
# let the fuzz reach what lies behind them (the 429s are documented all the same).
FUZZED_TRACKER_SETTINGS = {
    "MESHNET_RATE_LIMIT_PER_MINUTE": "1000000",
    "MESHNET_REGISTRATION_RATE_LIMIT": "1000000",
}


def live_schema(tracker_url: str) -> Any:
    """The schema ``tracker_url`` serves, its operations aimed at that tracker."""
    raw = httpx.get(f"{tracker_url}/api/schema/", params={"format": "json"}, timeout=30)
    raw.raise_for_status()
    schema = schemathesis.openapi.from_dict(raw.json())
    schema.config.update(base_url=tracker_url)
    return schema


def operations_of(tracker_url: str) -> list[tuple[str, str]]:
    """(method, path) of every operation in the schema ``tracker_url`` serves."""
    raw = httpx.get(f"{tracker_url}/api/schema/", params={"format": "json"}, timeout=30)
    return [(method.upper(), path) for path, item in raw.json()["paths"].items() for method in item]


def assert_conforms(schema: Any, method: str, path: str, response: Any) -> None:
    """``response``, a real answer of ``method path`` (the schema's path template), passes
    every check of ``CHECKS``; a failure names what the schema did not expect."""
    case = schema[path][method].Case()
    case.validate_response(response, checks=CHECKS)


@dataclass(frozen=True)
class FuzzRun:
    """What one ``schemathesis run`` did: its exit status, its output and its report."""

    returncode: int
    output: str
    report: dict[str, Any]

    @property
    def examples(self) -> int:
        """Requests generated and sent, over every operation and phase."""
        return int(self.report["test_cases"]["generated"])

    @property
    def failures(self) -> int:
        """Requests whose answer failed a check, or that failed to run (0 on a clean run)."""
        cases = self.report["test_cases"]
        return int(cases["with_failures"]) + int(cases["errored"])

    def accepted(self, operation: str) -> int:
        """Requests of ``operation`` (e.g. ``"GET /v1/models"``) the tracker accepted."""
        rates = self.report["valid_rates"].get(operation, {})
        return sum(int(phase["accepted"]) for phase in rates.values())

    @property
    def operations(self) -> int:
        """Operations of the schema that were tested."""
        return int(self.report["operations"]["tested"])


@dataclass(frozen=True)
class NodeCredentials:
    """A registered node's id and token: what a heartbeat and a deregistration carry."""

    node_id: str
    token: str

    def config(self) -> str:
        """Schemathesis configuration: heartbeats as this node. A deregistration's node id
        is left to the fuzz (its refusals), or the node would leave at the first one."""
        return f"""
[[operations]]
include-path = "/api/nodes/{{node_id}}/heartbeat"
parameters = {{ "path.node_id" = "{self.node_id}" }}
headers = {{ Authorization = "Bearer {self.token}" }}
"""


def registered_node(tracker_url: str, responder: ChallengeResponder) -> NodeCredentials:
    """A node of the tiny model registered at ``tracker_url`` by a real wallet, its endpoint
    proven by ``responder``. Its layers (1-2) complete no route: no chat is sent to it."""
    body = proven_registration(responder, shard_start=1, shard_end=2)
    answer = httpx.post(f"{tracker_url}/api/nodes/register", json=body, timeout=30)
    assert answer.status_code == 201, answer.text
    return NodeCredentials(answer.json()["node_id"], answer.json()["node_token"])


def schemathesis_run(
    tracker_url: str,
    *,
    api_key: str,
    node: NodeCredentials | None = None,
    max_examples: int,
    workdir: Path,
    seed: int | None = None,
    phases: str = "examples,coverage,fuzzing,stateful",
    timeout: float = 600,
) -> FuzzRun:
    """``schemathesis run`` against the schema ``tracker_url`` serves: the same requests
    on every run unless a ``seed`` asks for others. Every request carries ``api_key``
    but those of the node operations, which are ``node``'s own when given. The checks
    are :data:`CHECKS`, configured by :data:`SCHEMATHESIS_CONFIG`."""
    report = workdir / "schemathesis.json"
    config = workdir / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG + (node.config() if node else ""))
    argv = [
        str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(config), "run",
        f"{tracker_url}/api/schema/?format=json",
        "--checks", ",".join(check.__name__ for check in CHECKS),
        "--header", f"Authorization: Bearer {api_key}",
        "--max-examples", str(max_examples),
        *(["--seed", str(seed)] if seed is not None else ["--generation-deterministic"]),
        "--phases", phases,
        "--workers", "1",
        "--request-timeout", "30",
        "--report", "json", "--report-json-path", str(report),
        "--output-truncate", "false",
        "--suppress-health-check", "all",
    ]  # fmt: skip
    done = subprocess.run(
        argv, cwd=workdir, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = done.stdout + done.stderr
    assert report.exists(), f"schemathesis wrote no report:\n{output}"
    return FuzzRun(done.returncode, output, json.loads(report.read_text()))
