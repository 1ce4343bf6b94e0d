"""``runtracker --processes 2``: two server processes behind one port, as one tracker.

One network for the module: PostgreSQL, a Redis database of its own, a
tracker of two processes and one node serving the whole tiny model. Each
response names the process that answered (``Meshnet-Tracker-Process``), so
the tests see both serve and what one learned reach the other (ADR-0023).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
import websockets

from meshnet_site.server_processes import RESTART_AFTER
from tests.support.network import Network, start_network
from tests.support.redis_db import private_redis
from tests.support.routing_processes import SETTINGS, TINY
from tracker_app.localnet import (
    ManagedProcess,
    fresh_process_database,
    manage_argv,
    process_env,
    run_checked,
    run_command,
    start_tracker,
    wait_until,
)

HEADER = "Meshnet-Tracker-Process"
BOTH = {"1/2", "2/2"}
READY = re.compile(r"Meshnet tracker ready: .*\(2 processes, pids (\d+), (\d+);")
network = contextmanager(start_network)


@dataclass
class TwoProcesses:
    net: Network
    redis: str
    database_url: str

    @property
    def supervisor(self) -> ManagedProcess:
        assert self.net.tracker is not None
        return self.net.tracker.process

    def pids(self) -> tuple[int, int]:
        """The server processes' pids, from the latest ready line."""
        *_, found = READY.finditer(self.supervisor.output())
        return int(found.group(1)), int(found.group(2))


def served_by(response: httpx.Response) -> str:
    return response.headers[HEADER]


def until_both_answered(
    call: Callable[[], httpx.Response], tries: int = 60
) -> list[httpx.Response]:
    """``call()`` (each a new connection) until both processes have answered; the answers."""
    answers: list[httpx.Response] = []
    while {served_by(answer) for answer in answers} != BOTH:
        assert len(answers) < tries, f"only {HEADER} {answers[0].headers.get(HEADER)} answered"
        answers.append(call())
    return answers


def posted_chat(net: Network) -> httpx.Response:
    response = httpx.post(
        f"{net.url}/v1/chat/completions",
        json={
            "model": TINY,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 8,
            "temperature": 0,
        },
        headers=net.headers(),
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response


@pytest.fixture(scope="module")
def two_processes(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[TwoProcesses]:
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        pytest.fail("several tracker processes need PostgreSQL: set DATABASE_URL to one")
    redis = private_redis(redis_url)
    tmp = tmp_path_factory.mktemp("tracker-processes")
    settings: dict[str, str | None] = {**SETTINGS, "REDIS_URL": redis}
    with (
        fresh_process_database() as database_url,
        Network.throwaway(workdir=tmp, database_url=database_url, env=settings) as net,
    ):
        net.start_tracker(flags=("--processes", "2"))
        net.api_key = net.create_api_key("processes")
        net.add_node("whole", TINY, (0, 3))
        net.wait_for_route(TINY)
        yield TwoProcesses(net, redis, database_url)


def test_both_processes_answer_on_the_one_port(two_processes: TwoProcesses) -> None:
    net = two_processes.net

    answers = until_both_answered(lambda: httpx.get(f"{net.url}/healthz", timeout=30))

    assert all(answer.status_code == 200 for answer in answers)
    first, second = two_processes.pids()
    assert {first, second} == {
        p.pid for p in psutil.Process(two_processes.supervisor.pid).children()
    }


HEALTHZ_COUNT = re.compile(
    r'^django_http_requests_total_by_view_transport_method_total\{[^}]*view="healthz"[^}]*\} '
    r"([0-9.]+)$",
    re.MULTILINE,
)


def test_metrics_from_either_process_count_the_requests_of_both(
    two_processes: TwoProcesses,
) -> None:
    net = two_processes.net

    def healthz_counts() -> dict[str, int]:
        answers = until_both_answered(lambda: httpx.get(f"{net.url}/metrics", timeout=30))
        return {
            served_by(answer): sum(int(float(n)) for n in HEALTHZ_COUNT.findall(answer.text))
            for answer in answers
        }

    before = max(healthz_counts().values())
    checks = until_both_answered(lambda: httpx.get(f"{net.url}/healthz", timeout=30))

    # Each process alone saw only its share of the checks.
    assert healthz_counts() == {"1/2": before + len(checks), "2/2": before + len(checks)}


def test_a_chat_through_the_shared_port_is_answered_by_either_process(
    two_processes: TwoProcesses,
) -> None:
    net = two_processes.net

    answers = until_both_answered(lambda: posted_chat(net))

    texts = {answer.json()["choices"][0]["message"]["content"] for answer in answers}
    assert len(texts) == 1 and texts != {""}  # greedy: the same answer from either


def test_the_route_samples_of_each_process_reach_the_other(two_processes: TwoProcesses) -> None:
    net = two_processes.net
    until_both_answered(lambda: posted_chat(net))

    def own_samples() -> list[int]:
        """Each process's own samples, as its durable copy (under its own id) holds them."""
        return [row[0] for row in net.query("SELECT samples FROM routing_app_routearm")]

    def samples_shown() -> set[tuple[str, int]]:
        answers = until_both_answered(
            lambda: httpx.get(
                f"{net.url}/v1/routing", params={"model": TINY}, headers=net.headers(), timeout=30
            )
        )
        return {(served_by(a), a.json()["models"][0]["routes"][0]["samples"]) for a in answers}

    # Both wrote a copy of their own (neither overwrote the other's), and each
    # shows the sum: what it measured and what it merged in from the other.
    wait_until(
        lambda: (
            len(own := own_samples()) == 2
            and min(own) > 0
            and samples_shown() == {("1/2", sum(own)), ("2/2", sum(own))}
        ),
        timeout=30,
        interval=1.0,
        what="both processes to show the samples of both",
    )


def staff_cookie(net: Network) -> str:
    run_checked(
        manage_argv("createsuperuser", "--noinput", "--username", "staff", "--email", "s@x.org"),
        env={**net.env, "DJANGO_SUPERUSER_PASSWORD": "pw-processes"},
    )
    with httpx.Client(base_url=net.url) as client:
        page = client.get("/admin/login/")
        token = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
        client.post(
            "/admin/login/?next=/admin/",
            data={"username": "staff", "password": "pw-processes", "csrfmiddlewaretoken": token},
        )
        return f"sessionid={client.cookies['sessionid']}"


def test_a_dashboard_sees_the_chats_of_both_processes(two_processes: TwoProcesses) -> None:
    net = two_processes.net
    cookie = staff_cookie(net)
    ws_url = net.url.replace("http://", "ws://") + "/ws/dashboard/"

    async def watch() -> tuple[dict[str, str], set[str]]:
        async with websockets.connect(
            ws_url, additional_headers={"Cookie": cookie, "Origin": net.url}
        ) as socket:
            await socket.recv()  # the page's first state
            answers = await asyncio.to_thread(until_both_answered, lambda: posted_chat(net))
            chats = {a.json()["id"].removeprefix("chatcmpl-"): served_by(a) for a in answers}
            completed: set[str] = set()
            while not set(chats) <= completed:
                message = json.loads(await asyncio.wait_for(socket.recv(), 30))
                if message["type"] == "call" and message["call"]["state"] == "completed":
                    completed.add(message["call"]["request_id"].replace("-", ""))
            return chats, completed

    chats, completed = asyncio.run(watch())

    # The socket lives in one process: the other's chats reached it through Redis.
    assert set(chats.values()) == BOTH
    assert set(chats) <= completed


def test_a_killed_process_is_started_again_while_the_other_serves(
    two_processes: TwoProcesses,
) -> None:
    net, supervisor = two_processes.net, two_processes.supervisor
    first, second = two_processes.pids()
    # Started again only once it had served a while (sooner is a fault: all stop).
    served_since = psutil.Process(second).create_time()
    time.sleep(max(0.0, served_since + RESTART_AFTER + 1 - time.time()))

    os.kill(second, signal.SIGKILL)
    during = [httpx.get(f"{net.url}/healthz", timeout=30) for _ in range(10)]
    wait_until(
        lambda: "tracker process 2 serves again" in supervisor.output(),
        timeout=60,
        what="process 2 to serve again",
        process=supervisor,
    )

    assert all(answer.status_code == 200 for answer in during)
    assert f"tracker process 2 (pid {second}) was killed by SIGKILL" in supervisor.output()
    children = {p.pid for p in psutil.Process(supervisor.pid).children()}
    assert first in children and second not in children and len(children) == 2
    assert {served_by(a) for a in until_both_answered(lambda: posted_chat(net))} == BOTH


@contextmanager
def bare_two_processes(two: TwoProcesses, log_dir: Path) -> Iterator[ManagedProcess]:
    """Another tracker of two processes on the module's database, no node needed."""
    started = start_tracker(
        env=process_env(two.database_url, REDIS_URL=two.redis, **SETTINGS),
        log_dir=log_dir,
        flags=("--processes", "2"),
    )
    with started.process:
        started.wait_healthy()
        wait_until(
            lambda: READY.search(started.process.output()) is not None,
            timeout=30,
            what="the ready line",
            process=started.process,
        )
        yield started.process


def server_pids(supervisor: ManagedProcess) -> list[int]:
    found = READY.search(supervisor.output())
    assert found is not None
    return [int(found.group(1)), int(found.group(2))]


def test_sigterm_to_the_supervisor_stops_both_processes(
    two_processes: TwoProcesses, tmp_path: Path
) -> None:
    with bare_two_processes(two_processes, tmp_path) as supervisor:
        pids = server_pids(supervisor)

        supervisor.signal(signal.SIGTERM)

        assert supervisor.wait(timeout=30) == 0
        assert not any(psutil.pid_exists(pid) for pid in pids)


def test_the_processes_stop_when_their_supervisor_is_killed(
    two_processes: TwoProcesses, tmp_path: Path
) -> None:
    with bare_two_processes(two_processes, tmp_path) as supervisor:
        processes = [psutil.Process(pid) for pid in server_pids(supervisor)]

        os.kill(supervisor.pid, signal.SIGKILL)  # the supervisor alone, not its group

        _gone, alive = psutil.wait_procs(processes, timeout=30)
        assert alive == []


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"REDIS_URL": None}, "--processes 2 needs REDIS_URL"),
        ({"DATABASE_URL": "sqlite:///unused.sqlite3"}, "--processes 2 needs PostgreSQL"),
    ],
)
def test_several_processes_are_refused_without_shared_state(
    settings: dict[str, str | None], words: str, redis_url: str
) -> None:
    env = process_env(**{"REDIS_URL": redis_url, **settings})

    result = run_command(manage_argv("runtracker", "--port", "1", "--processes", "2"), env=env)

    assert result.returncode != 0
    assert words in result.stderr


def test_a_port_in_use_is_refused(two_processes: TwoProcesses) -> None:
    port = two_processes.net.url.rsplit(":", 1)[1]
    env = process_env(two_processes.database_url, REDIS_URL=two_processes.redis)

    result = run_command(manage_argv("runtracker", "--port", port, "--processes", "2"), env=env)

    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_a_process_count_below_one_is_refused() -> None:
    result = run_command(manage_argv("runtracker", "--processes", "0"), env=process_env())

    assert result.returncode != 0
    assert "--processes: must be at least 1" in result.stderr
