// The dashboard page: draws the embedded snapshot at once, then stays live
// over the websocket (/ws/dashboard/), re-syncing from a fresh snapshot after
// every reconnection.

import { mountBilling } from "./billing.js";
import { mountCalls } from "./calls.js";
import { mountChat } from "./chat.js";
import { $ } from "./dom.js";
import { mountOverview } from "./overview.js";
import { mountRouting } from "./routing.js";
import { LiveSocket } from "./socket.js";
import { DashboardState } from "./state.js";

const TABS = ["overview", "routing", "calls", "chat", "billing"];

function mountTabs() {
  const buttons = [...document.querySelectorAll('[role="tab"][data-tab]')];
  const select = (name) => {
    const tab = TABS.includes(name) ? name : TABS[0];
    for (const button of buttons) {
      const selected = button.dataset.tab === tab;
      button.setAttribute("aria-selected", String(selected));
      button.tabIndex = selected ? 0 : -1;
    }
    for (const panel of document.querySelectorAll("[data-panel]")) {
      panel.hidden = panel.dataset.panel !== tab;
    }
  };
  for (const button of buttons) {
    button.addEventListener("click", () => {
      history.replaceState(null, "", `#${button.dataset.tab}`);
      select(button.dataset.tab);
    });
    button.addEventListener("keydown", (event) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      if (!step) return;
      const next = buttons[(buttons.indexOf(button) + step + buttons.length) % buttons.length];
      next.focus();
      next.click();
    });
  }
  window.addEventListener("hashchange", () => select(location.hash.slice(1)));
  select(location.hash.slice(1));
}

const state = new DashboardState();
mountTabs();
mountOverview(state);
mountRouting(state);
mountCalls(state);
mountBilling(state);
mountChat(state, {
  csrfToken: document.querySelector('meta[name="csrf-token"]').content,
  endpoint: "/v1/chat/completions",
});

const snapshot = JSON.parse(document.getElementById("dashboard-snapshot").textContent);
state.apply({ type: "snapshot", ...snapshot });

const scheme = location.protocol === "https:" ? "wss:" : "ws:";
new LiveSocket({
  url: `${scheme}//${location.host}/ws/dashboard/`,
  onMessage: (message) => state.apply(message),
  statusElement: $("live-status"),
  sessionCheckUrl: location.pathname,
}).start();
