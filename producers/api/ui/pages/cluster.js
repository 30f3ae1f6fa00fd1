// Cluster (#/cluster): who is alive, from GET /v1/cluster, refreshed every 5 s: which
// scheduler owns which partitions (and which partitions nobody owns), the worker groups with
// their members, the queues and priorities each reads and its lease heartbeat, the resolver and
// the projector. Every member was seen when Kafka was asked ("as of"); a member gone from the
// group disappears at the next refresh.

import { ApiError, api } from "../api.js";
import { clear, fmtAgo, fmtTime, h } from "../dom.js";

const STABLE = new Set(["stable"]);

function stateBadge(state) {
  const kind = STABLE.has(state) ? "ok" : state === "empty" || state === "dead" ? "bad" : "warn";
  return h("span", { class: `badge gs-${kind}`, "data-state": state }, state.replace(/_/g, " "));
}

function seen(member) {
  return h("span", { title: fmtTime(member.seen_at) }, fmtAgo(member.seen_at));
}

export async function clusterPage(page) {
  const head = h("div", { class: "title-row" }, h("h1", {}, "Cluster"),
    h("span", { class: "muted", "data-testid": "cluster-at" }, ""));
  const schedulers = h("div", { class: "card", "data-testid": "cluster-schedulers" });
  const workers = h("div", { class: "card", "data-testid": "cluster-workers" });
  const others = h("div", { class: "grid2" });
  const notes = h("div", {});
  page.root.append(head, notes, schedulers, workers, others);

  await page.every(5000, async () => {
    let c;
    try {
      c = await api.cluster();
    } catch (exc) {
      // Kafka away: say so where the page is, keep what was drawn (it is dated)
      if (exc instanceof ApiError && exc.status === 503) {
        page.fail(new ApiError(503, exc.code, `${exc.message}: the cluster cannot be shown now`));
        return;
      }
      throw exc;
    }
    if (!page.alive) return;
    page.okay();
    head.lastChild.textContent = `as of ${fmtTime(c.at)} (refreshed every 5 s)`;
    clear(notes, c.truncated ? h("p", { class: "page-note" },
      "More consumer groups than the API describes at once: some are not shown.") : null,
    c.warnings.map((w) => h("p", { class: "page-note" }, w)));
    drawSchedulers(schedulers, c);
    drawWorkers(workers, c.workers);
    clear(others, roleCard("Resolver", c.resolver, "DAG resolver"),
      roleCard("Projector", c.projector, "PostgreSQL projector"));
  });
}

function drawSchedulers(card, c) {
  const group = c.schedulers;
  const owners = new Map();
  (group ? group.members : []).forEach((m, i) => m.partitions.forEach((p) => owners.set(p, i)));
  const grid = h("div", { class: "partition-grid", "data-testid": "partition-grid" },
    Array.from({ length: c.partitions }, (_, p) => {
      const owner = owners.get(p);
      return h("span", {
        class: `partition ${owner === undefined ? "unowned" : `owner-${owner % 8}`}`,
        "data-partition": p,
        "data-owner": owner === undefined ? "" : group.members[owner].client_id,
        title: owner === undefined ? `partition ${p}: no scheduler owns it`
          : `partition ${p}: ${group.members[owner].client_id}`,
      }, String(p));
    }));
  clear(card,
    h("div", { class: "title-row" }, h("h2", {}, "Schedulers"),
      group ? stateBadge(group.state) : null,
      h("span", { class: "muted" }, group ? group.group : "no scheduler group")),
    c.unowned_partitions.length
      ? h("p", { class: "page-error", "data-testid": "unowned" },
        `${c.unowned_partitions.length} of ${c.partitions} partitions have no scheduler: `
        + `${c.unowned_partitions.join(", ")} (nothing fires there until one takes them)`)
      : h("p", { class: "muted", "data-testid": "unowned" },
        `every one of the ${c.partitions} partitions has its scheduler`),
    grid,
    group && group.members.length
      ? h("table", { class: "list", "data-testid": "schedulers-table" },
        h("thead", {}, h("tr", {}, ["", "scheduler (client id)", "host", "partitions owned",
          "seen"].map((t) => h("th", {}, t)))),
        h("tbody", {}, group.members.map((m, i) => h("tr", { "data-client-id": m.client_id },
          h("td", {}, h("i", { class: `swatch owner-${i % 8}` })),
          h("td", {}, h("code", {}, m.client_id)),
          h("td", {}, m.host),
          h("td", { class: "partitions" }, m.partitions.length ? m.partitions.join(", ") : "none"),
          h("td", {}, seen(m))))))
      : h("p", { class: "muted" }, "No scheduler is running."),
  );
}

function drawWorkers(card, groups) {
  clear(card,
    h("h2", {}, "Workers"),
    groups.length ? groups.map((g) => h("section", { class: "worker-group",
      "data-group": g.group },
    h("div", { class: "title-row" }, h("h3", {}, g.group), stateBadge(g.state),
      h("span", { class: "muted" }, `${g.members.length} alive · queues: `
        + `${g.queues.join(", ") || "none assigned"} · ${g.protocol} protocol`)),
    g.members.length
      ? h("table", { class: "list", "data-testid": "workers-table" },
        h("thead", {}, h("tr", {}, ["worker", "host", "queue / priority: partitions",
          "running", "last lease renewal", "seen"].map((t) => h("th", {}, t)))),
        h("tbody", {}, g.members.map((m) => h("tr", { "data-worker-id": m.worker_id },
          h("td", {}, h("code", {}, m.worker_id)),
          h("td", {}, m.host),
          h("td", {}, m.queues.length ? h("ul", { class: "queues" }, m.queues.map((q) => h("li",
            { "data-queue": q.queue, "data-priority": q.priority },
            h("span", { class: "queue-name" }, q.queue), " / ",
            h("span", { class: `prio prio-${q.priority}` }, q.priority),
            h("span", { class: "muted" }, `: ${q.partitions.join(", ")}`))))
            : h("span", { class: "muted" }, "no partitions (more workers than partitions)")),
          h("td", {}, String(m.leases_held)),
          h("td", { title: fmtTime(m.last_lease_renewal_at) },
            m.last_lease_renewal_at ? fmtAgo(m.last_lease_renewal_at) : "—"),
          h("td", {}, seen(m))))))
      : h("p", { class: "muted" }, "No worker alive in this group.")))
      : h("p", { class: "muted" }, "No worker group found."),
  );
}

function roleCard(title, group, what) {
  return h("div", { class: "card", "data-testid": `cluster-${title.toLowerCase()}` },
    h("div", { class: "title-row" }, h("h2", {}, title),
      group ? stateBadge(group.state) : null,
      h("span", { class: "muted" }, group ? group.group : `no ${what} group`)),
    group && group.members.length
      ? h("table", { class: "list" },
        h("thead", {}, h("tr", {}, ["member (client id)", "host", "topics", "seen"]
          .map((t) => h("th", {}, t)))),
        h("tbody", {}, group.members.map((m) => h("tr", {},
          h("td", {}, h("code", {}, m.client_id)),
          h("td", {}, m.host),
          h("td", { class: "muted" }, `${m.topics.length} topics`),
          h("td", {}, seen(m))))))
      : h("p", { class: "muted" }, `No ${what} is running.`));
}
