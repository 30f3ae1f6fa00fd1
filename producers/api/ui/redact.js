// Secrets never reach the screen. The API already redacts what it returns (duetime.core.redact);
// this is the same rule again in the browser, so a value that slipped through (an older API,
// a field added later) is still masked: URL userinfo and query values, header values whose
// names look secret, bearer/basic credentials inside free text.

export const MASK = "***";
const SECRET_NAME = /authorization|cookie|token|key|secret|password|passwd|auth|session|credential|signature/i;
const SECRET_REF = /\$\{secret:[A-Za-z_][A-Za-z0-9_]{0,63}\}/;
const URL_IN_TEXT = /\b[a-zA-Z][a-zA-Z0-9+.-]{1,15}:\/\/[^\s'"<>]+/g;
const CREDENTIAL = /\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{4,}/gi;

export function isSecretHeader(name) {
  return SECRET_NAME.test(name);
}

function maskValue(value) {
  // a reference to a worker-side secret names it without holding it
  if (SECRET_REF.test(value)) {
    const rest = value.replace(new RegExp(SECRET_REF.source, "g"), "").trim().toLowerCase();
    if (["", "bearer", "basic", "token"].includes(rest)) return value;
  }
  return MASK;
}

export function redactHeaders(headers) {
  const out = {};
  for (const [name, value] of Object.entries(headers || {})) {
    out[name] = isSecretHeader(name) ? maskValue(String(value)) : value;
  }
  return out;
}

export function redactUrl(url) {
  const text = String(url);
  const scheme = text.indexOf("://");
  if (scheme < 0) return text;
  const head = text.slice(0, scheme + 3);
  let rest = text.slice(scheme + 3);
  let fragment = "";
  const hash = rest.indexOf("#");
  if (hash >= 0) { fragment = "#" + MASK; rest = rest.slice(0, hash); }
  let query = "";
  const q = rest.indexOf("?");
  if (q >= 0) {
    query = "?" + rest.slice(q + 1).split("&").map((item) => {
      const eq = item.indexOf("=");
      return eq >= 0 ? item.slice(0, eq) + "=" + MASK : MASK;
    }).join("&");
    rest = rest.slice(0, q);
  }
  const slash = rest.indexOf("/");
  let authority = slash >= 0 ? rest.slice(0, slash) : rest;
  const path = slash >= 0 ? rest.slice(slash) : "";
  const at = authority.lastIndexOf("@");
  if (at >= 0) authority = MASK + "@" + authority.slice(at + 1);
  return head + authority + path + query + fragment;
}

export function redactText(text) {
  return String(text)
    .replace(URL_IN_TEXT, (url) => redactUrl(url))
    .replace(CREDENTIAL, (_, scheme) => `${scheme} ${MASK}`);
}

/** An HTTP target as it may be shown: URL redacted, secret-looking headers masked. */
export function redactTarget(target) {
  if (!target || target.type !== "http") return target;
  const out = { ...target };
  if (typeof out.url === "string") out.url = redactUrl(out.url);
  if (out.headers) out.headers = redactHeaders(out.headers);
  return out;
}
