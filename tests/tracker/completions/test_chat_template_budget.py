"""A checkpoint whose chat template never ends, on a real tracker: a chat to it fails in
seconds, the tracker stays responsive, the model is flagged, and SIGTERM still stops it.

The template nests two ``range(100000)`` loops (what jinja's sandbox allows each
one): 10¹⁰ iterations, for ever in practice. No node is needed: the tracker
renders the template to count the prompt before it routes.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.checkpoints import tiny_checkpoint, tiny_tokenizer
from tests.support.network import Network, start_network
from tracker_app.localnet import fresh_process_database, manage_argv, run_checked
from tracker_app.localnet.network import start_tracker

MODEL = "looping-template"
LOOPING_TEMPLATE = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{{ messages[0]['content'] }}"
)
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    checkpoint = tiny_checkpoint("llama", tmp_path_factory.mktemp("looping-checkpoint"))
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = LOOPING_TEMPLATE
    tokenizer.save_pretrained(checkpoint)
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("template-budget")
        for network in start_network(database_url, tmp):
            run_checked(
                manage_argv("add_model", MODEL, "--weights", str(checkpoint)), env=network.env
            )
            yield network


def health_seconds(url: str) -> float:
    started = time.monotonic()
    assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
    return time.monotonic() - started


def test_a_looping_template_fails_its_chat_in_seconds_and_the_tracker_stays_fast(
    network: Network,
) -> None:
    with ThreadPoolExecutor(4) as pool:
        started = time.monotonic()
        chats = [pool.submit(network.chat, **ASK) for _ in range(3)]
        time.sleep(0.5)
        health = [health_seconds(network.url) for _ in range(3)]
        answers = [chat.result() for chat in chats]
        took = time.monotonic() - started

    for answer in answers:
        assert answer.status_code == 500, answer.text
        error = answer.json()["error"]
        assert error["code"] == "chat_template_over_budget"
        # Whichever bound this machine reaches first: the lines or the seconds.
        assert re.match(
            r"the model's chat template (ran past \d+ lines|took more than [\d.]+ s)",
            error["message"],
        ), error["message"]
    assert took < 20
    assert max(health) < 1.5
    [(fault,)] = network.query(
        "SELECT chat_template_fault FROM nodes_app_languagemodel WHERE key = %s", MODEL
    )
    assert "chat template" in fault
    assert not network.query("SELECT id FROM tracker_app_billingrecord")


def test_sigterm_stops_a_tracker_rendering_a_looping_template(
    network: Network, tmp_path: Path
) -> None:
    tracker = start_tracker(env=network.env, log_dir=tmp_path)
    with tracker.process:
        tracker.wait_healthy()
        with ThreadPoolExecutor(1) as pool:
            chat = pool.submit(
                httpx.post,
                f"{tracker.url}/v1/chat/completions",
                json=ASK,
                headers=network.headers(),
                timeout=60,
            )
            time.sleep(0.5)  # the render is under way
            tracker.process.signal(signal.SIGTERM)
            assert tracker.process.wait(timeout=15) is not None
            chat.exception(timeout=60)  # answered or cut off, never left hanging
