// The REST client of the dashboard: the public /v1 routes, with the operator's bearer token
// (kept in sessionStorage: gone when the tab closes) when the API has tokens configured.

const TOKEN_KEY = "duetime.token";

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details || {};
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** Listeners told when the API answers 401 (the token is missing or wrong). */
export const onUnauthorized = new Set();

export async function request(method, path, { query, body } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(key, value);
  }
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let answer;
  try {
    answer = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch (exc) {
    throw new ApiError(0, "network", `the API did not answer: ${exc.message}`);
  }
  const text = await answer.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!answer.ok) {
    const err = (data && data.error) || {};
    if (answer.status === 401) onUnauthorized.forEach((fn) => fn());
    throw new ApiError(answer.status, err.code || "http_" + answer.status,
      err.message || `HTTP ${answer.status}`, err.details);
  }
  return data;
}

const id = (value) => encodeURIComponent(value);

export const api = {
  jobs: (query) => request("GET", "/v1/jobs", { query }),
  job: (jobId) => request("GET", `/v1/jobs/${id(jobId)}`),
  createJob: (body) => request("POST", "/v1/jobs", { body }),
  nextRuns: (jobId, query) => request("GET", `/v1/jobs/${id(jobId)}/next_runs`, { query }),
  executions: (jobId, query) => request("GET", `/v1/jobs/${id(jobId)}/executions`, { query }),
  execution: (executionId) => request("GET", `/v1/executions/${id(executionId)}`),
  command: (jobId, kind) => request("POST", `/v1/jobs/${id(jobId)}/${kind}`),
  dags: (query) => request("GET", "/v1/dags", { query }),
  dag: (dagId) => request("GET", `/v1/dags/${id(dagId)}`),
  dagRuns: (dagId, query) => request("GET", `/v1/dags/${id(dagId)}/runs`, { query }),
  triggerDag: (dagId) => request("POST", `/v1/dags/${id(dagId)}/trigger`),
  retryDagRun: (dagId, runId) => request("POST",
    `/v1/dags/${id(dagId)}/runs/${id(runId)}/retry`),
  dlq: (query) => request("GET", "/v1/dlq", { query }),
  replayOne: (executionId) => request("POST", `/v1/dlq/${id(executionId)}/replay`),
  replayMany: (filter) => request("POST", "/v1/dlq/replay", { body: filter }),
  replayProgress: (ids) => request("POST", "/v1/dlq/replay-progress", {
    body: { execution_ids: ids },
  }),
  overview: () => request("GET", "/v1/stats/overview"),
  executionStats: (query) => request("GET", "/v1/stats/executions", { query }),
  lag: () => request("GET", "/v1/stats/lag"),
  cluster: () => request("GET", "/v1/cluster"),
};
