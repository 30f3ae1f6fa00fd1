// Small hand-written SVG charts: a time series of lines, stacked bars over time and horizontal
// bars. Colours come from CSS classes (f-<key> fills, s-<key> strokes), so one palette in
// style.css serves badges, charts and the DAG graph.

import { h, s } from "./dom.js";

const W = 640;
const H = 220;
const PAD = { left: 56, right: 12, top: 12, bottom: 28 };

/** The top of a y axis of 4 steps, each step 1, 2 or 5 × a power of ten. */
function niceMax(value) {
  if (!(value > 0)) return 4;
  const quarter = value / 4;
  const exp = 10 ** Math.floor(Math.log10(quarter));
  const step = [1, 2, 5, 10].map((m) => m * exp).find((s) => s >= quarter);
  return 4 * step;
}

function hhmm(t, seconds = false) {
  const d = new Date(t);
  const two = (n) => String(n).padStart(2, "0");
  const text = `${two(d.getUTCHours())}:${two(d.getUTCMinutes())}`;
  return seconds ? `${text}:${two(d.getUTCSeconds())}` : text;
}

function frame(xs, yMax, yFormat) {
  const x0 = xs[0];
  const x1 = xs[xs.length - 1] === x0 ? x0 + 1 : xs[xs.length - 1];
  const sx = (t) => PAD.left + ((t - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
  const sy = (v) => H - PAD.bottom - (v / yMax) * (H - PAD.top - PAD.bottom);
  const grid = [];
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4;
    grid.push(
      s("line", { class: "grid", x1: PAD.left, x2: W - PAD.right, y1: sy(v), y2: sy(v) }),
      s("text", { class: "tick", x: PAD.left - 6, y: sy(v) + 4, "text-anchor": "end" }, yFormat(v)),
    );
  }
  // time ticks evenly spaced in time (samples need not be), with seconds on short spans
  const ticks = Math.min(6, Math.max(1, xs.length - 1));
  const seconds = x1 - x0 < 10 * 60 * 1000;
  for (let i = 0; i <= ticks; i++) {
    const t = x0 + ((x1 - x0) * i) / ticks;
    const anchor = i === 0 ? "start" : i === ticks ? "end" : "middle";
    grid.push(s("text", { class: "tick", x: sx(t), y: H - 8, "text-anchor": anchor },
      hhmm(t, seconds)));
  }
  return { sx, sy, grid };
}

function legend(items) {
  return h("div", { class: "legend" },
    items.map(({ key, label }) => h("span", {}, h("i", { class: `swatch bg-${key}` }), label)));
}

function empty(message) {
  return h("div", { class: "chart-empty" }, message);
}

/**
 * Lines over time. series: [{key, label, points: [{t: ms, v: number|null}]}]; a null value
 * breaks the line.
 */
export function lineChart({ title, series, yFormat = String, emptyText = "no data yet", note }) {
  const xs = series.length ? series[0].points.map((p) => p.t) : [];
  const values = series.flatMap((se) => se.points.map((p) => p.v)).filter((v) => v !== null);
  const body = !xs.length || !values.length ? empty(emptyText) : (() => {
    const yMax = niceMax(Math.max(...values));
    const { sx, sy, grid } = frame(xs, yMax, yFormat);
    const lines = series.map((se) => {
      const parts = [];
      let current = [];
      for (const p of se.points) {
        if (p.v === null || p.v === undefined) {
          if (current.length) parts.push(current);
          current = [];
        } else current.push(`${sx(p.t).toFixed(1)},${sy(p.v).toFixed(1)}`);
      }
      if (current.length) parts.push(current);
      const dots = se.points.filter((p) => p.v !== null && p.v !== undefined).map((p) =>
        s("circle", { class: `f-${se.key}`, cx: sx(p.t), cy: sy(p.v), r: 2.5 },
          s("title", {}, `${se.label} ${hhmm(p.t, true)} UTC: ${yFormat(p.v)}`)));
      return [
        ...parts.map((pts) => s("polyline", { class: `line s-${se.key}`, points: pts.join(" ") })),
        ...dots,
      ];
    });
    return s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title },
      grid, lines);
  })();
  return h("figure", { class: "card chart-card" }, h("figcaption", {}, title), body,
    legend(series.map((se) => ({ key: se.key, label: se.label }))),
    note ? h("p", { class: "chart-note" }, note) : null);
}

/** Stacked bars over time. buckets: [{t: ms, values: {key: n}}]; keys: [{key, label}]. */
export function stackedBars({ title, buckets, keys, yFormat = String, emptyText = "no data yet" }) {
  const totals = buckets.map((b) => keys.reduce((sum, k) => sum + (b.values[k.key] || 0), 0));
  const max = Math.max(0, ...totals);
  const body = !buckets.length || max === 0 ? empty(emptyText) : (() => {
    const yMax = niceMax(max);
    const xs = buckets.map((b) => b.t);
    const { sx, sy, grid } = frame(xs, yMax, yFormat);
    const slot = (W - PAD.left - PAD.right) / Math.max(1, buckets.length - 1);
    const width = Math.max(1, Math.min(24, slot * 0.7));
    const bars = buckets.flatMap((b) => {
      let base = 0;
      return keys.map((k) => {
        const v = b.values[k.key] || 0;
        if (!v) return null;
        const rect = s("rect", {
          class: `f-${k.key}`, x: sx(b.t) - width / 2, width,
          y: sy(base + v), height: sy(base) - sy(base + v),
        }, s("title", {}, `${k.label} ${hhmm(b.t, true)} UTC: ${yFormat(v)}`));
        base += v;
        return rect;
      });
    });
    return s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title },
      grid, bars);
  })();
  return h("figure", { class: "card chart-card" }, h("figcaption", {}, title), body, legend(keys));
}

/** Horizontal bars: items [{key, label, value, href?}]. */
export function hBars({ title, items, emptyText = "nothing yet" }) {
  const max = Math.max(0, ...items.map((i) => i.value));
  const rows = items.map((item) => {
    const label = item.href ? h("a", { href: item.href }, item.label) : item.label;
    return h("div", { class: "hbar" },
      h("span", { class: "hbar-label" }, label),
      h("span", { class: "hbar-track" },
        s("svg", { viewBox: "0 0 100 10", preserveAspectRatio: "none", class: "hbar-svg" },
          s("rect", { class: `f-${item.key}`, x: 0, y: 0, height: 10,
            width: max ? Math.max(0.5, (100 * item.value) / max) : 0 }))),
      h("span", { class: "hbar-value" }, item.value.toLocaleString("en-US")));
  });
  return h("figure", { class: "card chart-card" }, h("figcaption", {}, title),
    items.length ? h("div", { class: "hbars" }, rows) : empty(emptyText));
}
