"""The dashboard in Debian's chromium, driven by Playwright: the browser tests' helper.

Never a downloaded browser: ``/usr/bin/chromium`` (``make setup`` installs it).
Run as a script it signs in to a running tracker and takes the README's
screenshots of every tab::

    .venv/bin/python -m tests.support.browser http://127.0.0.1:8000 USER PASSWORD docs/img
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
TABS = ("overview", "routing", "calls", "chat", "billing")


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """Headless Debian chromium (``--no-sandbox``: these machines run tests as root)."""
    assert CHROMIUM.exists(), "the browser tests drive Debian's chromium: apt-get install chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            yield browser
        finally:
            browser.close()


def sign_in(page: Page, dashboard_url: str, username: str, password: str) -> None:
    """Open ``dashboard_url``, sign in on the login page it redirects to, wait until live."""
    page.goto(dashboard_url)
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/dashboard/")
    page.wait_for_selector('[data-role="live-status"][data-state="live"]')


def open_tab(page: Page, tab: str) -> None:
    page.click(f"#tab-{tab}")
    page.wait_for_selector(f'[data-panel="{tab}"]:not([hidden])')


def chat(page: Page, model: str, text: str, *, max_tokens: int) -> None:
    """Send ``text`` from the Chat tab in a new conversation and wait for the whole answer."""
    open_tab(page, "chat")
    page.click('[data-role="chat-new"]')
    page.select_option('[data-role="chat-model"]', model)
    page.fill('[data-role="chat-max-tokens"]', str(max_tokens))
    page.fill('[data-role="chat-input"]', text)
    page.click('[data-role="chat-send"]')
    page.wait_for_selector('[data-role="chat-send"][data-state="idle"]', timeout=120_000)


def screenshot_tabs(page: Page, out_dir: Path) -> list[Path]:
    """A PNG of every tab, ``dashboard-<tab>.png`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    taken = []
    for tab in TABS:
        open_tab(page, tab)
        path = out_dir / f"dashboard-{tab}.png"
        page.screenshot(path=str(path))
        taken.append(path)
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tracker", help="the tracker's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("username")
    parser.add_argument("password")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--model", default="smollm2-135m", help="the model the chat uses")
    parser.add_argument("--chat", help="send this from the Chat tab first", default="")
    args = parser.parse_args()
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(30_000)
        sign_in(page, f"{args.tracker.rstrip('/')}/dashboard/", args.username, args.password)
        if args.chat:
            chat(page, args.model, args.chat, max_tokens=96)
        for path in screenshot_tabs(page, args.out_dir):
            print(path)


if __name__ == "__main__":
    main()
