// Jobs: filtered and paged on the server (GET /v1/jobs, keyset cursors), 50 a page; the
// first page refreshes itself every 5 s.

import { api } from "../api.js";
import {
  clear, dagTag, fmtAgo, fmtTime, h, lifecycleBadge, schedule, statusBadge,
} from "../dom.js";
import { go, link } from "../nav.js";

const PAGE_SIZE = 50;
const STATUSES = ["pending", "queued", "running", "success", "failed", "dead", "blocked",
  "skipped", "paused", "cancelled", "expired"];
const PRIORITIES = ["critical", "high", "normal", "low"];

// cursors of the pages before this one, per filter: "newer" walks back through them
const trail = { filter: "", cursors: [] };

function select(name, label, options, value) {
  return h("label", {}, label, h("select", { name },
    h("option", { value: "" }, "any"),
    options.map((o) => h("option", { value: o, selected: o === value }, o))));
}

export async function jobsPage(page) {
  const q = page.query;
  const filter = { name_contains: q.get("q") || "", status: q.get("status") || "",
    priority: q.get("priority") || "" };
  const filterKey = JSON.stringify(filter);
  if (trail.filter !== filterKey) Object.assign(trail, { filter: filterKey, cursors: [] });
  const cursor = q.get("cursor") || "";

  const search = h("input", { type: "search", name: "q", value: filter.name_contains,
    placeholder: "name contains…", "aria-label": "search by name" });
  const form = h("form", {
    class: "filters",
    onsubmit: (ev) => {
      ev.preventDefault();
      const data = new FormData(form);
      go("/jobs", { q: data.get("q").trim(), status: data.get("status"),
        priority: data.get("priority") });
    },
  },
  search,
  select("status", "status", STATUSES, filter.status),
  select("priority", "priority", PRIORITIES, filter.priority),
  h("button", { type: "submit", class: "primary" }, "Filter"),
  h("a", { href: "#/jobs", class: "button secondary" }, "Clear"));
  form.querySelectorAll("select").forEach((el) => el.addEventListener("change", () => form.requestSubmit()));

  const table = h("div", { class: "table-wrap" });
  const pager = h("div", { class: "pager" });
  page.root.append(h("div", { class: "title-row" }, h("h1", {}, "Jobs")), form, table, pager);

  const load = async () => {
    const answer = await api.jobs({ ...filter, limit: PAGE_SIZE, cursor });
    if (!page.alive) return;
    page.okay();
    clear(table, jobsTable(answer.items));
    drawPager(pager, q, cursor, answer.next_cursor);
  };
  if (cursor) await load();
  else await page.every(5000, load);
}

function drawPager(pager, q, cursor, next) {
  const base = Object.fromEntries(q.entries());
  const newer = cursor
    ? h("button", { type: "button", class: "secondary", onclick: () => {
      const previous = trail.cursors.pop() || "";
      go("/jobs", { ...base, cursor: previous });
    } }, "← Newer")
    : null;
  const older = next
    ? h("button", { type: "button", class: "secondary", onclick: () => {
      trail.cursors.push(cursor);
      go("/jobs", { ...base, cursor: next });
    } }, "Older →")
    : null;
  const first = cursor ? h("a", { href: link("/jobs", { ...base, cursor: "" }) }, "first page") : null;
  clear(pager, newer || "", " ", older || "", " ", first || "");
}

export function jobsTable(items) {
  if (!items.length) return h("p", { class: "muted empty" }, "No jobs match.");
  return h("table", { class: "list", "data-testid": "jobs-table" },
    h("thead", {}, h("tr", {}, ["name", "job", "priority", "schedule", "next run",
      "last run", "created"].map((c) => h("th", {}, c)))),
    h("tbody", {}, items.map((job) => h("tr", { "data-job-id": job.job_id },
      h("td", { class: "name" }, h("a", { href: `#/jobs/${job.job_id}` }, job.name),
        job.dag ? [" ", dagTag(job.dag)] : null),
      // what the job is; how its last run ended is in "last run"
      h("td", {}, lifecycleBadge(job.lifecycle)),
      h("td", {}, h("span", { class: `prio prio-${job.priority}` }, job.priority)),
      h("td", { class: "muted" }, schedule(job.schedule)),
      h("td", { title: fmtTime(job.next_run_at) }, job.next_run_at ? fmtAgo(job.next_run_at) : "—"),
      h("td", { class: "last-run" }, job.last_execution
        ? [statusBadge(job.last_outcome || job.last_execution.status), " ",
          h("span", { class: "muted" }, fmtAgo(job.last_execution.scheduled_at))]
        : "—"),
      h("td", { class: "muted", title: fmtTime(job.created_at) }, fmtAgo(job.created_at)),
    ))));
}
