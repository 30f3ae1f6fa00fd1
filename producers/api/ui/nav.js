// Navigation inside the dashboard: the hash holds the page and its query (#/jobs?status=dead).

export function parseHash() {
  const raw = window.location.hash.replace(/^#/, "") || "/";
  const [path, search] = raw.split("?");
  return { path: path || "/", query: new URLSearchParams(search || "") };
}

/** The hash link of path with query (an object; empty values dropped). */
export function link(path, query = {}) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v !== null && v !== undefined && v !== "" && v !== false) params.set(k, v);
  }
  const qs = params.toString();
  return `#${path}${qs ? `?${qs}` : ""}`;
}

/** Go to path with query; the same place again re-renders it. */
export function go(path, query = {}) {
  const target = link(path, query);
  if (window.location.hash === target) window.dispatchEvent(new HashChangeEvent("hashchange"));
  else window.location.hash = target;
}
