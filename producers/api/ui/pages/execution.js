// One execution (#/executions/<id>): its status and timings, what the latest attempt returned,
// the traceback of a Python task that raised, and every attempt with its error; refreshed every
// 3 s until the execution has finished. Output and traceback are text nodes (dom.js), never
// markup; the traceback was redacted by the worker and is redacted again here as errors are.

import { api } from "../api.js";
import {
  clear, durationMs, errorText, fmtMs, fmtTime, h, jsonBlock, statusBadge,
} from "../dom.js";
import { redactText } from "../redact.js";
import { attemptsTable } from "./job.js";

const FINISHED = new Set(["success", "dead", "skipped", "cancelled", "expired"]);

function field(label, value) {
  return [h("dt", {}, label), h("dd", {}, value)];
}

export async function executionPage(page) {
  const [executionId] = page.params;
  const head = h("div", { class: "title-row" });
  const summary = h("div", { class: "card" });
  const output = h("div", { class: "card", "data-testid": "execution-output" });
  const traceback = h("div", { class: "card", "data-testid": "execution-traceback" });
  const attempts = h("div", { class: "card" });
  const crumbs = h("p", { class: "crumbs" }, h("a", { href: "#/jobs" }, "Jobs"));
  page.root.append(crumbs, head, h("div", { class: "grid2" }, summary, output), traceback,
    attempts);
  let done = false;

  const refresh = async () => {
    if (done) return;
    const e = await api.execution(executionId);
    if (!page.alive) return;
    page.okay();
    clear(crumbs, h("a", { href: "#/jobs" }, "Jobs"), " / ",
      h("a", { href: `#/jobs/${encodeURIComponent(e.job_id)}` }, e.name), " / ",
      h("span", {}, e.execution_id));
    clear(head, h("h1", { class: "execution-name" }, e.name), statusBadge(e.status));
    drawSummary(summary, e);
    drawOutput(output, e);
    drawTraceback(traceback, e);
    drawAttempts(attempts, e);
    done = FINISHED.has(e.status);
  };

  await page.every(3000, refresh);
}

function drawSummary(card, e) {
  clear(card,
    h("h2", {}, "Execution"),
    h("dl", { class: "kv" },
      field("execution id", h("code", {}, e.execution_id)),
      field("scheduled", fmtTime(e.scheduled_at)),
      field("attempt", String(e.attempt)),
      field("trigger", e.trigger || "—"),
      field("started", fmtTime(e.started_at)),
      field("finished", fmtTime(e.finished_at)),
      field("took", fmtMs(durationMs(e.started_at, e.finished_at))),
      field("lateness", fmtMs(e.lateness_ms)),
      field("worker", e.worker_id || "—"),
      e.error ? field("error", h("span", { class: "error" }, errorText(e.error))) : null,
    ),
  );
}

function drawOutput(card, e) {
  let body;
  if (e.output_omitted) body = h("p", { class: "muted" }, e.output_omitted);
  else if (e.output === null || e.output === undefined) {
    body = h("p", { class: "muted" }, "none");
  } else body = jsonBlock(e.output);
  clear(card, h("h2", {}, "Output"), body);
}

function drawTraceback(card, e) {
  clear(card,
    h("h2", {}, "Traceback"),
    e.traceback
      ? h("pre", { class: "traceback" }, redactText(e.traceback))
      : h("p", { class: "muted" }, e.status === "success" ? "none: it succeeded"
        : "none (only a Python task that raised has one)"),
  );
}

function drawAttempts(card, e) {
  clear(card, h("h2", {}, "Attempts"), attemptsTable(e.attempts || []));
}
