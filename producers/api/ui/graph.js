// A DAG drawn as a graph: layers by longest path from the roots (left to right), order inside
// a layer by the barycentre of the upstream nodes (a few sweeps cut most crossings), edges as
// curves with arrowheads, each node coloured by its status in the chosen run.

import { s } from "./dom.js";

const NODE_W = 150;
const NODE_H = 44;
const GAP_X = 70;
const GAP_Y = 22;
const MARGIN = 16;

/** nodes: [{key, depends_on}] → {layer: {key: n}, order: [[key, ...] per layer]} */
export function layout(nodes) {
  const byKey = new Map(nodes.map((n) => [n.key, n]));
  const layer = {};
  const visiting = new Set();
  function depth(key) {
    if (key in layer) return layer[key];
    if (visiting.has(key)) return 0; // a cycle cannot be created; do not loop if one shows up
    visiting.add(key);
    const ups = (byKey.get(key)?.depends_on || []).filter((u) => byKey.has(u));
    layer[key] = ups.length ? 1 + Math.max(...ups.map(depth)) : 0;
    visiting.delete(key);
    return layer[key];
  }
  nodes.forEach((n) => depth(n.key));
  const order = [];
  for (const n of nodes) (order[layer[n.key]] ||= []).push(n.key);
  const pos = () => {
    const p = {};
    order.forEach((keys) => keys.forEach((k, i) => { p[k] = i; }));
    return p;
  };
  const downs = {};
  nodes.forEach((n) => (n.depends_on || []).forEach((u) => (downs[u] ||= []).push(n.key)));
  for (let sweep = 0; sweep < 4; sweep++) {
    const p = pos();
    const down = sweep % 2 === 0;
    const layers = down ? order.slice(1) : order.slice(0, -1).reverse();
    for (const keys of layers) {
      const centre = (k) => {
        const near = down ? byKey.get(k).depends_on || [] : downs[k] || [];
        const known = near.filter((x) => x in p);
        return known.length ? known.reduce((a, x) => a + p[x], 0) / known.length : p[k];
      };
      keys.sort((a, b) => centre(a) - centre(b) || a.localeCompare(b));
      keys.forEach((k, i) => { p[k] = i; });
    }
  }
  return { layer, order };
}

function short(text, max) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/**
 * The graph as an SVG element. statuses: {key: status}; href(node) → link of a node or null.
 */
export function dagGraph(nodes, statuses = {}, href = () => null) {
  const { order } = layout(nodes);
  const tallest = Math.max(1, ...order.map((keys) => keys.length));
  const width = MARGIN * 2 + order.length * NODE_W + (order.length - 1) * GAP_X;
  const height = MARGIN * 2 + tallest * NODE_H + (tallest - 1) * GAP_Y;
  const at = {};
  order.forEach((keys, li) => {
    const offset = ((tallest - keys.length) * (NODE_H + GAP_Y)) / 2;
    keys.forEach((k, i) => {
      at[k] = { x: MARGIN + li * (NODE_W + GAP_X), y: MARGIN + offset + i * (NODE_H + GAP_Y) };
    });
  });
  const edges = [];
  for (const n of nodes) {
    for (const u of n.depends_on || []) {
      if (!(u in at)) continue;
      const x1 = at[u].x + NODE_W;
      const y1 = at[u].y + NODE_H / 2;
      const x2 = at[n.key].x - 4;
      const y2 = at[n.key].y + NODE_H / 2;
      const mid = (x1 + x2) / 2;
      edges.push(s("path", {
        class: "edge", "marker-end": "url(#arrow)",
        d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`,
      }));
    }
  }
  const boxes = nodes.map((n) => {
    const status = statuses[n.key] || "none";
    const { x, y } = at[n.key];
    const group = s("g", { class: "node", "data-key": n.key, "data-status": status },
      s("title", {}, `${n.key}: ${status}`),
      s("rect", { class: `f-${status.replace(/[^a-z_]/g, "")}`, x, y, width: NODE_W,
        height: NODE_H, rx: 8 }),
      s("text", { class: "node-key", x: x + 10, y: y + 18 }, short(n.key, 20)),
      s("text", { class: "node-status", x: x + 10, y: y + 34 }, status));
    const link = href(n);
    return link ? s("a", { href: link }, group) : group;
  });
  const defs = s("defs", {},
    s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7,
      markerHeight: 7, orient: "auto-start-reverse" },
      s("path", { d: "M0,0 L10,5 L0,10 z", class: "arrowhead" })));
  return s("svg", {
    class: "dag", viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": "DAG graph",
  }, defs, edges, boxes);
}
