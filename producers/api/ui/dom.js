// DOM helpers. Everything the dashboard shows is built here with createElement and
// textContent: user data (job names, payloads, error messages) is never parsed as HTML.

import { redactText } from "./redact.js";

const SVG_NS = "http://www.w3.org/2000/svg";

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function setProps(el, props, svg) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.setAttribute("class", value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = String(value);
    else if (!svg && key in el && typeof value !== "string") el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

/** h("a", {href: "#/jobs", class: "x"}, "text", child, ...) → an element. */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  setProps(el, props, false);
  return append(el, children);
}

/** The same for SVG elements. */
export function s(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setProps(el, props, true);
  return append(el, children);
}

/** Empty el, then fill it with children (null, undefined and false are left out). */
export function clear(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

// --- formatting ------------------------------------------------------------------------------

export function fmtTime(value) {
  if (!value) return "—";
  const d = new Date(value);
  if (Number.isNaN(d.getTime())) return String(value);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z").replace(/Z$/, " UTC");
}

export function fmtAgo(value, now = Date.now()) {
  if (!value) return "";
  const diff_s = (now - new Date(value).getTime()) / 1000;
  const abs = Math.abs(diff_s);
  const unit =
    abs < 60 ? `${Math.round(abs)} s` : abs < 3600 ? `${Math.round(abs / 60)} min`
      : abs < 86400 ? `${Math.round(abs / 3600)} h` : `${Math.round(abs / 86400)} d`;
  return diff_s >= 0 ? `${unit} ago` : `in ${unit}`;
}

export function fmtMs(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  return `${(ms / 60000).toFixed(1)} min`;
}

export function fmtNum(n) {
  return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US");
}

export function durationMs(start, end) {
  if (!start || !end) return null;
  return new Date(end).getTime() - new Date(start).getTime();
}

export function schedule(value) {
  if (!value) return "manual (trigger only)";
  if (value.at) return `once at ${fmtTime(value.at)}`;
  const tz = value.timezone && value.timezone !== "UTC" ? ` (${value.timezone})` : " (UTC)";
  return `cron ${value.cron}${tz}`;
}

export function statusBadge(status) {
  return h("span", { class: `badge st-${String(status || "none").replace(/[^a-z_]/g, "")}` },
    status || "—");
}

const LIFECYCLE_TITLES = {
  active: "it fires, or may be triggered",
  paused: "it does not fire until resumed",
  cancelled: "no further runs",
  completed: "nothing more will fire",
  deleted: "deleted: hidden from lists",
};

/** What a job is (active, paused, ...), apart from how its last run ended. */
export function lifecycleBadge(lifecycle) {
  const value = String(lifecycle || "active").replace(/[^a-z_]/g, "");
  return h("span", { class: `badge lifecycle lc-${value}`, title: LIFECYCLE_TITLES[value] || "",
    "data-lifecycle": value }, value);
}

// A DAG run's own statuses: its "failed" is final (a job ended dead or expired), so it takes
// the colour the legend gives "dead", not that of a job's "failed (will retry)"
const RUN_COLOURS = { running: "running", success: "success", failed: "dead",
  cancelled: "cancelled" };

export function runBadge(status) {
  const colour = RUN_COLOURS[status] || "none";
  return h("span", { class: `badge run-status st-${colour}`, "data-run-status": status || "",
    title: status === "failed" ? "failed: a job ended dead or expired (final)" : "" },
  status || "—");
}

/** "DAG member <key>" / "DAG trigger", linked to the DAG (and a member's run). */
export function dagTag(dag) {
  if (!dag) return null;
  const query = dag.dag_run_id ? `?run=${encodeURIComponent(dag.dag_run_id)}` : "";
  const label = dag.role === "trigger" ? "DAG trigger" : `DAG: ${dag.key || "member"}`;
  return h("a", { class: `dag-tag dag-${dag.role}`, "data-dag-role": dag.role,
    href: `#/dags/${encodeURIComponent(dag.dag_id)}${query}`,
    title: dag.role === "trigger" ? "starts the runs of its DAG (carries its schedule)"
      : "a job of a DAG: runs when its upstreams succeeded in a run" }, label);
}

/** Pretty JSON shown as text. */
export function jsonBlock(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

export function errorText(error) {
  if (!error) return "";
  if (typeof error === "string") {
    try { return errorText(JSON.parse(error)); } catch { return redactText(error); }
  }
  const status = error.http_status ? ` (HTTP ${error.http_status})` : "";
  return redactText(`${error.type || "error"}: ${error.message || ""}${status}`);
}

/** A <details> that stays open across re-renders while its id is in openIds. */
export function keptOpen(openIds, id, summary, ...body) {
  return h("details", {
    open: openIds.has(id),
    ontoggle: (ev) => (ev.target.open ? openIds.add(id) : openIds.delete(id)),
  }, h("summary", {}, summary), ...body);
}

/** A <dialog> asking to confirm; resolves true or false. */
export function confirmDialog(title, body, okLabel = "Confirm") {
  return new Promise((resolve) => {
    const dialog = h("dialog", { class: "confirm", "aria-label": title },
      h("h3", {}, title),
      h("p", {}, body),
      h("div", { class: "actions" },
        h("button", { type: "button", class: "secondary", onclick: () => finish(false) }, "Cancel"),
        h("button", { type: "button", class: "primary", onclick: () => finish(true) }, okLabel),
      ),
    );
    function finish(answer) {
      dialog.close();
      dialog.remove();
      resolve(answer);
    }
    dialog.addEventListener("cancel", () => finish(false));
    document.body.append(dialog);
    dialog.showModal();
  });
}

/** A transient message at the top of the page. */
export function toast(message, kind = "info") {
  const box = document.getElementById("toasts");
  const el = h("div", { class: `toast ${kind}`, role: "status" }, message);
  box.append(el);
  setTimeout(() => el.remove(), 6000);
}
