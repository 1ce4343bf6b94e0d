"""`meshnet_up` (what `make demo` runs): starts the whole network, prints where and how to log
in, refuses a second run, and stops every process it started on Ctrl-C.

The process tests run ``meshnet_up --topology tiny`` as a newcomer would after a fresh
clone: the embedded database and broker (no DATABASE_URL, no REDIS_URL) in a state folder
of their own, ports moved with ``--port-base`` so they never meet another test's.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.browser import chromium, sign_in
from tracker_app.localnet import LOOPBACK, ManagedProcess, manage_argv, process_env
from tracker_app.localnet.demo import (
    READY_HEADLINE,
    DemoAlreadyRunning,
    DemoCredentials,
    check_ports_free,
    credentials_load,
    credentials_save,
    demo_lock,
    ready_block,
)
from tracker_app.localnet.topology import topology_load

TINY_NODES = 4  # nodes in topologies/tiny.toml


# --- the steps, alone -------------------------------------------------------------------


def test_credentials_are_stored_for_this_user_only_and_read_back(tmp_path: Path) -> None:
    saved = DemoCredentials(username="meshnet-demo", password="pw", api_key="mk-1")

    path = credentials_save(tmp_path, saved)

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert credentials_load(tmp_path) == saved


def test_missing_or_broken_credentials_read_as_none(tmp_path: Path) -> None:
    assert credentials_load(tmp_path) is None
    (tmp_path / "demo.json").write_text("{not json")
    assert credentials_load(tmp_path) is None


def test_the_lock_refuses_while_its_holder_lives_and_is_released_after(tmp_path: Path) -> None:
    holder = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "meshnet_up.pid").write_text(f"{holder.pid}\n")
        refused = pytest.raises(DemoAlreadyRunning, match=f"already running \\(pid {holder.pid}")
        with refused, demo_lock(tmp_path):
            pass
    finally:
        holder.kill()
        holder.wait()

    # The holder died without cleaning up: its lock is taken over, then released.
    with demo_lock(tmp_path) as path:
        assert path.read_text().strip() == str(os.getpid())
    assert not path.exists()


def test_a_busy_port_is_named_with_the_way_out() -> None:
    with socket.socket() as listener:
        listener.bind((LOOPBACK, 0))
        listener.listen()
        busy = listener.getsockname()[1]
        topology = topology_load("tiny").with_port_base(busy)

        with pytest.raises(DemoAlreadyRunning, match=f"port {busy} .*--port-base"):
            check_ports_free(topology)


def test_the_ready_block_puts_the_dashboard_and_login_first_then_key_curl_and_python() -> None:
    credentials = DemoCredentials(username="meshnet-demo", password="s3cret", api_key="mk-abc")
    topology = topology_load("tiny")

    block = ready_block(
        "http://h:1", topology, credentials, password_shown=True, credentials_path=Path("x")
    )
    lines = [line for line in block.splitlines() if line]

    assert lines[0] == f"{READY_HEADLINE} Dashboard: http://h:1/dashboard/"
    assert lines[1].split() == ["login:", "meshnet-demo", "/", "s3cret"]
    assert "mk-abc" in lines[2]
    assert "curl -sN http://h:1/v1/chat/completions" in block
    assert 'OpenAI(base_url="http://h:1/v1", api_key="mk-abc")' in block
    again = ready_block(
        "http://h:1", topology, credentials, password_shown=False, credentials_path=Path("x")
    )
    assert "s3cret" not in again and "stored in x" in again


@pytest.mark.django_db
def test_the_demo_login_and_key_are_created_once_then_reused(tmp_path: Path) -> None:
    from django.contrib.auth import authenticate

    from tracker_app.api_keys.services import api_key_lookup
    from tracker_app.management.commands.meshnet_up import Command

    first, first_is_new = Command().credentials(tmp_path)
    again, again_is_new = Command().credentials(tmp_path)

    assert first_is_new and not again_is_new
    assert again == first
    assert authenticate(username=first.username, password=first.password) is not None
    assert api_key_lookup(plain=first.api_key) is not None

    # demo.json lost: the same demo user gets a new password (printed again) and a new key;
    # the lost file's key stops working.
    (tmp_path / "demo.json").unlink()
    renewed, renewed_is_new = Command().credentials(tmp_path)
    assert renewed_is_new and renewed.username == first.username
    assert authenticate(username=renewed.username, password=renewed.password) is not None
    assert credentials_load(tmp_path) == renewed
    assert api_key_lookup(plain=renewed.api_key) is not None
    assert api_key_lookup(plain=first.api_key) is None


@pytest.mark.django_db
def test_the_demo_never_touches_an_operators_admin_account(tmp_path: Path) -> None:
    from django.contrib.auth import authenticate, get_user_model

    from tracker_app.management.commands.meshnet_up import Command

    get_user_model().objects.create_superuser("admin", password="operators-own")

    credentials, _ = Command().credentials(tmp_path)

    assert credentials.username != "admin"
    assert authenticate(username="admin", password="operators-own") is not None


@pytest.mark.django_db
def test_a_same_named_user_the_demo_did_not_create_is_refused_and_left_alone(
    tmp_path: Path,
) -> None:
    from django.contrib.auth import authenticate, get_user_model
    from django.core.management.base import CommandError

    from tracker_app.management.commands.meshnet_up import DEMO_USERNAME, Command
    from tracker_app.models import ApiKey

    get_user_model().objects.create_user(DEMO_USERNAME, password="someone-elses")

    with pytest.raises(CommandError, match="did not create"):
        Command().credentials(tmp_path)

    assert authenticate(username=DEMO_USERNAME, password="someone-elses") is not None
    assert credentials_load(tmp_path) is None
    assert not ApiKey.objects.exists()


# --- the command, as a process ----------------------------------------------------------


@dataclass
class Demo:
    process: ManagedProcess
    var_dir: Path
    port_base: int
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port_base}"

    def printed(self, label: str) -> str:
        """The value the ready block prints after ``label:``."""
        found = re.search(rf"^\s+{label}:\s+(.+)$", self.process.output(), re.MULTILINE)
        assert found, self.process.output()
        return found.group(1).strip()


def _free_port_run(length: int) -> int:
    """The first of ``length`` consecutive ports nothing listens on (nor binds, right now).

    Below the kernel's ephemeral range: a port the OS hands out, to an outgoing
    connection of the demo's own tracker or worker say, is never in the run.
    """
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(50):
        base = random.randrange(10000, ephemeral_low - length)
        try:
            sockets = []
            for port in range(base, base + length):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind((LOOPBACK, port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no run of free ports")


def _meshnet_up(demo_env: dict[str, str], log: Path, port_base: int) -> ManagedProcess:
    argv = manage_argv("meshnet_up", "--topology", "tiny", "--port-base", str(port_base))
    return ManagedProcess("meshnet_up", argv, env=demo_env, log_path=log)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """``meshnet_up --topology tiny`` in a fresh state folder, waited for its ready block."""
    tmp = tmp_path_factory.mktemp("meshnet-up")
    var_dir = tmp / "var"
    # A fresh clone's settings: nothing but the state folder (and one torch thread).
    env = process_env(None, DATABASE_URL=None, REDIS_URL=None, MESHNET_VAR_DIR=str(var_dir))
    env.pop("DJANGO_SECRET_KEY", None)
    port_base = _free_port_run(1 + TINY_NODES)
    up = _meshnet_up(env, tmp / "up.log", port_base)
    try:
        deadline = time.monotonic() + 180
        while "Press Ctrl-C to stop everything." not in up.output():
            assert up.alive(), up.output()
            assert time.monotonic() < deadline, up.output()
            time.sleep(0.3)
        yield Demo(up, var_dir, port_base, env)
    finally:
        up.stop()


def test_it_reports_each_node_load_and_warms_up_every_candidate_route(demo: Demo) -> None:
    out = demo.process.output()

    for name in ("partial-head", "full", "head", "tail"):
        assert re.search(rf"node {name} \(tiny-random-llama layers \S+\) serves", out), out
    assert f"[{TINY_NODES}/{TINY_NODES}]" in out
    warmed = re.findall(r"warm-up tiny-random-llama via (.+): \d+ tokens", out)
    # Candidates cover every node on a complete route (ADR-0018): the full node alone,
    # head -> tail, and the routes through the partial head and the full node's tail
    # layers; each is warmed once.
    assert len(warmed) == len(set(warmed)), out
    assert {"full", "head -> tail", "partial-head -> tail"} <= set(warmed), out
    on_some_route = {name for route in warmed for name in route.split(" -> ")}
    assert on_some_route == {"partial-head", "full", "head", "tail"}, out
    assert out.index("warm-up") < out.index(READY_HEADLINE)


def test_the_printed_key_chats_and_is_stored_for_the_owner_only(demo: Demo) -> None:
    key = demo.printed("API key")

    reply = httpx.post(
        f"{demo.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "tiny-random-llama", "messages": [{"role": "user", "content": "Hi"}],
              "max_tokens": 4},
        timeout=60,
    )  # fmt: skip

    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] > 0
    stored = demo.var_dir / "demo.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert key in stored.read_text()


def test_a_second_run_says_one_is_running_and_exits_non_zero(demo: Demo, tmp_path: Path) -> None:
    second = _meshnet_up(demo.env, tmp_path / "second.log", demo.port_base)

    status = second.wait(timeout=60)

    assert status != 0
    assert f"meshnet_up is already running (pid {demo.process.pid}" in second.output()
    assert demo.process.alive()


@pytest.mark.browser
def test_the_printed_dashboard_url_and_login_open_the_dashboard(demo: Demo) -> None:
    dashboard_url = demo.process.output().split("Dashboard:", 1)[1].split()[0]
    username, _, password = demo.printed("login").partition(" / ")
    with chromium() as browser:
        page = browser.new_page()
        page.set_default_timeout(20_000)
        sign_in(page, dashboard_url, username, password)


def test_each_part_logs_one_ready_line_and_no_progress_bar_off_a_terminal(demo: Demo) -> None:
    logs = demo.var_dir / "logs"

    tracker = (logs / "tracker.log").read_text()
    node = (logs / "node-full.log").read_text()

    assert f"Meshnet tracker ready: dashboard {demo.url}/dashboard/  API {demo.url}/v1/" in tracker
    ready = re.search(
        r"^node \S+ serving tiny-random-llama layers 0-3 at (\S+) on cpu float32 "
        r"\(\+\d+ MiB, benchmark [\d.]+ tok/s\)$",
        node,
        re.MULTILINE,
    )
    assert ready, node
    assert ready.group(1) == f"http://{LOOPBACK}:{demo.port_base + 2}"
    assert "tensor/s" not in node  # tqdm's bar is for terminals only


def test_ctrl_c_stops_every_process_it_started_and_frees_the_lock(demo: Demo) -> None:
    parent = psutil.Process(demo.process.pid)
    children = parent.children(recursive=True)
    assert len(children) >= 2 + TINY_NODES  # tracker, worker (and its pool), the nodes

    demo.process.signal(signal.SIGINT)

    assert demo.process.wait(timeout=60) == 0, demo.process.output()
    assert demo.process.output().rstrip().endswith("stopped.")
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []
    assert not (demo.var_dir / "meshnet_up.pid").exists()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{demo.url}/healthz")
