// Talking to the coordinator: bearer token, problem+json errors, and the live event stream.

const TOKEN_KEY = "epctl.token";

export function getToken() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(token) {
  if (token) localStorage.setItem(TOKEN_KEY, token);
  else localStorage.removeItem(TOKEN_KEY);
}

/** An HTTP error carrying the coordinator's problem document (RFC 9457). */
export class ApiError extends Error {
  constructor(status, problem) {
    const title = (problem && (problem.title || problem.detail)) || `HTTP ${status}`;
    super(problem && problem.detail && problem.title ? `${problem.title}: ${problem.detail}` : title);
    this.status = status;
    this.problem = problem || {};
  }
}

function authHeaders(extra) {
  const headers = Object.assign({ Accept: "application/json" }, extra || {});
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  return headers;
}

async function readProblem(response) {
  const text = await response.text();
  try {
    return JSON.parse(text);
  } catch {
    return { title: response.statusText || `HTTP ${response.status}`, detail: text.slice(0, 300) };
  }
}

/** Listeners told about every 401/403 (the app shows the token dialog) and connectivity changes. */
const listeners = { unauthorized: [], connectivity: [] };
export function on(kind, fn) {
  listeners[kind].push(fn);
}
function emit(kind, value) {
  for (const fn of listeners[kind]) fn(value);
}

export async function api(path, { method = "GET", params, body, headers } = {}) {
  let url = path;
  if (params) {
    const query = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      if (v !== undefined && v !== null && v !== "") query.set(k, v);
    }
    const qs = query.toString();
    if (qs) url += (url.includes("?") ? "&" : "?") + qs;
  }
  const init = { method, headers: authHeaders(headers) };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    emit("connectivity", false);
    throw new ApiError(0, { title: "Coordinator unreachable", detail: String(err.message || err) });
  }
  emit("connectivity", true);
  if (!response.ok) {
    const problem = await readProblem(response);
    if (response.status === 401) emit("unauthorized", problem);
    throw new ApiError(response.status, problem);
  }
  if (response.status === 204) return null;
  const type = response.headers.get("content-type") || "";
  return type.includes("json") ? response.json() : response.text();
}

/** One parsed Server-Sent Event. */
function parseEventBlock(block) {
  const event = { id: null, event: "message", data: "" };
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") event.id = value;
    else if (field === "event") event.event = value;
    else if (field === "data") data.push(value);
  }
  event.data = data.join("\n");
  if (!data.length && event.id === null) return null;
  try {
    event.json = event.data ? JSON.parse(event.data) : null;
  } catch {
    event.json = null;
  }
  return event;
}

/**
 * Follow a job's events. EventSource cannot send an Authorization header, so this reads the SSE
 * stream through fetch (same wire format), resumes with Last-Event-ID after a drop, and falls back
 * to polling when the stream endpoint is missing or keeps failing. `onUpdate` is called for every
 * event (or poll tick); `isFinished()` tells it when to stop. Returns a stop function.
 */
export function followJob(jobId, { onUpdate, onMode, isFinished, pollMs = 1000 }) {
  let stopped = false;
  let lastEventId = null;
  let failures = 0;
  const controller = new AbortController();

  async function stream() {
    const headers = authHeaders({ Accept: "text/event-stream" });
    if (lastEventId !== null) headers["Last-Event-ID"] = lastEventId;
    const response = await fetch(`/v1/reconfigurations/${encodeURIComponent(jobId)}/events`, {
      headers,
      signal: controller.signal,
      cache: "no-store",
    });
    if (!response.ok || !response.body) {
      const err = new ApiError(response.status, await readProblem(response));
      err.noStream = response.status === 404 || response.status === 405 || response.status === 501;
      throw err;
    }
    onMode("stream");
    failures = 0;
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let split;
      while ((split = buffer.search(/\r?\n\r?\n/)) !== -1) {
        const block = buffer.slice(0, split);
        buffer = buffer.slice(split).replace(/^\r?\n\r?\n/, "");
        const event = parseEventBlock(block);
        if (!event) continue;
        if (event.id !== null && event.id !== "") lastEventId = event.id;
        onUpdate(event);
      }
    }
  }

  async function poll() {
    onMode("polling");
    while (!stopped && !isFinished()) {
      await onUpdate(null);
      await new Promise((r) => setTimeout(r, pollMs));
    }
  }

  (async () => {
    while (!stopped && !isFinished()) {
      try {
        await stream();
        // The server closes the stream at the job's terminal event; one last update settles the page.
        await onUpdate(null);
        if (isFinished()) break;
        await new Promise((r) => setTimeout(r, 300));
      } catch (err) {
        if (stopped) return;
        failures += 1;
        if (err.noStream || failures >= 3) {
          await poll();
          break;
        }
        await new Promise((r) => setTimeout(r, 500 * failures));
      }
    }
    if (!stopped) onMode("done");
  })();

  return () => {
    stopped = true;
    controller.abort();
  };
}
