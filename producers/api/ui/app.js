// The dashboard's shell: a hash router (#/jobs/<id>?x=y), the sign-in form for APIs with
// bearer tokens, and a page lifecycle whose timers stop when the operator navigates away.

import { ApiError, onUnauthorized, request, setToken, token } from "./api.js";
import { clear, h } from "./dom.js";
import { parseHash } from "./nav.js";
import { clusterPage } from "./pages/cluster.js";
import { dagPage } from "./pages/dag.js";
import { dagsPage } from "./pages/dags.js";
import { dlqPage } from "./pages/dlq.js";
import { executionPage } from "./pages/execution.js";
import { jobPage } from "./pages/job.js";
import { jobsPage } from "./pages/jobs.js";
import { overviewPage } from "./pages/overview.js";

const ROUTES = [
  [/^\/$/, "overview", overviewPage],
  [/^\/jobs$/, "jobs", jobsPage],
  [/^\/jobs\/([^/]+)$/, "jobs", jobPage],
  [/^\/executions\/([^/]+)$/, "jobs", executionPage],
  [/^\/dags$/, "dags", dagsPage],
  [/^\/dags\/([^/]+)$/, "dags", dagPage],
  [/^\/dlq$/, "dlq", dlqPage],
  [/^\/cluster$/, "cluster", clusterPage],
];

/** What a page gets: its root, the hash's params, timers that end with the page. */
class Page {
  constructor(root, params, query) {
    this.root = root;
    this.params = params;
    this.query = query;
    this.timers = [];
    this.alive = true;
  }

  /** Run fn now and then every ms while the page is shown (not twice at once). */
  every(ms, fn) {
    let running = false;
    const tick = async () => {
      if (!this.alive || running || document.hidden) return;
      running = true;
      try { await fn(); } catch (exc) { this.fail(exc); } finally { running = false; }
    };
    this.timers.push(setInterval(tick, ms));
    return tick();
  }

  /** Show an error where the page is (a 401 shows the sign-in form instead). */
  fail(exc) {
    if (!this.alive) return;
    if (exc instanceof ApiError && exc.status === 401) return;
    let box = this.root.querySelector(":scope > .page-error");
    if (!box) {
      box = h("div", { class: "page-error", role: "alert" });
      this.root.prepend(box);
    }
    box.textContent = exc instanceof ApiError ? `${exc.message} (${exc.code})` : String(exc);
  }

  okay() {
    this.root.querySelector(":scope > .page-error")?.remove();
  }

  end() {
    this.alive = false;
    this.timers.forEach(clearInterval);
  }
}

let current = null;

async function render() {
  const view = document.getElementById("view");
  current?.end();
  const { path, query } = parseHash();
  const match = ROUTES.map(([re, nav, page]) => [path.match(re), nav, page]).find(([m]) => m);
  document.querySelectorAll("[data-nav]").forEach((a) => {
    a.classList.toggle("active", !!match && a.dataset.nav === match[1]);
  });
  clear(view);
  if (!match) {
    view.append(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/" }, "Overview")));
    return;
  }
  const [m, , page] = match;
  const root = h("div", { class: "page" });
  view.append(root);
  current = new Page(root, m.slice(1).map(decodeURIComponent), query);
  try {
    await page(current);
  } catch (exc) {
    current.fail(exc);
  }
}

function signIn(message) {
  current?.end();
  const shown = document.querySelector("form.signin .message");
  if (shown) { // several requests were refused at once, or a wrong token was typed
    shown.textContent = message;
    return;
  }
  const view = clear(document.getElementById("view"));
  const input = h("input", {
    type: "password", name: "token", id: "token", autocomplete: "off", required: true,
    placeholder: "bearer token", minLength: 16,
  });
  const form = h("form", {
    class: "card signin",
    onsubmit: async (ev) => {
      ev.preventDefault();
      setToken(input.value.trim());
      try {
        await request("GET", "/v1/stats/overview");
        session();
        render();
      } catch (exc) {
        setToken("");
        if (!(exc instanceof ApiError && exc.status === 401)) signIn(exc.message);
      }
    },
  },
  h("h1", {}, "Sign in"),
  h("p", { class: "message" }, message),
  h("label", { for: "token" }, "API token"),
  input,
  h("button", { type: "submit", class: "primary" }, "Sign in"));
  view.append(form);
  input.focus();
}

function session() {
  const box = clear(document.getElementById("session"));
  if (token()) {
    box.append(h("button", {
      type: "button", class: "link", onclick: () => { setToken(""); session(); render(); },
    }, "Sign out"));
  }
}

onUnauthorized.add(() => {
  const had = token();
  setToken("");
  session();
  signIn(had ? "That token was refused. Enter one of the API's tokens (DUETIME_API_TOKENS)."
    : "This API needs a bearer token (DUETIME_API_TOKENS is set).");
});

window.addEventListener("hashchange", render);
window.addEventListener("DOMContentLoaded", () => {
  session();
  render();
});
