// The dashboard's websocket: reconnects with back-off after a drop, and every
// (re)connection starts from the snapshot the server sends first.

const FIRST_DELAY = 0.5;
const MAX_DELAY = 10;

export class LiveSocket {
  constructor({ url, onMessage, statusElement, sessionCheckUrl }) {
    this.url = url;
    this.onMessage = onMessage;
    this.statusElement = statusElement;
    this.sessionCheckUrl = sessionCheckUrl;
    this.attempt = 0;
    this.socket = null;
  }

  start() {
    this.connect();
  }

  connect() {
    this.status("connecting", "connecting…");
    const socket = new WebSocket(this.url);
    this.socket = socket;
    let opened = false;
    socket.addEventListener("open", () => {
      opened = true;
      this.attempt = 0;
      this.status("live", "live");
    });
    socket.addEventListener("message", (event) => {
      let message;
      try {
        message = JSON.parse(event.data);
      } catch {
        return;
      }
      this.onMessage(message);
    });
    socket.addEventListener("close", () => {
      if (this.socket !== socket) return;
      this.socket = null;
      if (opened) this.retry();
      else this.checkSessionThenRetry();
    });
  }

  retry() {
    const base = Math.min(MAX_DELAY, FIRST_DELAY * 2 ** this.attempt);
    const delay = base * (0.75 + Math.random() * 0.5);
    this.attempt += 1;
    this.status("offline", `reconnecting in ${Math.ceil(delay)} s`);
    setTimeout(() => this.connect(), delay * 1000);
  }

  // A socket refused before it opened may mean the session ended: then the
  // page itself redirects, and the sign-in page is where to go.
  async checkSessionThenRetry() {
    try {
      const response = await fetch(this.sessionCheckUrl, {
        method: "HEAD",
        redirect: "manual",
        credentials: "same-origin",
        cache: "no-store",
      });
      if (response.type === "opaqueredirect" || response.status === 401 || response.status === 403) {
        this.status("offline", "signed out");
        window.location.assign(this.sessionCheckUrl);
        return;
      }
    } catch {
      // The tracker is unreachable: keep retrying.
    }
    this.retry();
  }

  status(state, text) {
    this.statusElement.dataset.state = state;
    this.statusElement.textContent = text;
  }
}
