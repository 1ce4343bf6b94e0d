// Chat: the public /v1/chat/completions, streamed, as the signed-in staff user
// (session cookie + the page's CSRF token; no API key in the page).
//
// Tokens render into the last bubble as they arrive, with a blinking cursor;
// Send becomes Stop, which aborts the request (the tracker then cancels the
// generation upstream and every hop frees its cache) and keeps the partial
// text. Conversations live in localStorage; a reload mid-answer keeps what had
// arrived and never leaves a cursor blinking.

import { $, h, num, routeText } from "./dom.js";

const STORE_KEY = "meshnet.dashboard.chat.v1";
const SAVE_EVERY_MS = 1000;

export function mountChat(state, { csrfToken, endpoint }) {
  const chat = new Chat(state, csrfToken, endpoint);
  chat.mount();
  return chat;
}

class Chat {
  constructor(state, csrfToken, endpoint) {
    this.state = state;
    this.csrfToken = csrfToken;
    this.endpoint = endpoint;
    this.store = loadStore();
    this.controller = null; // AbortController of the answer being generated
    this.live = null; // {message, textNode, metaNode, bubble} of that answer
    this.lastSave = 0;
    this.leaving = false; // the page is being unloaded

    this.log = $("chat-log");
    this.form = $("chat-form");
    this.input = $("chat-input");
    this.sendButton = $("chat-send");
    this.modelSelect = $("chat-model");
    this.conversationSelect = $("chat-conversation");
    this.maxTokens = $("chat-max-tokens");
    this.temperature = $("chat-temperature");
    this.status = $("chat-status");
  }

  mount() {
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (this.controller) this.stop();
      else this.send();
    });
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        if (!this.controller) this.send();
      }
    });
    this.modelSelect.addEventListener("change", () => {
      this.current().model = this.modelSelect.value;
      this.save(true);
    });
    this.conversationSelect.addEventListener("change", () => {
      this.store.current = this.conversationSelect.value;
      this.save(true);
      this.render();
    });
    $("chat-new").addEventListener("click", () => {
      this.newConversation();
      this.render();
      this.input.focus();
    });
    $("chat-delete").addEventListener("click", () => this.deleteConversation());
    this.state.on("models", () => this.renderModels());
    // Saving is throttled while tokens stream: keep the latest text when the page
    // goes. A request cut by the page going away is interrupted, not failed.
    window.addEventListener("pagehide", () => {
      this.leaving = true;
      this.save(true);
    });
    window.addEventListener("pageshow", () => {
      this.leaving = false;
    });
    if (!this.store.conversations.length) this.newConversation();
    this.render();
  }

  current() {
    return (
      this.store.conversations.find((c) => c.id === this.store.current) ||
      this.store.conversations[0]
    );
  }

  newConversation() {
    const conversation = {
      id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`,
      title: "New chat",
      model: this.modelSelect.value || null,
      messages: [],
      updated: Date.now(),
    };
    this.store.conversations.unshift(conversation);
    this.store.current = conversation.id;
    this.save(true);
  }

  deleteConversation() {
    if (this.controller) return;
    const doomed = this.current();
    this.store.conversations = this.store.conversations.filter((c) => c !== doomed);
    if (!this.store.conversations.length) this.newConversation();
    this.store.current = this.store.conversations[0].id;
    this.save(true);
    this.render();
  }

  // --- rendering ---------------------------------------------------------------

  render() {
    this.renderModels();
    this.renderConversations();
    this.renderLog();
    this.renderButton();
  }

  renderModels() {
    const models = [...this.state.models.values()];
    const served = (key) =>
      this.state.gaps(key).length === 0 &&
      this.state.modelNodes(key).some((node) => node.status === "online");
    models.sort((a, b) => served(b.key) - served(a.key) || a.key.localeCompare(b.key));
    const wanted = this.current().model || this.modelSelect.value;
    this.modelSelect.replaceChildren(
      ...models.map((model) =>
        h(
          "option",
          { value: model.key },
          served(model.key) ? model.key : `${model.key} (no route now)`,
        ),
      ),
    );
    if (wanted && models.some((m) => m.key === wanted)) this.modelSelect.value = wanted;
    if (!this.current().model && this.modelSelect.value) {
      this.current().model = this.modelSelect.value;
    }
  }

  renderConversations() {
    this.conversationSelect.replaceChildren(
      ...this.store.conversations.map((c) => h("option", { value: c.id }, c.title)),
    );
    this.conversationSelect.value = this.current().id;
  }

  renderLog() {
    const conversation = this.current();
    const bubbles = conversation.messages.map((message) => this.bubble(message));
    if (!bubbles.length) {
      bubbles.push(
        h("p", { class: "muted" }, "Ask something: the answer streams from the network token by token."),
      );
    }
    this.log.replaceChildren(...bubbles);
    this.log.scrollTop = this.log.scrollHeight;
  }

  bubble(message) {
    const text = h("span", { class: "bubble-text" }, message.error || message.content);
    const meta = h("span", { class: "bubble-meta" }, metaText(message));
    const node = h(
      "div",
      {
        class: "bubble",
        dataset: {
          author: message.role,
          ...(message.streaming ? { streaming: "" } : {}),
          ...(message.error ? { error: "" } : {}),
        },
      },
      text,
      message.role === "assistant" ? meta : null,
    );
    if (message.streaming) this.live = { message, bubble: node, text, meta };
    return node;
  }

  renderButton() {
    const busy = Boolean(this.controller);
    this.sendButton.textContent = busy ? "■ Stop" : "Send";
    this.sendButton.classList.toggle("button-primary", !busy);
    this.sendButton.classList.toggle("button-stop", busy);
    this.sendButton.dataset.state = busy ? "streaming" : "idle";
    for (const control of [this.conversationSelect, this.modelSelect, $("chat-new"), $("chat-delete")]) {
      control.disabled = busy;
    }
  }

  // --- a request ---------------------------------------------------------------

  async send() {
    const content = this.input.value.trim();
    const model = this.modelSelect.value;
    if (!content || !model) return;
    const conversation = this.current();
    conversation.model = model;
    if (!conversation.messages.length) conversation.title = content.slice(0, 40);
    const history = conversation.messages
      .filter((m) => !m.error && m.content)
      .map(({ role, content: text }) => ({ role, content: text }));
    conversation.messages.push({ role: "user", content });
    const answer = { role: "assistant", content: "", streaming: true, tokens: 0 };
    conversation.messages.push(answer);
    this.input.value = "";
    this.controller = new AbortController();
    this.save(true);
    this.render();

    const started = performance.now();
    const progress = () => {
      answer.seconds = (performance.now() - started) / 1000;
      answer.tokensPerSecond = answer.seconds > 0 ? answer.tokens / answer.seconds : null;
      this.status.textContent =
        `generating… ${answer.tokens} tokens · ${num(answer.tokensPerSecond)} tok/s`;
      this.paintLive();
      this.save(false);
    };
    this.status.textContent = "generating…";
    try {
      const response = await fetch(this.endpoint, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": this.csrfToken },
        body: JSON.stringify({
          model,
          messages: [...history, { role: "user", content }],
          stream: true,
          max_tokens: Number(this.maxTokens.value) || 200,
          temperature: Number.isFinite(this.temperature.valueAsNumber) ? this.temperature.valueAsNumber : 0.7,
        }),
        signal: this.controller.signal,
      });
      const type = response.headers.get("Content-Type") || "";
      if (response.ok && type.startsWith("text/event-stream")) {
        await readEvents(response.body, (payload) => {
          if (payload.error) {
            answer.error = payload.error.message || "the request failed";
            return;
          }
          if (payload.meshnet) Object.assign(answer, { route: payload.meshnet.route, mode: payload.meshnet.mode });
          const choice = (payload.choices || [])[0] || {};
          const text = (choice.delta || {}).content;
          if (text) {
            answer.content += text;
            answer.tokens += 1;
          }
          if (payload.usage) answer.tokens = payload.usage.completion_tokens;
          progress();
        });
      } else {
        // A JSON reply: an error (or a server that did not stream).
        const body = await response.json().catch(() => null);
        const message = body && body.choices ? body.choices[0].message : null;
        if (response.ok && message) {
          answer.content = message.content;
          answer.tokens = body.usage ? body.usage.completion_tokens : 0;
          if (body.meshnet) Object.assign(answer, { route: body.meshnet.route, mode: body.meshnet.mode });
        } else {
          answer.error = (body && body.error && body.error.message) || `HTTP ${response.status}`;
        }
      }
    } catch (error) {
      if (this.leaving) answer.interrupted = true;
      else if (error.name === "AbortError") answer.stopped = true;
      else answer.error = `The request failed: ${error.message}`;
    } finally {
      answer.seconds = (performance.now() - started) / 1000;
      answer.tokensPerSecond = answer.seconds > 0 ? answer.tokens / answer.seconds : null;
      delete answer.streaming;
      if (answer.error && answer.content) {
        // Keep what arrived; the error gets a bubble of its own.
        conversation.messages.push({ role: "assistant", content: "", error: answer.error });
        delete answer.error;
      }
      this.controller = null;
      this.live = null;
      conversation.updated = Date.now();
      this.save(true);
      this.render();
      this.status.textContent = answer.error
        ? "error"
        : `${answer.stopped ? "stopped" : "done"} · ${answer.tokens} tokens in ` +
          `${answer.seconds.toFixed(1)} s · ${num(answer.tokensPerSecond)} tok/s`;
      this.input.focus();
    }
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  /** Only the answer being generated changes: update its text in place. */
  paintLive() {
    if (!this.live) return;
    const { message, bubble, text, meta } = this.live;
    if (message.error) {
      bubble.dataset.error = "";
      text.textContent = message.error;
    } else {
      text.textContent = message.content;
    }
    meta.textContent = metaText(message);
    const atBottom = this.log.scrollHeight - this.log.scrollTop - this.log.clientHeight < 40;
    if (atBottom) this.log.scrollTop = this.log.scrollHeight;
  }

  save(now) {
    if (!now && performance.now() - this.lastSave < SAVE_EVERY_MS) return;
    this.lastSave = performance.now();
    try {
      localStorage.setItem(STORE_KEY, JSON.stringify(this.store));
    } catch {
      // Storage full or disabled: the conversation lives until the page closes.
    }
  }
}

function metaText(message) {
  if (message.role !== "assistant") return "";
  const parts = [];
  if (message.route) parts.push(`route ${routeText(message.route)}`);
  if (message.mode) parts.push(`mode ${message.mode}`);
  if (message.tokens) parts.push(`${message.tokens} tokens`);
  if (message.tokensPerSecond && !message.streaming) parts.push(`${num(message.tokensPerSecond)} tok/s`);
  if (message.stopped) parts.push("stopped");
  if (message.interrupted) parts.push("interrupted by a reload");
  return parts.join(" · ");
}

function loadStore() {
  let store = null;
  try {
    store = JSON.parse(localStorage.getItem(STORE_KEY) || "null");
  } catch {
    store = null;
  }
  if (!store || !Array.isArray(store.conversations)) store = { current: null, conversations: [] };
  // An answer cut off by a reload is kept as it was, never left "streaming".
  for (const conversation of store.conversations) {
    for (const message of conversation.messages || []) {
      if (message.streaming) {
        delete message.streaming;
        message.interrupted = true;
      }
    }
  }
  return store;
}

/** Calls onPayload with each JSON payload of an SSE body until [DONE] or the end. */
async function readEvents(body, onPayload) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = events.pop();
    for (const event of events) {
      const data = event
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      try {
        onPayload(JSON.parse(data));
      } catch (error) {
        if (!(error instanceof SyntaxError)) throw error;
      }
    }
  }
}
