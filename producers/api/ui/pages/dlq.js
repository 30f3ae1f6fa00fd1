// Dead letters: the list with each execution's error history, replay of one, of the ones
// ticked, or of every one the filter matches (each after a confirmation), and the progress
// of a replay: how many of the replayed executions have succeeded, died again or still run.

import { ApiError, api } from "../api.js";
import {
  clear, confirmDialog, errorText, fmtAgo, fmtNum, fmtTime, h, keptOpen, statusBadge, toast,
} from "../dom.js";
import { go, link } from "../nav.js";

const PAGE_SIZE = 50;

// dead letters whose error history the operator opened stay open across refreshes
const opened = new Set();
// the replay being followed; it outlives the page, so coming back still shows it
let progress = null;

export async function dlqPage(page) {
  const q = page.query;
  const filter = { name: q.get("name") || "", job_id: q.get("job_id") || "",
    pending: q.get("pending") === "1" };
  const cursor = q.get("cursor") || "";
  const selected = new Set();

  const nameInput = h("input", { type: "search", name: "name", value: filter.name,
    placeholder: "job name (exact)", "aria-label": "job name" });
  const jobInput = h("input", { type: "search", name: "job_id", value: filter.job_id,
    placeholder: "job id", "aria-label": "job id", size: 38 });
  const pendingBox = h("input", { type: "checkbox", name: "pending", checked: filter.pending });
  const form = h("form", { class: "filters", onsubmit: (ev) => {
    ev.preventDefault();
    go("/dlq", { name: nameInput.value.trim(), job_id: jobInput.value.trim(),
      pending: pendingBox.checked ? "1" : "" });
  } }, nameInput, jobInput, h("label", {}, pendingBox, "not replayed only"),
  h("button", { type: "submit", class: "primary" }, "Filter"),
  h("a", { href: "#/dlq", class: "button secondary" }, "Clear"));

  const replaySelected = h("button", { type: "button", class: "primary", disabled: true,
    "data-action": "replay-selected", onclick: () => replayIds([...selected]) },
  "Replay selected");
  const replayAll = h("button", { type: "button", class: "secondary",
    "data-action": "replay-matching", onclick: () => replayMatching() },
  "Replay all not yet replayed that match");
  const progressBox = h("div", { class: "progress-box", "data-testid": "replay-progress" });
  const table = h("div", { class: "table-wrap" });
  const pager = h("div", { class: "pager" });
  page.root.append(
    h("div", { class: "title-row" }, h("h1", {}, "Dead letters")),
    form, h("div", { class: "actions" }, replaySelected, replayAll), progressBox, table, pager);

  const syncButtons = () => {
    replaySelected.disabled = selected.size === 0;
    replaySelected.textContent = selected.size ? `Replay selected (${selected.size})`
      : "Replay selected";
  };

  async function replayIds(ids) {
    if (!ids.length) return;
    const ok = await confirmDialog(
      `Replay ${ids.length} dead execution${ids.length > 1 ? "s" : ""}?`,
      "Each runs again with its original request, as a new attempt of the same execution "
      + "(same idempotency key).", "Replay");
    if (!ok) return;
    const replayed = [];
    const failed = [];
    for (const executionId of ids) {
      try {
        replayed.push(...(await api.replayOne(executionId)).execution_ids);
      } catch (exc) {
        failed.push(`${executionId}: ${exc instanceof ApiError ? exc.message : exc}`);
      }
    }
    selected.clear();
    syncButtons();
    follow(replayed, failed);
  }

  async function replayMatching() {
    const body = {};
    if (filter.name) body.name = filter.name;
    if (filter.job_id) body.job_id = filter.job_id;
    const what = filter.name || filter.job_id ? "matching this filter" : "in the queue";
    const ok = await confirmDialog("Replay every dead letter not yet replayed?",
      `All dead executions ${what} that were not replayed yet run again (up to 1,000 at once).`,
      "Replay all");
    if (!ok) return;
    try {
      const answer = await api.replayMany(body);
      follow(answer.execution_ids, answer.skipped.map((x) => `${x.execution_id}: ${x.reason}`));
    } catch (exc) {
      toast(exc instanceof ApiError ? exc.message : String(exc), "error");
    }
  }

  function follow(ids, failed) {
    progress = { ids, failed, summary: null };
    toast(`${fmtNum(ids.length)} replayed`, "ok");
    load().catch((exc) => page.fail(exc));
  }

  async function load() {
    const answer = await api.dlq({ name: filter.name, job_id: filter.job_id,
      include_replayed: filter.pending ? "false" : "", limit: PAGE_SIZE, cursor });
    if (!page.alive) return;
    page.okay();
    await pollProgress();
    drawProgress(progressBox);
    clear(table, dlqTable(answer.items, selected, syncButtons, replayIds));
    clear(pager, 
      cursor ? h("a", { href: link("/dlq", { name: filter.name, job_id: filter.job_id,
        pending: filter.pending ? "1" : "" }) }, "first page") : "",
      " ",
      answer.next_cursor ? h("a", { class: "button secondary", href: link("/dlq", {
        name: filter.name, job_id: filter.job_id, pending: filter.pending ? "1" : "",
        cursor: answer.next_cursor }) }, "Older →") : "");
  }

  await page.every(3000, load);
}

/** Ask the API where the replays being followed are. */
async function pollProgress() {
  if (!progress || !progress.ids.length) return;
  const done = progress.summary;
  if (done && done.replayed > 0 && done.in_progress === 0) return;
  progress.summary = await api.replayProgress(progress.ids);
}

function drawProgress(box) {
  clear(box);
  if (!progress) return;
  const total = progress.ids.length;
  const sum = progress.summary || { succeeded: 0, dead: 0, other: 0, in_progress: total };
  const finished = sum.succeeded + sum.dead + sum.other;
  const bar = h("progress", { max: total || 1, value: finished });
  box.append(h("div", { class: "card progress" },
    h("strong", {}, `Replay of ${fmtNum(total)}: `),
    h("span", { "data-testid": "replay-summary" },
      `${fmtNum(sum.succeeded)} succeeded, ${fmtNum(sum.dead)} dead again, `
      + `${fmtNum(sum.in_progress)} in progress`),
    bar,
    progress.failed.length ? h("details", {}, h("summary", {}, `${progress.failed.length} not replayed`),
      h("ul", {}, progress.failed.map((f) => h("li", {}, f)))) : null,
    sum.executions?.length === 1
      ? h("a", { href: `#/jobs/${sum.executions[0].job_id}` }, "its job") : null,
    h("button", { type: "button", class: "link", onclick: () => { progress = null; clear(box); } },
      "dismiss")));
}

function errorHistory(errors) {
  return h("ol", { class: "error-history" }, errors.map((e) => h("li", {},
    h("span", { class: "muted" }, `attempt ${e.attempt}`),
    e.at_ms ? h("span", { class: "muted" }, ` · ${fmtTime(e.at_ms)}`) : null,
    e.worker_id ? h("span", { class: "muted" }, ` · ${e.worker_id}`) : null,
    h("div", { class: "error" }, errorText(e.error)))));
}

function dlqTable(items, selected, changed, replayIds) {
  if (!items.length) return h("p", { class: "muted empty" }, "The dead-letter queue is empty.");
  const all = h("input", { type: "checkbox", "aria-label": "select all", onchange: () => {
    items.forEach((d) => {
      if (d.replayed_at) return;
      if (all.checked) selected.add(d.execution_id);
      else selected.delete(d.execution_id);
    });
    document.querySelectorAll("input[data-select]").forEach((box) => {
      if (!box.disabled) box.checked = all.checked;
    });
    changed();
  } });
  return h("table", { class: "list", "data-testid": "dlq-table" },
    h("thead", {}, h("tr", {}, h("th", {}, all), ["job", "dead", "attempts", "last error",
      "replayed", ""].map((c) => h("th", {}, c)))),
    h("tbody", {}, items.flatMap((d) => {
      const last = d.errors[d.errors.length - 1];
      return [
        h("tr", { "data-execution-id": d.execution_id },
          h("td", {}, h("input", { type: "checkbox", "data-select": d.execution_id,
            "aria-label": "select", checked: selected.has(d.execution_id), disabled: !!d.replayed_at,
            onchange: (ev) => {
              if (ev.target.checked) selected.add(d.execution_id);
              else selected.delete(d.execution_id);
              changed();
            } })),
          h("td", { class: "name" }, h("a", { href: `#/jobs/${d.job_id}` }, d.name)),
          h("td", { title: fmtTime(d.dead_at) }, fmtAgo(d.dead_at)),
          h("td", {}, String(d.attempts)),
          h("td", { class: "error" }, last ? errorText(last.error) : "—"),
          h("td", {}, d.replayed_at ? [statusBadge("replayed"), " ",
            h("span", { class: "muted" }, fmtAgo(d.replayed_at))] : "—"),
          h("td", {}, h("button", { type: "button", class: "secondary small",
            "data-action": "replay", onclick: () => replayIds([d.execution_id]) },
          d.replayed_at ? "Replay again" : "Replay"))),
        h("tr", { class: "detail" }, h("td", { colspan: 7 }, keptOpen(opened, d.execution_id,
          [`error history (${d.errors.length}), execution `, h("code", {}, d.execution_id)],
          errorHistory(d.errors)))),
      ];
    })));
}
