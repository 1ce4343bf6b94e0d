"""The dashboard in a real browser: Debian's chromium driven by Playwright against a
live tracker with tiny-model nodes (real processes). Run alone with ``pytest -m browser``.

Every test opens its own page in one signed-in browser context and fails if
the page logged a console error.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.support.browser import chromium, open_tab, sign_in
from tests.support.network import Network, start_network
from tracker_app.localnet import NodeProcess, fresh_process_database, wait_until

pytestmark = pytest.mark.browser

TINY = "tiny-random-llama"
USER, PASSWORD = "browser-staff", "browser-staff-password"
TIMEOUT_MS = 20_000
ANSWERS = '.bubble[data-author="assistant"] .bubble-text'


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """Tracker + a whole-model node + a half-model node (two routes) and a staff user."""
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("dashboard-browser")
        for network in start_network(
            database_url,
            tmp,
            MESHNET_RATE_LIMIT_PER_MINUTE="1000",
            MESHNET_NODE_HEARTBEAT_INTERVAL="1",
        ):
            network.add_node("whole", TINY, (0, 3), wait=False)
            network.add_node("half", TINY, (0, 1), wait=False)
            network.create_staff_user(USER, PASSWORD)
            network.wait_for_nodes()
            yield network


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def signed_in(browser: Browser, network: Network) -> Iterator[BrowserContext]:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=network.url)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    sign_in(page, f"{network.url}/dashboard/", USER, PASSWORD)
    page.close()
    yield context
    context.close()


@pytest.fixture
def console_errors() -> list[str]:
    """What the test's page logged as errors (a test may remove the ones it caused)."""
    return []


@pytest.fixture
def page(signed_in: BrowserContext, console_errors: list[str]) -> Iterator[Page]:
    """The dashboard, live; the test fails if the page logs an error."""
    page = signed_in.new_page()
    errors = console_errors
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto("/dashboard/")
    page.wait_for_selector('[data-role="live-status"][data-state="live"]')
    yield page
    page.close()
    assert errors == []


def send_chat(page: Page, text: str, *, max_tokens: int) -> None:
    """Send ``text`` in a new conversation (so the answer does not depend on earlier ones)."""
    open_tab(page, "chat")
    page.click('[data-role="chat-new"]')
    page.select_option('[data-role="chat-model"]', TINY)
    page.fill('[data-role="chat-temperature"]', "0")  # greedy: the tiny model runs to the limit
    page.fill('[data-role="chat-max-tokens"]', str(max_tokens))
    page.fill('[data-role="chat-input"]', text)
    page.click('[data-role="chat-send"]')


def last_answer(page: Page) -> str:
    return page.locator(ANSWERS).last.inner_text()


def wait_idle(page: Page) -> None:
    page.wait_for_selector('[data-role="chat-send"][data-state="idle"]', timeout=60_000)


def test_an_anonymous_visitor_must_sign_in(browser: Browser, network: Network) -> None:
    page = browser.new_page(base_url=network.url)
    try:
        page.goto("/dashboard/")
        assert "/dashboard/login/" in page.url
    finally:
        page.close()


def test_every_tab_draws_the_live_network(page: Page, network: Network) -> None:
    whole, half = network.nodes["whole"], network.nodes["half"]

    for node in (whole, half):
        row = page.locator(f'tr[data-node-id="{node.node_id}"]')
        assert row.get_attribute("data-state") == "online"
    open_tab(page, "routing")
    assert page.locator(f'[data-routing-model="{TINY}"] tbody tr').count() == 2
    # How far the tracker learned (or, before enough samples, assumes) a request strays.
    spread = page.request.get(f"/v1/routing?model={TINY}").json()["models"][0]["sample_spread"]
    heading = page.locator(f'[data-routing-model="{TINY}"] .card-head').inner_text()
    strays = round((math.exp(spread) - 1) * 100)
    assert f"a request strays ±{strays} % from its route's speed" in heading
    assert "Policy thompson-load" in page.locator('[data-role="routing-config"]').inner_text()
    # Each route's learned prompt cost and speculation, as /v1/routing has them.
    routes = page.request.get(f"/v1/routing?model={TINY}").json()["models"][0]["routes"]
    for route in routes:
        row = page.locator(
            f'[data-routing-model="{TINY}"] tr[data-signature="{route["signature"]}"]'
        )
        cost, accepted = route["prompt_token_seconds"], route["accepted_per_token"]
        shown = "—" if cost is None else f"{cost * 1000:.2f}"
        assert row.locator('[data-field="prompt-cost"]').inner_text() == shown
        assert row.locator('[data-field="accepted"]').inner_text() == (
            "—" if accepted is None else f"{accepted:.2f}"
        )
    for tab in ("calls", "chat", "billing"):
        open_tab(page, tab)


def test_the_overview_shows_each_stages_capacity_and_where_the_next_node_goes(
    page: Page, network: Network
) -> None:
    whole, half = network.nodes["whole"], network.nodes["half"]
    stages = page.locator(f'[data-model="{TINY}"] [data-role="stages"] tbody tr')
    rows = [stages.nth(i).locator("td").all_inner_texts() for i in range(stages.count())]

    # whole serves 0-3 and half 0-1: stage 0-1 has both, stage 2-3 whole alone.
    assert [(row[0], row[1]) for row in rows] == [("0–1", "2"), ("2–3", "1")]
    capacities = [float(row[2].replace(",", "")) for row in rows]
    assert capacities[0] > capacities[1] > 0
    assert rows[1][3] == "goes here: least capacity" and rows[0][3] == ""
    assert set((stages.nth(0).locator("td").nth(1).get_attribute("title") or "").split(", ")) == {
        whole.node_id,
        half.node_id,
    }


def test_a_streamed_answer_grows_in_the_last_bubble_until_it_completes(page: Page) -> None:
    # Every text the answer's bubble shows, recorded by the page as it changes.
    page.evaluate(
        """(answers) => {
            window.__seen = [];
            new MutationObserver(() => {
                const texts = document.querySelectorAll(answers);
                const text = texts.length ? texts[texts.length - 1].textContent : "";
                if (window.__seen[window.__seen.length - 1] !== text) window.__seen.push(text);
            }).observe(document.querySelector('[data-role="chat-log"]'),
                       {subtree: true, childList: true, characterData: true});
        }""",
        ANSWERS,
    )

    send_chat(page, "Tell me about meshes.", max_tokens=400)
    wait_idle(page)

    seen: list[str] = page.evaluate("window.__seen")
    final = last_answer(page)
    growing = [text for text in seen if text and final.startswith(text)]
    assert len(set(growing)) >= 3, seen
    assert page.locator(".bubble[data-streaming]").count() == 0
    meta = page.locator(".bubble-meta").last.inner_text()
    assert "route " in meta and "mode " in meta and "400 tokens" in meta
    assert page.locator('[data-role="chat-status"]').inner_text().startswith("done")


def test_the_overview_shows_the_prefix_cache_an_answer_left_on_its_nodes(
    page: Page, network: Network
) -> None:
    send_chat(page, "Tell me about prefixes.", max_tokens=60)
    wait_idle(page)
    open_tab(page, "overview")

    def shown(node: NodeProcess) -> tuple[str, str]:
        row = page.locator(f'tr[data-node-id="{node.node_id}"]')
        cells = (
            row.locator('[data-field="prefix-cache"]'),
            row.locator('[data-field="prefix-hits"]'),
        )
        return cells[0].inner_text(), cells[1].inner_text()

    def reported(node: NodeProcess) -> tuple[str, str]:
        # What the node's own open health page says, as the Overview writes it.
        health = node.health()
        load = health["prefix_cache_load"]
        return (f"≤ {load:.0%}" if load > 0 else "0%"), f"{health['prefix_hits']:,}"

    # The answer's route kept its conversation (a scoped dashboard chat, ADR-0027):
    # its nodes' next heartbeats carry a cache load the Overview shows without a reload.
    wait_until(
        lambda: (
            all(shown(node) == reported(node) for node in network.nodes.values())
            and any(shown(node)[0].startswith("≤") for node in network.nodes.values())
        ),
        timeout=20,
        what="the Overview to show each node's prefix cache as the node reports it",
        interval=0.25,
    )


def test_stop_keeps_the_partial_answer_and_frees_the_nodes_sessions(
    page: Page, network: Network
) -> None:
    send_chat(page, "Write a long story.", max_tokens=4000)
    page.wait_for_function(
        """(answers) => {
            const texts = document.querySelectorAll(answers);
            return texts.length && texts[texts.length - 1].textContent.length > 40;
        }""",
        arg=ANSWERS,
    )
    assert page.locator('[data-role="chat-send"]').inner_text().endswith("Stop")

    page.click('[data-role="chat-send"]')
    wait_idle(page)

    kept = last_answer(page)
    assert len(kept) > 40
    assert "stopped" in page.locator(".bubble-meta").last.inner_text()
    wait_until(
        lambda: [n.health()["cached_sessions"] for n in network.nodes.values()] == [0, 0],
        timeout=60,
        what="every node to free the stopped answer's session",
        interval=0.2,
    )
    time.sleep(0.5)
    assert last_answer(page) == kept


def test_a_reload_mid_answer_keeps_the_text_and_leaves_no_cursor(page: Page) -> None:
    send_chat(page, "Write a long story.", max_tokens=4000)
    page.wait_for_function(
        """(answers) => {
            const texts = document.querySelectorAll(answers);
            return texts.length && texts[texts.length - 1].textContent.length > 40;
        }""",
        arg=ANSWERS,
    )

    page.reload()
    page.wait_for_selector('[data-role="live-status"][data-state="live"]')
    open_tab(page, "chat")

    assert page.locator(".bubble[data-streaming]").count() == 0
    assert len(last_answer(page)) > 0
    assert "interrupted" in page.locator(".bubble-meta").last.inner_text()
    assert page.locator('[data-role="chat-send"]').get_attribute("data-state") == "idle"


def test_an_error_answer_becomes_an_error_bubble(page: Page, console_errors: list[str]) -> None:
    open_tab(page, "chat")
    page.click('[data-role="chat-new"]')
    page.select_option('[data-role="chat-model"]', "smollm2-135m")  # no node serves it here
    page.fill('[data-role="chat-input"]', "Hello?")
    page.click('[data-role="chat-send"]')
    wait_idle(page)

    bubble = page.locator(".bubble[data-error]").last
    assert "No route can serve smollm2-135m" in bubble.inner_text()
    # The browser logs the 503 itself; nothing else may be logged.
    assert [e for e in console_errors if "503" not in e] == []
    console_errors.clear()


def test_the_call_wall_shows_a_request_processing_then_completed(page: Page) -> None:
    send_chat(page, "Count to a thousand.", max_tokens=1500)
    open_tab(page, "calls")

    processing = page.locator('[data-role="calls-in-flight"] tr[data-state="processing"]').first
    processing.wait_for()
    request_id = processing.get_attribute("data-request-id")
    done = page.locator(f'[data-role="calls-recent"] tr[data-request-id="{request_id}"]')
    done.wait_for(timeout=60_000)
    page.wait_for_function(
        """(id) => {
            const row = document.querySelector(
                `[data-role="calls-recent"] tr[data-request-id="${id}"]`);
            return row && row.dataset.state === "completed"
                && row.querySelector('[data-field="cost"]').textContent !== "—";
        }""",
        arg=request_id,
    )
    assert done.locator('[data-field="tokens"]').inner_text() == "1,500"


def test_the_routing_sample_count_rises_without_a_reload(page: Page) -> None:
    open_tab(page, "routing")
    cells = page.locator(f'[data-routing-model="{TINY}"] [data-field="samples"]')
    before = sum(int(text.replace(",", "")) for text in cells.all_inner_texts())

    send_chat(page, "One more, please.", max_tokens=60)
    wait_idle(page)
    open_tab(page, "routing")

    try:
        page.wait_for_function(
            """([model, before]) => {
                const cells = document.querySelectorAll(
                    `[data-routing-model="${model}"] [data-field="samples"]`);
                const total = [...cells].reduce(
                    (sum, cell) => sum + Number(cell.textContent.replaceAll(",", "")), 0);
                return total > before;
            }""",
            arg=[TINY, before],
            polling=250,
        )
    except PlaywrightTimeoutError:
        table = page.locator(f'[data-routing-model="{TINY}"]').inner_text()
        meta = page.locator(".bubble-meta").last.inner_text()
        served = page.request.get(f"/v1/routing?model={TINY}").json()
        samples = [
            (route["signature"], route["samples"]) for route in served["models"][0]["routes"]
        ]
        raise AssertionError(
            f"{before} samples before; answer: {meta}; the page shows:\n{table}\n"
            f"the tracker's /v1/routing: {samples}"
        ) from None


def test_a_node_that_stops_goes_offline_on_the_overview_without_a_reload(
    page: Page, network: Network
) -> None:
    half = network.nodes["half"]
    row = page.locator(f'tr[data-node-id="{half.node_id}"]')
    assert row.get_attribute("data-state") == "online"

    half.stop()  # SIGTERM: the node deregisters

    page.wait_for_selector(f'tr[data-node-id="{half.node_id}"][data-state="offline"]')
    whole = network.nodes["whole"]
    assert page.locator(f'tr[data-node-id="{whole.node_id}"]').get_attribute("data-state") == (
        "online"
    )
