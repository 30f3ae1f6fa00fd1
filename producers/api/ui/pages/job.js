// One job: its definition, next runs, pause / resume / cancel / trigger, and its executions
// (every attempt with timings, lateness, worker and error), refreshed every 3 s.

import { ApiError, api } from "../api.js";
import {
  clear, confirmDialog, dagTag, durationMs, errorText, fmtAgo, fmtMs, fmtTime, h, jsonBlock,
  keptOpen, lifecycleBadge, schedule, statusBadge, toast,
} from "../dom.js";
import { redactTarget } from "../redact.js";

const EXEC_PAGE = 25;
// which commands make sense from a status (the API refuses the rest with 409)
const ALLOWED = {
  pause: (st) => !["paused", "cancelled"].includes(st),
  resume: (st) => st === "paused",
  trigger: (st) => st !== "cancelled",
  cancel: (st) => st !== "cancelled",
};

function field(label, value) {
  return [h("dt", {}, label), h("dd", {}, value)];
}

export async function jobPage(page) {
  const [jobId] = page.params;
  const head = h("div", { class: "title-row" });
  const actions = h("div", { class: "actions", "data-testid": "job-actions" });
  const definition = h("div", { class: "card" });
  const nextRuns = h("div", { class: "card" });
  const executions = h("div", { class: "card" });
  page.root.append(
    h("p", { class: "crumbs" }, h("a", { href: "#/jobs" }, "Jobs"), " / ", h("span", {}, jobId)),
    head, actions,
    h("div", { class: "grid2 wide-left" }, definition, nextRuns),
    executions,
  );
  let shown = EXEC_PAGE;
  let job = null;

  const refresh = async () => {
    const [j, execs, upcoming] = await Promise.all([
      api.job(jobId),
      api.executions(jobId, { limit: shown }),
      fetchNextRuns(jobId),
    ]);
    if (!page.alive) return;
    page.okay();
    job = j;
    drawHead(head, j);
    drawActions(actions, j, command);
    drawDefinition(definition, j);
    drawNextRuns(nextRuns, j, upcoming);
    drawExecutions(executions, execs, () => { shown += EXEC_PAGE; refresh(); });
  };

  async function command(kind) {
    if (kind === "cancel" && !(await confirmDialog(`Cancel ${job.name}?`,
      "No further runs will fire; a running execution finishes. This cannot be undone.",
      "Cancel job"))) return;
    try {
      await api.command(jobId, kind);
      toast(`${kind} sent to ${job.name}`, "ok");
    } catch (exc) {
      toast(exc instanceof ApiError ? exc.message : String(exc), "error");
    }
    refresh().catch((exc) => page.fail(exc));
  }

  await page.every(3000, refresh);
}

async function fetchNextRuns(jobId) {
  try {
    return (await api.nextRuns(jobId, { count: 5 })).next_runs;
  } catch (exc) {
    if (exc instanceof ApiError && exc.status === 401) throw exc;
    return null; // the job's next_run_at still shows
  }
}

// The job's lifecycle (what it is) and its last run's outcome, shown apart: a cron job whose
// manual trigger failed is "active", last run "dead"
function drawHead(head, job) {
  const outcome = job.last_outcome || job.last_execution?.status;
  clear(head,
    h("h1", { class: "job-name" }, job.name),
    lifecycleBadge(job.lifecycle),
    h("span", { class: `prio prio-${job.priority}` }, job.priority),
    h("span", { class: "last-outcome muted", "data-testid": "last-outcome" }, "last run: ",
      outcome ? statusBadge(outcome) : h("span", {}, "none yet")),
    job.dag ? dagTag(job.dag) : null,
  );
}

function drawActions(box, job, command) {
  clear(box, ...["pause", "resume", "trigger", "cancel"].map((kind) => h("button", {
    type: "button",
    class: kind === "cancel" ? "danger" : "secondary",
    "data-action": kind,
    disabled: !ALLOWED[kind](job.status),
    onclick: () => command(kind),
  }, kind[0].toUpperCase() + kind.slice(1))));
}

function drawDefinition(card, job) {
  const dag = job.dag ? dagField(job.dag) : null;
  clear(card, 
    h("h2", {}, "Definition"),
    h("dl", { class: "kv" },
      field("job id", h("code", {}, job.job_id)),
      field("current occurrence", [statusBadge(job.status), " ",
        h("span", { class: "muted" }, "the status of the run now due or going")]),
      field("schedule", schedule(job.schedule)),
      field("target", jsonBlock(redactTarget(job.target))),
      field("retry", `${job.retry.max_retries} retries, ${job.retry.base_delay_s} s base, `
        + `${job.retry.max_delay_s} s cap${job.retry.jitter ? ", jitter" : ""}`),
      field("timeout", `${job.timeout_s} s`),
      field("start within", job.start_within_s == null ? "no limit"
        : `${job.start_within_s} s of its due time, else expired`),
      field("misfire / overlap", `${job.misfire} / ${job.overlap}`),
      Object.keys(job.labels || {}).length ? field("labels", jsonBlock(job.labels)) : null,
      dag ? field("DAG", dag) : null,
      job.depends_on.length ? field("depends on", job.depends_on.join(", ")) : null,
      field("created", `${fmtTime(job.created_at)} (${fmtAgo(job.created_at)})`),
      field("updated", fmtTime(job.updated_at)),
    ),
    h("h3", {}, "Payload"),
    job.payload_omitted ? h("p", { class: "muted" }, job.payload_omitted)
      : job.payload === null || job.payload === undefined ? h("p", { class: "muted" }, "none")
        : jsonBlock(job.payload),
  );
}

function dagField(dag) {
  const target = `#/dags/${encodeURIComponent(dag.dag_id)}`;
  if (dag.role === "trigger") {
    return [h("a", { href: target, class: "dag-link" }, `DAG ${dag.dag_id}`),
      h("span", { class: "muted" }, " (this job starts its runs)")];
  }
  return [h("a", { href: target, class: "dag-link" }, `${dag.key} in DAG ${dag.dag_id}`),
    dag.dag_run_id ? [" · ", h("a", { class: "dag-run-link",
      href: `${target}?run=${encodeURIComponent(dag.dag_run_id)}` },
    `run ${dag.dag_run_id.slice(0, 8)}`)] : null];
}

function drawNextRuns(card, job, runs) {
  const list = runs || (job.next_run_at ? [job.next_run_at] : []);
  clear(card, 
    h("h2", {}, "Next runs"),
    list.length
      ? h("ol", { class: "next-runs" }, list.map((t) => h("li", {}, fmtTime(t), " ",
        h("span", { class: "muted" }, fmtAgo(t)))))
      : h("p", { class: "muted" }, job.status === "paused" ? "none while paused"
        : "none scheduled"),
  );
}

export function attemptsTable(attempts) {
  return h("table", { class: "attempts" },
    h("thead", {}, h("tr", {}, ["attempt", "status", "started", "finished", "took", "worker",
      "error"].map((c) => h("th", {}, c)))),
    h("tbody", {}, attempts.map((a) => h("tr", {},
      h("td", {}, String(a.attempt)),
      h("td", {}, statusBadge(a.status)),
      h("td", {}, fmtTime(a.started_at)),
      h("td", {}, fmtTime(a.finished_at)),
      h("td", {}, fmtMs(durationMs(a.started_at, a.finished_at))),
      h("td", {}, a.worker_id || "—"),
      h("td", { class: "error" }, errorText(a.error))))));
}

// executions whose attempts the operator opened stay open across refreshes
const opened = new Set();

function drawExecutions(card, page, more) {
  const rows = page.items.flatMap((e) => {
    const main = h("tr", { "data-execution-id": e.execution_id, "data-status": e.status },
      h("td", {}, h("a", { href: `#/executions/${encodeURIComponent(e.execution_id)}`,
        class: "execution-link", title: "output, traceback and attempts" },
      fmtTime(e.scheduled_at))),
      h("td", {}, statusBadge(e.status)),
      h("td", {}, String(e.attempt)),
      h("td", {}, e.trigger || "—", e.dag_id && e.dag_run_id ? [" · ", h("a", {
        class: "execution-run-link", title: "the DAG run this execution belongs to",
        href: `#/dags/${encodeURIComponent(e.dag_id)}?run=${encodeURIComponent(e.dag_run_id)}`,
      }, `run ${e.dag_run_id.slice(0, 8)}`)] : null),
      h("td", {}, fmtMs(e.lateness_ms)),
      h("td", {}, fmtMs(durationMs(e.started_at, e.finished_at))),
      h("td", {}, e.worker_id || "—"),
      h("td", { class: "error" }, errorText(e.error)));
    const detail = h("tr", { class: "detail" }, h("td", { colspan: 8 },
      keptOpen(opened, e.execution_id,
        [`${e.attempts.length} attempt(s), execution `, h("code", {}, e.execution_id)],
        attemptsTable(e.attempts))));
    return [main, detail];
  });
  clear(card, 
    h("h2", {}, "Executions"),
    page.items.length
      ? h("table", { class: "list", "data-testid": "executions-table" },
        h("thead", {}, h("tr", {}, ["scheduled", "status", "attempts", "trigger", "lateness",
          "took", "worker", "error"].map((c) => h("th", {}, c)))),
        h("tbody", {}, rows))
      : h("p", { class: "muted" }, "No executions yet."),
    page.next_cursor ? h("button", { type: "button", class: "secondary", onclick: more },
      "Show more") : null,
  );
}
