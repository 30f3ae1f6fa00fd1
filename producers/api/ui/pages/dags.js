// DAGs: newest first, each with its latest run; a search by name, server-side.

import { api } from "../api.js";
import { clear, fmtAgo, fmtTime, h, runBadge, schedule } from "../dom.js";
import { go, link } from "../nav.js";

const PAGE_SIZE = 50;

export async function dagsPage(page) {
  const name = page.query.get("q") || "";
  const cursor = page.query.get("cursor") || "";
  const search = h("input", { type: "search", name: "q", value: name,
    placeholder: "name contains…", "aria-label": "search DAGs by name" });
  const form = h("form", { class: "filters", onsubmit: (ev) => {
    ev.preventDefault();
    go("/dags", { q: search.value.trim() });
  } }, search, h("button", { type: "submit", class: "primary" }, "Search"));
  const table = h("div", { class: "table-wrap" });
  const pager = h("div", { class: "pager" });
  page.root.append(h("div", { class: "title-row" }, h("h1", {}, "DAGs")), form, table, pager);
  await page.every(5000, async () => {
    const answer = await api.dags({ name_contains: name, limit: PAGE_SIZE, cursor });
    if (!page.alive) return;
    page.okay();
    clear(table, dagsTable(answer.items));
    clear(pager, 
      cursor ? h("a", { href: link("/dags", { q: name }) }, "first page") : "",
      " ",
      answer.next_cursor
        ? h("a", { class: "button secondary", href: link("/dags", { q: name,
          cursor: answer.next_cursor }) }, "Older →")
        : "",
    );
  });
}

function dagsTable(items) {
  if (!items.length) return h("p", { class: "muted empty" }, "No DAGs yet.");
  return h("table", { class: "list", "data-testid": "dags-table" },
    h("thead", {}, h("tr", {}, ["name", "jobs", "schedule", "last run", "started", "created"]
      .map((c) => h("th", {}, c)))),
    h("tbody", {}, items.map((d) => h("tr", { "data-dag-id": d.dag_id },
      h("td", { class: "name" }, h("a", { href: `#/dags/${d.dag_id}` }, d.name)),
      h("td", {}, String(d.node_count)),
      h("td", { class: "muted" }, schedule(d.schedule)),
      h("td", {}, d.last_run ? runBadge(d.last_run.status) : "—"),
      h("td", { title: d.last_run ? fmtTime(d.last_run.started_at) : "" },
        d.last_run ? fmtAgo(d.last_run.started_at) : "—"),
      h("td", { class: "muted", title: fmtTime(d.created_at) }, fmtAgo(d.created_at))))));
}
