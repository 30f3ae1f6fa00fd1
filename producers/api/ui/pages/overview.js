// Overview: jobs by status, executions per minute by outcome, start lateness p50/p99 over
// time, dead-letter depth and consumer lag per queue and priority, refreshed every 5 s.

import { api } from "../api.js";
import { hBars, lineChart, stackedBars } from "../charts.js";
import { clear, fmtMs, fmtNum, h } from "../dom.js";
import { go } from "../nav.js";

const RANGES = {
  "15m": { window_s: 900, bucket_s: 15, label: "15 min" },
  "1h": { window_s: 3600, bucket_s: 60, label: "1 h" },
  "6h": { window_s: 21600, bucket_s: 300, label: "6 h" },
  "24h": { window_s: 86400, bucket_s: 900, label: "24 h" },
};
const STATUSES = ["pending", "queued", "running", "success", "failed", "dead", "blocked",
  "skipped", "paused", "cancelled", "expired"];
const PRIORITIES = ["critical", "high", "normal", "low"];
const LAG_SAMPLES = 120;

// consumer lag has no history on the server: the page keeps what it saw since it opened
const lagHistory = [];

function stat(label, value, extra = {}) {
  const body = extra.href ? h("a", { href: extra.href }, value) : value;
  return h("div", { class: `card stat ${extra.class || ""}`, "data-stat": extra.name },
    h("div", { class: "stat-value" }, body), h("div", { class: "stat-label" }, label));
}

export async function overviewPage(page) {
  const rangeKey = RANGES[page.query.get("range")] ? page.query.get("range") : "15m";
  const range = RANGES[rangeKey];
  const picker = h("div", { class: "segmented", role: "group", "aria-label": "time range" },
    Object.entries(RANGES).map(([key, r]) => h("button", {
      type: "button", class: key === rangeKey ? "on" : "",
      onclick: () => go("/", { range: key }),
    }, r.label)));
  const stats = h("div", { class: "stats" });
  const charts = h("div", { class: "grid2" });
  const lagCard = h("div", { class: "card", "data-testid": "lag-card" });
  page.root.append(h("div", { class: "title-row" }, h("h1", {}, "Overview"), picker), stats, charts,
    lagCard);

  await page.every(5000, async () => {
    const [overview, series, lag] = await Promise.all([
      api.overview(),
      api.executionStats({ window_s: range.window_s, bucket_s: range.bucket_s }),
      api.lag().catch(() => null), // Kafka briefly unreachable: the rest still shows
    ]);
    if (!page.alive) return;
    page.okay();
    if (lag) {
      lagHistory.push({ t: Date.parse(lag.at), lag });
      while (lagHistory.length > LAG_SAMPLES) lagHistory.shift();
    }
    draw(stats, charts, overview, series, lag, range);
    drawLagTable(lagCard, lag);
  });
}

// The lag per queue, each with its priorities. An API from before queues answers the default
// queue's priorities only (and counted transaction markers): shown as the one queue it has.
function lagQueues(lag) {
  if (!lag) return [];
  if (lag.queues && lag.queues.length) return lag.queues;
  return [{ queue: "default", lag: lag.priorities.reduce((n, p) => n + p.lag, 0),
    priorities: lag.priorities }];
}

function priorityLag(lag, priority) {
  const rows = lagQueues(lag).flatMap((q) => q.priorities.filter((p) => p.priority === priority));
  return rows.length ? rows.reduce((n, p) => n + p.lag, 0) : null;
}

function lagNote(lag) {
  if (!lag) return "";
  if (!lag.queues) {
    return "End offsets minus the group's committed offsets: at rest up to one per partition "
      + "remains, the marker of the last transaction.";
  }
  const rough = lagQueues(lag).some((q) => q.priorities.some((p) => p.exact === false));
  return "Execution requests the worker group has not consumed yet (transaction markers are "
    + `not counted)${rough ? "; approximate where a partition's backlog was too large to read"
      : ""}.`;
}

function drawLagTable(card, lag) {
  const queues = lagQueues(lag);
  clear(card,
    h("h2", {}, `Consumer lag per queue and priority${lag ? ` (group ${lag.group})` : ""}`),
    !lag ? h("p", { class: "muted" }, "Kafka did not answer.")
      : h("table", { class: "list", "data-testid": "lag-table" },
        h("thead", {}, h("tr", {}, ["queue", ...PRIORITIES, "total"].map((c) => h("th", {}, c)))),
        h("tbody", {}, queues.map((q) => h("tr", { "data-queue": q.queue },
          h("td", { class: "name" }, q.queue),
          PRIORITIES.map((p) => {
            const row = q.priorities.find((x) => x.priority === p);
            return h("td", { "data-priority": p, class: row && row.lag ? "" : "muted" },
              row ? fmtNum(row.lag) : "—");
          }),
          h("td", { "data-total": "" }, fmtNum(q.lag)))))),
    lag ? h("p", { class: "chart-note" }, lagNote(lag)) : null,
  );
}

function draw(stats, charts, overview, series, lag, range) {
  const by = overview.jobs_by_status;
  const perMinute = 60 / series.bucket_s;
  const buckets = series.buckets.map((b) => ({ t: Date.parse(b.start), ...b }));
  const finished = buckets.reduce((n, b) => n + b.outcomes.success + b.outcomes.failed
    + b.outcomes.dead, 0);
  const totalLag = lag ? lagQueues(lag).reduce((n, q) => n + q.lag, 0) : null;
  clear(stats, 
    stat("jobs", fmtNum(overview.jobs_total), { href: "#/jobs", name: "jobs" }),
    stat("running", fmtNum(by.running || 0), { href: "#/jobs?status=running", name: "running" }),
    stat(`executions finished (${range.label})`, fmtNum(finished), { name: "finished" }),
    stat("dead letters to replay", fmtNum(overview.dlq_depth), {
      href: "#/dlq", name: "dlq", class: overview.dlq_depth ? "warn" : "",
    }),
    stat("consumer lag", totalLag === null ? "—" : fmtNum(totalLag), { name: "lag" }),
  );
  clear(charts, 
    stackedBars({
      title: `Executions per minute by outcome (${range.label}, ${series.bucket_s} s buckets)`,
      buckets: buckets.map((b) => ({
        t: b.t,
        values: Object.fromEntries(Object.entries(b.outcomes).map(([k, v]) => [k, v * perMinute])),
      })),
      keys: [
        { key: "success", label: "success" },
        { key: "failed", label: "failed (will retry)" },
        { key: "dead", label: "dead" },
      ],
      yFormat: (v) => (v >= 10 || v === 0 ? fmtNum(Math.round(v)) : v.toFixed(1)),
      emptyText: "no execution finished in this range",
    }),
    lineChart({
      title: "Start lateness (start − scheduled time)",
      series: [
        { key: "p50", label: "p50", points: buckets.map((b) => ({ t: b.t, v: b.lateness_p50_ms })) },
        { key: "p99", label: "p99", points: buckets.map((b) => ({ t: b.t, v: b.lateness_p99_ms })) },
      ],
      yFormat: fmtMs,
      emptyText: "no execution started in this range",
    }),
    hBars({
      title: "Jobs by status",
      items: STATUSES.filter((st) => by[st]).map((st) => ({
        key: st, label: st, value: by[st], href: `#/jobs?status=${st}`,
      })),
      emptyText: "no jobs yet",
    }),
    lineChart({
      title: "Consumer lag per priority, every queue (worker group, since this page opened)",
      series: PRIORITIES.map((p) => ({
        key: p, label: lagLabel(lag, p),
        points: lagHistory.map((s) => ({ t: s.t, v: priorityLag(s.lag, p) })),
      })),
      yFormat: (v) => (Number.isInteger(v) ? fmtNum(v) : v.toFixed(1)),
      emptyText: lag ? "collecting…" : "Kafka did not answer",
      // the table below says what is counted; an API from before queues needs the warning here
      note: lag && !lag.queues ? lagNote(lag) : "",
    }),
  );
}

function lagLabel(lag, priority) {
  const n = priorityLag(lag, priority);
  return n === null ? priority : `${priority}: ${fmtNum(n)}`;
}
