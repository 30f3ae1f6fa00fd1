// One DAG: its graph, drawn with every node coloured by its status in the chosen run (the
// latest by default), the list of runs, a button to start a run now, and one to repair the
// chosen run when it failed (its dead jobs run again, the skipped ones after them).

import { ApiError, api } from "../api.js";
import {
  clear, fmtAgo, fmtMs, durationMs, fmtTime, h, runBadge, schedule, toast,
} from "../dom.js";
import { dagGraph } from "../graph.js";
import { link } from "../nav.js";

// every status a node can have in a run; "failed" is a job's failed attempt with a retry
// coming, "dead" its final failure (the colour of a failed run too: runBadge)
const LEGEND = [["blocked"], ["pending"], ["queued"], ["running"], ["success"],
  ["failed", "failed (will retry)"], ["dead", "dead (final)"], ["expired"], ["skipped"],
  ["cancelled"]];

export async function dagPage(page) {
  const [dagId] = page.params;
  const chosen = page.query.get("run");
  const head = h("div", { class: "title-row" });
  const graph = h("div", { class: "card graph-card" });
  const runs = h("div", { class: "card" });
  page.root.append(
    h("p", { class: "crumbs" }, h("a", { href: "#/dags" }, "DAGs"), " / ", h("span", {}, dagId)),
    head, graph, runs);
  let dag = null;
  const trigger = async () => {
    try {
      const answer = await api.triggerDag(dagId);
      toast(`run ${answer.dag_run_id} started`, "ok");
      window.location.hash = link(`/dags/${dagId}`, { run: answer.dag_run_id });
    } catch (exc) {
      toast(exc instanceof ApiError ? exc.message : String(exc), "error");
    }
  };
  await page.every(3000, async () => {
    const [d, r] = await Promise.all([api.dag(dagId), api.dagRuns(dagId, { limit: 50 })]);
    if (!page.alive) return;
    page.okay();
    dag = d;
    const run = r.items.find((x) => x.dag_run_id === chosen) || r.items[0] || null;
    clear(head, 
      h("h1", {}, dag.name),
      h("span", { class: "muted" }, schedule(dag.schedule)),
      h("span", { class: "spacer" }),
      h("button", { type: "button", class: "primary", "data-action": "trigger-dag",
        onclick: trigger }, "Trigger run"));
    drawGraph(graph, dag, run, retry);
    drawRuns(runs, dag, r.items, run);
  });
}

// Repair a failed run; the answer says which jobs run again (or the 409 why not, as a toast)
async function retry(dagId, runId) {
  try {
    const answer = await api.retryDagRun(dagId, runId);
    toast(answer.already_requested ? `run ${runId} is being repaired already`
      : `retrying ${answer.rerun.join(", ")} of run ${runId}`, "ok");
  } catch (exc) {
    toast(exc instanceof ApiError ? exc.message : String(exc), "error");
  }
}

function drawGraph(card, dag, run, onRetry) {
  const statuses = run ? run.node_statuses : Object.fromEntries(dag.nodes.map((n) => [n.key, "none"]));
  const jobOf = Object.fromEntries(dag.nodes.map((n) => [n.key, n.job_id]));
  clear(card, 
    h("h2", {}, run ? ["Run ", h("code", {}, run.dag_run_id), " ", runBadge(run.status),
      run.status === "failed" ? [" ", h("button", { type: "button", "data-action": "retry-run",
        title: "run its dead jobs again, then the skipped ones after them",
        onclick: () => onRetry(dag.dag_id, run.dag_run_id) }, "Retry failed jobs")] : []]
      : "Graph (no run yet)"),
    h("div", { class: "graph-scroll", "data-testid": "dag-graph",
      "data-run-id": run ? run.dag_run_id : "" },
    dagGraph(dag.nodes, statuses, (n) => `#/jobs/${jobOf[n.key]}`)),
    h("div", { class: "legend", "data-testid": "dag-legend" }, LEGEND.map(([st, label]) => h("span",
      { "data-legend": st }, h("i", { class: `swatch bg-${st}` }), label || st))),
  );
}

function drawRuns(card, dag, items, selected) {
  const total = dag.nodes.length;
  clear(card, 
    h("h2", {}, "Runs"),
    items.length
      ? h("table", { class: "list", "data-testid": "dag-runs" },
        h("thead", {}, h("tr", {}, ["run", "status", "started", "took", "nodes"]
          .map((c) => h("th", {}, c)))),
        h("tbody", {}, items.map((r) => {
          const done = Object.values(r.node_statuses).filter((st) => st === "success").length;
          return h("tr", { class: selected && r.dag_run_id === selected.dag_run_id ? "selected" : "",
            "data-run-id": r.dag_run_id },
          h("td", {}, h("a", { href: link(`/dags/${dag.dag_id}`, { run: r.dag_run_id }) },
            h("code", {}, r.dag_run_id.slice(0, 8)))),
          h("td", {}, runBadge(r.status)),
          h("td", { title: fmtTime(r.started_at) }, fmtAgo(r.started_at)),
          h("td", {}, fmtMs(durationMs(r.started_at, r.finished_at))),
          h("td", {}, `${done} / ${total} succeeded`));
        })))
      : h("p", { class: "muted" }, "No runs yet: trigger one."),
  );
}
