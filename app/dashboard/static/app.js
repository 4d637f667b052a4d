// The dashboard's pages: reconfiguration history and one job, live.
import { api, ApiError, followJob, getToken, on, setToken } from "./api.js";
import { chartLegend, commitLegend, commitWindowSvg, downtimeChartSvg, timelineSvg } from "./charts.js";
import { incidentPage, incidentRows } from "./incident.js";
import {
  ALL_STATES, CANCELLABLE_STATES, NOT_MEASURED, PHASE_ORDER, SOURCES, badge, esc, fmtAgo, fmtMs, fmtTime,
  isTerminal, job, jobDurationMs, jobEndMs, keptGeneration, queuedMs, sizeChange, timeCell, toMs,
} from "./model.js";

const view = document.getElementById("view");
const PAGE_SIZE = 25;
let teardown = () => {};

// ---------------------------------------------------------------- token dialog, theme, connectivity

const dialog = document.getElementById("token-dialog");
const tokenInput = document.getElementById("token-input");
const tokenError = document.getElementById("token-error");

function askForToken(message) {
  tokenError.hidden = !message;
  tokenError.textContent = message || "";
  tokenInput.value = getToken();
  if (!dialog.open) dialog.showModal();
  tokenInput.focus();
}

document.getElementById("token-form").addEventListener("submit", () => {
  setToken(tokenInput.value.trim());
  render();
});
document.getElementById("token-forget").addEventListener("click", () => {
  setToken("");
  tokenInput.value = "";
  dialog.close();
  askForToken("Token forgotten.");
});
document.getElementById("token-button").addEventListener("click", () => askForToken());
document.getElementById("theme-toggle").addEventListener("click", () => {
  const root = document.documentElement;
  const dark = root.dataset.theme
    ? root.dataset.theme === "dark"
    : window.matchMedia("(prefers-color-scheme: dark)").matches;
  root.dataset.theme = dark ? "light" : "dark";
  localStorage.setItem("epctl.theme", root.dataset.theme);
});

on("unauthorized", (problem) => askForToken((problem && (problem.detail || problem.title)) || "The coordinator refused the token."));
const conn = document.getElementById("conn");
on("connectivity", (ok) => {
  conn.className = `conn ${ok ? "ok" : "bad"}`;
  conn.textContent = ok ? "connected" : "unreachable";
});

// ---------------------------------------------------------------- routing

function navigate(url, replace = false) {
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  render();
}

document.addEventListener("click", (event) => {
  const link = event.target.closest("a[data-link]");
  if (!link || event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0) return;
  event.preventDefault();
  navigate(link.getAttribute("href"));
});
window.addEventListener("popstate", () => render());

function render() {
  teardown();
  teardown = () => {};
  const path = location.pathname.replace(/\/+$/, "");
  const match = path.match(/^\/ui\/jobs\/([^/]+)$/);
  const incident = path.match(/^\/ui\/incidents\/([^/]+)$/);
  if (!getToken()) {
    view.innerHTML = `<div class="panel empty">Enter a coordinator token to see reconfigurations.
      <div style="margin-top:12px"><button class="btn btn-primary" id="enter-token">Enter token</button></div></div>`;
    document.getElementById("enter-token").addEventListener("click", () => askForToken());
    askForToken();
    return;
  }
  if (match) teardown = jobPage(decodeURIComponent(match[1]));
  else if (incident) teardown = incidentPage(view, decodeURIComponent(incident[1]), problemHtml);
  else teardown = historyPage();
}

function problemHtml(err) {
  if (err instanceof ApiError) {
    const p = err.problem;
    return `<div class="error-banner" role="alert"><strong>${esc(p.title || `HTTP ${err.status}`)}</strong>${p.detail ? ` — ${esc(p.detail)}` : ""}</div>`;
  }
  return `<div class="error-banner" role="alert">${esc(err && err.message ? err.message : err)}</div>`;
}

function onResize(fn) {
  let timer = null;
  const handler = () => {
    clearTimeout(timer);
    timer = setTimeout(fn, 120);
  };
  window.addEventListener("resize", handler);
  return () => window.removeEventListener("resize", handler);
}

// ---------------------------------------------------------------- history page

/** datetime-local value, read as UTC like every time on these pages <-> ISO UTC for the API. */
function localInputToIso(value) {
  if (!value) return "";
  const d = new Date(`${value}Z`);
  return Number.isNaN(d.getTime()) ? "" : d.toISOString();
}
function isoToLocalInput(value) {
  const ms = toMs(value);
  return ms === null ? "" : new Date(ms).toISOString().slice(0, 16);
}

// The newest incidents: a deployment that stopped being whole, what was lost, and what clients saw.
function showIncidents(incidents) {
  const panel = document.getElementById("incidents-panel");
  const body = document.getElementById("incidents-body");
  if (!panel || !body || !incidents.length) return;
  body.innerHTML = incidentRows(incidents);
  panel.hidden = false;
}

// Each deployment's size, its warm spares (held of wanted; their ids on hover) and the desired size
// autoscalers asked for (pending until the job starts).
function showDeployments(deployments) {
  const panel = document.getElementById("deployments-panel");
  const body = document.getElementById("deployments-body");
  if (!panel || !body || !deployments.length) return;
  body.innerHTML = deployments.map((d) => {
    const want = d.desired || {};
    const waiting = want.pending ? (want.blocked_by || "next tick").replace(/-/g, " ") : "–";
    const spareIds = d.spare_engines || [];
    const spares = d.spares ? `${spareIds.length} of ${d.spares}` : "–";
    return `<tr><td>${esc(d.name)}</td><td class="num">${esc(d.current_dp_size)}</td>
      <td class="num spares" title="${esc(spareIds.join(", "))}">${esc(spares)}</td>
      <td class="num">${want.dp_size == null ? "–" : esc(want.dp_size)}</td>
      <td>${want.source ? esc(`${want.source}${want.requester ? ` (${want.requester})` : ""}`) : "–"}</td>
      <td title="${esc(want.reason || "")}">${esc(waiting)}</td>
      <td>${want.next_scale_at ? esc(fmtTime(toMs(want.next_scale_at)))
        : d.active_job_id ? "after the active job and its cooldown" : "now"}</td></tr>`;
  }).join("");
  panel.hidden = false;
}

function historyPage() {
  const params = new URLSearchParams(location.search);
  const filters = {
    deployment: params.get("deployment") || "",
    state: params.get("state") || "",
    source: params.get("source") || "",
    created_after: params.get("created_after") || "",
    created_before: params.get("created_before") || "",
  };
  const cursor = params.get("cursor") || "";
  const pageSize = Math.max(1, Math.min(200, Number(params.get("limit")) || PAGE_SIZE));
  // Cursors of the pages before this one, so "Newer" can step back without server support.
  const previous = (params.get("prev") || "").split(",").filter(Boolean);
  let timer = null;
  let alive = true;
  let lastJobs = [];

  const option = (value, label, selected) => `<option value="${esc(value)}"${value === selected ? " selected" : ""}>${esc(label)}</option>`;
  view.innerHTML = `
    <div class="page-head"><h1>Reconfiguration history</h1><span class="spacer"></span>
      <span class="live" id="history-live">auto-refresh</span></div>
    <section class="panel">
      <form class="filters" id="filters">
        <div class="field"><label for="f-deployment">Deployment</label>
          <select id="f-deployment" name="deployment">${option("", "All deployments", filters.deployment)}
          ${filters.deployment ? option(filters.deployment, filters.deployment, filters.deployment) : ""}</select></div>
        <div class="field"><label for="f-state">State</label>
          <select id="f-state" name="state">${option("", "Any state", filters.state)}
          ${ALL_STATES.map((s) => option(s, s.replace(/_/g, " "), filters.state)).join("")}</select></div>
        <div class="field"><label for="f-source">Requested by</label>
          <select id="f-source" name="source">${option("", "Anyone", filters.source)}
          ${SOURCES.map((s) => option(s, s, filters.source)).join("")}</select></div>
        <div class="field"><label for="f-after">Created after (UTC)</label>
          <input id="f-after" name="created_after" type="datetime-local" value="${esc(isoToLocalInput(filters.created_after))}"></div>
        <div class="field"><label for="f-before">Created before (UTC)</label>
          <input id="f-before" name="created_before" type="datetime-local" value="${esc(isoToLocalInput(filters.created_before))}"></div>
        <div class="actions">
          <button class="btn" type="button" id="f-clear">Clear</button>
          <button class="btn btn-primary" type="submit" id="f-apply">Apply</button>
        </div>
      </form>
    </section>
    <div id="history-error"></div>
    <section class="panel" id="deployments-panel" hidden>
      <div class="table-wrap"><table id="deployments-table">
        <thead><tr><th>Deployment</th><th class="num">Size</th><th class="num" title="warm spares: held of wanted">Spares</th><th class="num">Desired</th><th>Asked by</th>
          <th>Waiting for</th><th>Next scale allowed</th></tr></thead>
        <tbody id="deployments-body"></tbody>
      </table></div>
    </section>
    <section class="panel" id="incidents-panel" hidden>
      <div class="panel-head"><h2>Incidents</h2>
        <span class="muted">a deployment that stopped being whole, and what clients saw</span></div>
      <div class="table-wrap"><table id="incidents-table">
        <thead><tr><th>Incident</th><th>Deployment</th><th>State</th><th class="wide-only">Reason</th><th class="wide-only">Lost</th>
          <th>At (UTC)</th><th class="num">To serving</th><th class="num">Client outage</th><th class="wide-only">Jobs</th></tr></thead>
        <tbody id="incidents-body"></tbody>
      </table></div>
    </section>
    <section class="panel">
      <div class="panel-head"><h2>Downtime per job</h2><span class="muted" id="chart-note"></span></div>
      <div id="downtime-chart"></div>
      ${chartLegend()}
    </section>
    <section class="panel">
      <div class="table-wrap"><table id="jobs-table">
        <thead><tr><th>Job</th><th>Deployment</th><th>Size</th><th>State</th><th class="wide-only">Requested by</th>
          <th>Created (UTC)</th><th class="num">Duration</th><th class="num" title="the engines' own pause">Downtime</th>
          <th class="num" title="what the canary probe's clients saw">Client outage</th></tr></thead>
        <tbody id="jobs-body"><tr><td colspan="9" class="empty">Loading…</td></tr></tbody>
      </table></div>
      <div class="pager">
        <span class="count" id="jobs-count"></span>
        <button class="btn" id="page-newer" type="button" ${cursor ? "" : "disabled"}>← Newer</button>
        <button class="btn" id="page-older" type="button" disabled>Older →</button>
      </div>
    </section>`;

  const form = document.getElementById("filters");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const next = new URLSearchParams();
    for (const key of ["deployment", "state", "source"]) if (data.get(key)) next.set(key, data.get(key));
    if (pageSize !== PAGE_SIZE) next.set("limit", pageSize);
    const after = localInputToIso(data.get("created_after"));
    const before = localInputToIso(data.get("created_before"));
    if (after) next.set("created_after", after);
    if (before) next.set("created_before", before);
    navigate(`/ui/${next.toString() ? `?${next}` : ""}`);
  });
  for (const select of form.querySelectorAll("select")) {
    select.addEventListener("change", () => form.requestSubmit());
  }
  document.getElementById("f-clear").addEventListener("click", () => navigate("/ui/"));

  function pageUrl(nextCursor, prevList) {
    const next = new URLSearchParams();
    for (const [k, v] of Object.entries(filters)) if (v) next.set(k, v);
    if (pageSize !== PAGE_SIZE) next.set("limit", pageSize);
    if (nextCursor) next.set("cursor", nextCursor);
    if (prevList.length) next.set("prev", prevList.join(","));
    return `/ui/${next.toString() ? `?${next}` : ""}`;
  }
  document.getElementById("page-newer").addEventListener("click", () => {
    const prev = previous.slice();
    const back = prev.pop();
    navigate(pageUrl(back === "-" ? "" : back, prev));
  });

  api("/v1/incidents", { params: { limit: 10, ...(filters.deployment ? { deployment: filters.deployment } : {}) } })
    .then((result) => { if (alive) showIncidents(result.data || []); })
    .catch(() => {});

  api("/v1/deployments", { params: { limit: 200 } })
    .then((result) => {
      const select = document.getElementById("f-deployment");
      if (!alive || !select) return;
      const deployments = result.data || result || [];
      const names = deployments.map((d) => d.name).filter(Boolean);
      const current = filters.deployment;
      showDeployments(deployments.filter((d) => !current || d.name === current));
      select.innerHTML = option("", "All deployments", current) +
        [...new Set([...names, ...(current ? [current] : [])])].sort().map((n) => option(n, n, current)).join("");
    })
    .catch(() => {});

  const chartBox = document.getElementById("downtime-chart");
  const drawChart = () => {
    chartBox.innerHTML = downtimeChartSvg(lastJobs, chartBox.clientWidth || 900);
  };

  async function load() {
    try {
      const query = { ...filters, limit: pageSize };
      if (cursor) query.cursor = cursor;
      const result = await api("/v1/reconfigurations", { params: query });
      if (!alive) return;
      document.getElementById("history-error").innerHTML = "";
      lastJobs = result.data || [];
      renderRows(lastJobs);
      const count = result.count ?? lastJobs.length;
      const bound = result.count_exact === false ? "+" : "";  // a capped count is a lower bound
      document.getElementById("jobs-count").textContent =
        `${lastJobs.length} shown${result.count != null ? ` of ${count}${bound} matching` : ""}`;
      const older = document.getElementById("page-older");
      older.disabled = !result.next_cursor;
      older.onclick = () => navigate(pageUrl(result.next_cursor, [...previous, cursor || "-"]));
      document.getElementById("chart-note").textContent = lastJobs.length ? "this page, oldest left" : "";
      drawChart();
      // Keep the first page fresh while anything on it is still running.
      const anyActive = lastJobs.some((j) => !isTerminal(job.state(j)));
      document.getElementById("history-live").className = `live${anyActive ? " on" : ""}`;
      clearTimeout(timer);
      if (!cursor) timer = setTimeout(load, anyActive ? 1500 : 5000);
    } catch (err) {
      if (!alive) return;
      document.getElementById("history-error").innerHTML = problemHtml(err);
      document.getElementById("jobs-body").innerHTML = `<tr><td colspan="9" class="empty">Could not load jobs.</td></tr>`;
    }
  }

  function renderRows(jobs) {
    const body = document.getElementById("jobs-body");
    if (!jobs.length) {
      body.innerHTML = `<tr><td colspan="9" class="empty">No reconfigurations match these filters.</td></tr>`;
      return;
    }
    body.innerHTML = jobs.map((j) => {
      const id = job.id(j);
      const created = job.createdMs(j);
      const downtime = job.downtimeMs(j);
      const outage = job.clientOutageMeasuredMs(j);
      return `<tr class="clickable" data-job="${esc(id)}">
        <td class="job-id"><a href="/ui/jobs/${encodeURIComponent(id)}" data-link class="mono" title="${esc(id)}">${esc(id)}</a></td>
        <td>${esc(job.deployment(j))}</td>
        <td class="nowrap">${esc(sizeChange(j))}</td>
        <td>${badge(job.state(j))}</td>
        <td class="wide-only"><span class="tag">${esc(job.source(j) || "–")}</span></td>
        <td class="created" title="${esc(fmtAgo(created))}">${timeCell(created)}</td>
        <td class="num">${esc(fmtMs(jobDurationMs(j)))}</td>
        <td class="num downtime">${downtime === null ? "–" : esc(fmtMs(downtime))}</td>
        <td class="num client-outage${outage === null ? " faint" : ""}">${outage === null ? NOT_MEASURED : esc(fmtMs(outage))}</td>
      </tr>`;
    }).join("");
    for (const row of body.querySelectorAll("tr.clickable")) {
      row.addEventListener("click", (event) => {
        if (event.target.closest("a")) return;
        navigate(`/ui/jobs/${encodeURIComponent(row.dataset.job)}`);
      });
    }
  }

  const stopResize = onResize(drawChart);
  load();
  return () => {
    alive = false;
    clearTimeout(timer);
    stopResize();
  };
}

// ---------------------------------------------------------------- job page

// What the new expert placement moved, and which engine went from which rank to which.
function placementHtml(j) {
  const p = j.placement;
  const retired = (j.retire || []).length ? `<dt>Retired by request</dt><dd class="mono" id="job-retire">${esc(j.retire.join(", "))}</dd>` : "";
  if (!p) return retired;
  const c = j.coverage;
  const coverage = !c ? "" : `<dt>Coverage</dt><dd id="job-coverage">${c.covered
    ? "every expert survives one engine loss" + (c.domains > 1 ? " and one host loss" : "")
    : esc(String(c.at_risk)) + " layer-expert pairs on one engine only" +
      (c.at_risk_domain ? ` · ${esc(String(c.at_risk_domain))} on one host only` : "")}</dd>`;
  const mib = ((p.bytes_moved || 0) / 1048576).toFixed(1);
  const ranks = Object.entries(p.rank_map || {})
    .map(([engine, r]) => `${esc(engine)} ${r.old ?? "+"} → ${r.new ?? "–"}`)
    .join("<br>");
  return `${retired}
          <dt>Weights moved</dt><dd id="job-copies">${esc(String(p.copies_moved))} expert copies (${esc(mib)} MiB) · lower bound ${esc(String(p.lower_bound))}</dd>
          <dt>Rank map</dt><dd class="mono" id="job-rank-map">${ranks || "–"}</dd>${coverage}`;
}

function jobPage(jobId) {
  let alive = true;
  let current = null;
  let stopFollow = () => {};
  let refreshing = null;
  let pending = false;
  let mode = "";
  let ticker = null;
  let incident = null;  // the incident this job belongs to (fetched once it names one)

  view.innerHTML = `<div class="crumbs"><a href="/ui/" data-link>History</a> / <span class="mono">${esc(jobId)}</span></div>
    <div id="job-root"><div class="panel empty">Loading…</div></div>`;
  const root = document.getElementById("job-root");

  async function refresh() {
    // One request at a time; a burst of events collapses into one more fetch.
    if (refreshing) {
      pending = true;
      return refreshing;
    }
    refreshing = (async () => {
      do {
        pending = false;
        try {
          const fresh = await api(`/v1/reconfigurations/${encodeURIComponent(jobId)}`);
          if (!alive) return;
          current = fresh;
          const incidentId = job.incidentId(fresh);
          if (incidentId && (!incident || incident.id !== incidentId || incident.state === "open")) {
            incident = await api(`/v1/incidents/${encodeURIComponent(incidentId)}`).catch(() => null);
            if (!alive) return;
          } else if (!incidentId && job.source(fresh) === "self-heal") {
            // Recorded before self-heal jobs named their incident: the incident names the job.
            if (!incident) {
              const found = await api("/v1/incidents", { params: { deployment: job.deployment(fresh), limit: 100 } }).catch(() => null);
              if (!alive) return;
              incident = ((found && found.data) || []).find((i) => (i.recovery_job_ids || []).includes(jobId)) || null;
            }
            if (incident) current = { ...fresh, incident_id: incident.id };
          }
          draw();
        } catch (err) {
          if (!alive) return;
          if (!current) root.innerHTML = problemHtml(err);
        }
      } while (pending && alive);
    })();
    try {
      await refreshing;
    } finally {
      refreshing = null;
    }
  }

  function liveLabel() {
    if (!current || isTerminal(job.state(current))) return `<span class="live" id="live-mode">final</span>`;
    const text = mode === "stream" ? "live (event stream)" : mode === "polling" ? "live (polling)" : "connecting…";
    return `<span class="live on" id="live-mode">${text}</span>`;
  }

  function progressHtml(j) {
    const state = job.state(j);
    const pct = Math.max(0, Math.min(100, isTerminal(state) && state === "succeeded" ? 100 : job.progressPercent(j)));
    // A cancel is an operator's choice, not a fault: neutral, like its badge.
    const fillCls = state === "succeeded" ? "done" : state === "failed" ? "bad" : state === "rolled_back" ? "warn" : state === "cancelled" ? "idle" : "";
    const phasesSeen = new Set(job.phases(j).map((p) => p.name));
    const currentIndex = PHASE_ORDER.indexOf(state);
    const errorPhase = (job.error(j) || {}).phase;
    const chips = ["pending", ...PHASE_ORDER].map((name, i) => {
      let cls = "";
      if (name === state) cls = "current";
      else if (name === "pending" ? state !== "pending" : phasesSeen.has(name) || (currentIndex > -1 && i - 1 < currentIndex)) cls = "done";
      if (isTerminal(state) && errorPhase === name) cls = state === "cancelled" ? "stopped" : "bad";
      return `<span class="step ${cls}" data-step="${name}">${name.replace(/_/g, " ")}</span>`;
    });
    const last = state === "succeeded" ? "done" : state === "cancelled" ? "stopped" : isTerminal(state) ? "bad" : "";
    chips.push(`<span class="step ${last}">${isTerminal(state) ? esc(state.replace(/_/g, " ")) : "done"}</span>`);
    const step = job.progressStep(j);
    // A long step (a launch: engines starting) moves the bar little; the time in it shows it is alive.
    const busy = !isTerminal(state) && state !== "pending";
    return `<div class="progress"><div class="progress-track"><div class="progress-fill ${fillCls}${busy ? " busy" : ""}" id="progress-fill" style="width:${Math.max(pct, busy ? 2 : 0)}%"></div></div>
      <span class="progress-label" id="progress-percent" data-percent="${pct}">${Math.round(pct)}%</span></div>
      <div class="muted" style="margin-top:8px;font-size:13px"><span id="progress-step">${step ? esc(step.replace(/_/g, " ")) : isTerminal(state) ? "finished" : "waiting"}</span>${busy ? ` <span id="progress-elapsed">${esc(stepElapsedText(j))}</span>` : ""}</div>
      <div class="steps">${chips.join("")}</div>`;
  }

  // How long the job has been in its current step (from that step's first progress line).
  function stepElapsedText(j) {
    const step = job.progressStep(j);
    const events = job.events(j).filter((e) => e.kind === "progress" && (e.data || {}).step === step);
    const since = events.length ? toMs(events[0].created_at) : job.startedMs(j);
    return since === null ? "" : `· ${fmtMs(Math.max(0, Date.now() - since))} in this step`;
  }

  function failureHtml(j) {
    let out = "";
    const error = job.error(j);
    if (error && job.state(j) === "cancelled") {
      // An operator's cancel: what it stopped and where, without an error's colours.
      out += `<div class="alert info" id="job-error"><h2>Cancelled${error.phase ? ` during ${esc(error.phase)}` : ""}</h2>
        <p style="margin:0">${esc(error.message || "cancelled on request")}; the deployment stayed on generation ${esc(job.fromGeneration(j) ?? "?")}.</p></div>`;
    } else if (error) {
      let kv = ["phase", "engine_id", "type"].filter((k) => error[k]).map((k) => `<dt>${k.replace("_id", "")}</dt><dd class="mono">${esc(error[k])}</dd>`).join("");
      const over = error.overrun;
      if (over) kv += `<dt>over budget</dt><dd id="job-overrun">engine ${esc(over.engine_id)}, part ${esc(over.part)}: stopped ${esc(fmtMs(over.stopped_ms))} of a ${esc(over.budget_ms)} ms budget</dd>`;
      out += `<div class="alert ${job.state(j) === "failed" ? "bad" : "warn"}" id="job-error"><h2>${job.state(j) === "failed" ? "Failed" : "Error"}${error.phase ? ` during ${esc(error.phase)}` : ""}</h2>
        <dl class="kv">${kv}</dl><pre>${esc(error.message || JSON.stringify(error))}</pre></div>`;
    }
    const cleanup = job.cleanupState(j);
    if (cleanup && !["succeeded", "none", "acknowledged"].includes(cleanup)) {
      const detail = job.cleanupDetail(j);
      const failed = cleanup === "failed";
      out += `<div class="alert ${failed ? "bad" : "warn"}" id="job-cleanup"><h2>Background cleanup: ${esc(cleanup.replace(/_/g, " "))}</h2>
        ${failed ? `<p style="margin:0">The next reconfiguration of <strong>${esc(job.deployment(j))}</strong> is refused until an operator retries or acknowledges it
        (<code>epctl cleanup retry ${esc(job.id(j))}</code> or <code>epctl cleanup ack ${esc(job.id(j))}</code>).</p>` : ""}
        <p style="margin:0" id="job-cleanup-line">${esc(cleanupLine(j, detail))}</p>
        ${detail ? `<details><summary class="faint">details</summary><pre class="json">${esc(JSON.stringify(detail, null, 2))}</pre></details>` : ""}</div>`;
    }
    return out;
  }

  // A background cleanup in words, as `epctl jobs show` says it (the record stays under "details").
  function cleanupLine(j, detail) {
    const d = detail && typeof detail === "object" ? detail : {};
    const generation = d.failed_generation ?? d.retired_generation;
    const what = generation !== undefined && generation !== null ? `generation ${generation}` : "the retired groups";
    const engines = Array.isArray(d.engines) && d.engines.length ? ` on ${d.engines.length} engines` : "";
    const state = job.cleanupState(j);
    if (state === "failed") return `destroying ${what} failed on ${d.failed_engine_id ?? "an engine"}: ${d.error ?? "no error recorded"}`;
    if (state === "pending" || state === "running") return `destroying ${what}${engines} in the background`;
    return `${what}${engines}`;
  }

  // What the coordinator's canaries saw while the job ran (null where no probe ran).
  function probeHtml(j) {
    const probe = j.probe;
    if (!probe || typeof probe !== "object" || probe.canaries_sent === undefined) return "";
    const ms = (v) => (typeof v === "number" ? esc(fmtMs(v)) : "–");
    const phases = Object.entries(probe.phases || {});
    const unreachable = Object.entries(probe.unreachable || {});
    const outside = probe.latency_p50_ms_outside_outage ?? probe.latency_p50_ms_outside_downtime;
    const deadline = typeof probe.deadline_ms === "number" ? ` · deadline ${ms(probe.deadline_ms)}` : "";
    return `<section class="panel" id="probe-panel"><div class="panel-head"><h2>Canary probe</h2>
      <span class="muted">${esc(probe.canaries_sent)} canaries to ${esc(probe.targets)} engines every ${ms(probe.interval_ms)}${deadline} · ${esc(probe.canaries_failed)} failed · ${esc(probe.canaries_late ?? 0)} late · p50 outside the outage ${ms(outside)}</span></div>
      ${unreachable.length ? `<div class="alert warn" id="probe-unreachable">could not reach ${unreachable.map(([e, why]) => `<span class="mono">${esc(e)}</span> (${esc(why)})`).join(", ")}</div>` : ""}
      <div class="table-wrap"><table id="probe-phases"><thead><tr><th>Phase</th><th class="num">Canaries</th><th class="num">Failed</th><th class="num">Late</th>
        <th class="num">p50</th><th class="num">p99</th><th class="num">Slowest answer</th><th class="num">Longest gap</th></tr></thead><tbody>
        ${phases.map(([name, p]) => `<tr data-phase="${esc(name)}"><td>${esc(name)}</td><td class="num">${esc(p.sent)}</td><td class="num">${esc(p.failed)}</td><td class="num">${esc(p.late ?? "–")}</td>
          <td class="num">${ms(p.p50_ms)}</td><td class="num">${ms(p.p99_ms)}</td><td class="num slowest">${ms(p.slowest_answer_ms)}</td><td class="num">${ms(p.longest_gap_ms)}</td></tr>`).join("")}
      </tbody></table></div></section>`;
  }

  // The client's two figures: the outage is the headline; the slowest answer is a slow stretch (with
  // the phase it fell in), not a stop. A job from before they were told apart shows its old figure.
  function clientCards(j) {
    const outage = job.clientOutageMeasuredMs(j);
    const slowest = job.clientSlowestAnswerMs(j);
    const old = job.oldClientDowntimeMs(j);
    const phase = (p) => (p ? ` <span class="card-note">in ${esc(p)}</span>` : "");
    let out = "";
    if (outage !== null) {
      // Failed canaries with no outage: another engine answered meanwhile (a leaver's 503s).
      const note = !outage && job.canariesFailed(j) ? ` <span class="card-note">${esc(job.canariesFailed(j))} failed, answered elsewhere</span>` : "";
      out += `<div class="card"><div class="k">Client outage (canaries)</div><div class="v" id="card-client-outage">${esc(fmtMs(outage))}${outage ? phase(job.outagePhase(j)) : note}</div></div>`;
      out += `<div class="card"><div class="k">Slowest answer (canaries)</div><div class="v" id="card-slowest-answer">${esc(fmtMs(slowest))}${slowest !== null ? phase(job.slowestAnswerPhase(j)) : ""}</div></div>`;
    } else if (old !== null) {
      out += `<div class="card" title="recorded before the outage and the slowest answer were told apart: slow answers counted as an outage"><div class="k">Client downtime (old figure)</div><div class="v" id="card-client-downtime">${esc(fmtMs(old))}</div></div>`;
    } else {
      const why = (j.probe || {}).canaries_sent === 0 ? "no canary sent" : "no canary probe ran";
      out += `<div class="card"><div class="k">Client outage (canaries)</div><div class="v muted small" id="card-client-outage">${NOT_MEASURED} <span class="card-note">${why}</span></div></div>`;
    }
    return out + frontDoorCard(j);
  }

  // The job's requests at the front door (issue 35): failed by cause, drained on leavers, held in the window.
  function frontDoorCard(j) {
    const fd = j.front_door_requests;
    if (!fd) return "";
    const failed = fd.failed || {};
    const total = Object.values(failed).reduce((a, n) => a + Number(n || 0), 0);
    const causes = Object.entries(failed).filter(([, n]) => n).map(([c, n]) => `${c} ${n}`).join(", ");
    const drained = Object.values(fd.drained || {});
    const inFlight = drained.reduce((a, d) => a + Number(d.in_flight_at_drain || 0), 0);
    const held = fd.held;
    const notes = [`${total} failed${causes ? ` (${causes})` : ""}`];
    const senders = fd.by_sender;  // clients' requests apart from the probe's canaries
    if (senders) notes.unshift(`${senders.clients.requests} from clients, ${senders.canaries.requests} canaries`);
    if (drained.length) notes.push(`${inFlight} drained on leavers`);
    if (held) notes.push(`${held.count} held in the window` + (typeof held.longest_wait_ms === "number" ? `, longest ${fmtMs(held.longest_wait_ms)}` : ""));
    return `<div class="card"><div class="k">Front door requests</div><div class="v" id="card-front-door">${esc(fd.requests ?? 0)} <span class="card-note">${esc(notes.join("; "))}</span></div></div>`;
  }

  // Each engine's own generation before and after the job ("–": none; "?": not known yet).
  function generationsText(e, j) {
    if (!e.generations) return e.generation ?? "–";
    const [before, after] = e.generations;
    const end = after ?? (isTerminal(job.state(j)) ? "–" : "?");
    return `${before ?? "–"} → ${end}`;
  }

  function enginesHtml(j) {
    const engines = job.engines(j);
    if (!engines.length) return `<div class="empty">${isTerminal(job.state(j)) ? "No engine took part." : "No engine results yet."}</div>`;
    return `<div class="table-wrap"><table id="engines-table"><thead><tr><th>Engine</th><th>Role</th><th>Ranks</th><th>Generation before → after</th>
      <th>Paused at (UTC)</th><th>Resumed at (UTC)</th><th class="num">Pause</th></tr></thead><tbody>
      ${engines.map((e) => `<tr data-engine="${esc(e.engineId)}"><td class="mono">${esc(e.engineId)}</td><td>${esc(e.role || "–")}</td>
        <td class="mono">${esc(Array.isArray(e.ranks) ? e.ranks.map((r) => r ?? "–").join(" → ") : e.ranks ?? "–")}</td><td class="mono generations">${esc(generationsText(e, j))}</td>
        <td class="nowrap">${e.start === null ? "–" : esc(fmtTime(e.start, false))}</td>
        <td class="nowrap">${e.end === null ? (e.start === null ? "–" : "still paused") : esc(fmtTime(e.end, false))}</td>
        <td class="num">${e.ms === null || Number.isNaN(e.ms) ? "–" : esc(fmtMs(e.ms))}</td></tr>`).join("")}
      </tbody></table></div>`;
  }

  function eventsHtml(j) {
    const events = job.events(j);
    if (!events.length) return `<div class="empty">No transitions yet.</div>`;
    return `<div class="table-wrap"><table id="events-table"><thead><tr><th class="num">#</th><th>Time (UTC)</th><th>Transition</th><th>Kind</th><th>Message</th></tr></thead><tbody>
      ${events.map((e) => {
        const data = e.data && Object.keys(e.data).length ? `<details><summary class="faint">data</summary><pre class="json">${esc(JSON.stringify(e.data, null, 2))}</pre></details>` : "";
        let transition = `<span class="faint">–</span>`;
        if (e.from_state && e.to_state) transition = `${badge(e.from_state)} <span class="faint">→</span> ${badge(e.to_state)}`;
        else if (e.to_state) transition = badge(e.to_state);
        return `<tr data-seq="${esc(e.seq)}"><td class="num mono">${esc(e.seq ?? "")}</td><td class="nowrap">${esc(fmtTime(toMs(e.created_at), false))}</td>
          <td class="nowrap">${transition}</td><td><span class="tag">${esc(e.kind || "")}</span></td><td>${esc(e.message || "")}${data}</td></tr>`;
      }).join("")}</tbody></table></div>`;
  }

  // The timeline starts where the work starts; its note adds the queue, so it sums to the Duration card.
  function timelineNote(j) {
    const queued = queuedMs(j);
    const created = job.createdMs(j);
    const end = jobEndMs(j);
    const ran = end !== null && created !== null ? Math.max(0, end - created - (queued ?? 0)) : null;
    const parts = [];
    if (queued >= 1) parts.push(`queued ${fmtMs(queued)}`);
    if (ran !== null) parts.push(`ran ${fmtMs(ran)}`);
    return esc([...parts, "phases and each engine's pause"].join(" · "));
  }

  // A self-heal job: the loss it recovers from, when it was found, when the deployment served again,
  // and the incident that holds the whole story (with what clients saw from the loss on).
  function selfHealHtml(j) {
    const incidentId = job.incidentId(j);
    if (job.lossMs(j) === null && !incidentId) return "";
    const selfHeal = job.source(j) === "self-heal";
    const outage = incident && typeof incident.client_outage_ms === "number" ? fmtMs(incident.client_outage_ms) : NOT_MEASURED;
    const link = incidentId ? `<a href="/ui/incidents/${encodeURIComponent(incidentId)}" data-link class="mono" id="job-incident">${esc(incidentId)}</a>` : "–";
    return `<section class="panel" id="self-heal-panel"><div class="panel-head"><h2>${selfHeal ? "Self-heal" : "Incident"}</h2>
      <span class="muted">${selfHeal ? "the engine loss this job recovers from" : "a loss that hit this job's generation right after it"}</span></div>
      <dl class="kv">
        ${job.lossMs(j) !== null ? `<dt>Loss at</dt><dd id="heal-loss">${esc(fmtTime(job.lossMs(j)))}</dd>
        <dt>Detected after</dt><dd id="heal-detect">${esc(fmtMs(job.timeToDetectMs(j)))}</dd>
        <dt>Serving again after</dt><dd id="heal-serving">${job.timeToServingMs(j) === null ? (isTerminal(job.state(j)) ? "–" : "not yet") : esc(fmtMs(job.timeToServingMs(j)))}</dd>` : ""}
        <dt>Incident</dt><dd>${link}${incident ? ` <span class="muted">${esc(incident.state)} · ${esc(incident.reason)}</span>` : ""}</dd>
        ${incidentId ? `<dt>Client outage from the loss</dt><dd id="heal-outage">${esc(outage)}${incident && incident.outage_evidence ? ` <span class="faint">(${esc(incident.outage_evidence)})</span>` : ""}</dd>` : ""}
      </dl></section>`;
  }

  function draw() {
    const j = current;
    const state = job.state(j);
    const openDetails = new Set([...root.querySelectorAll("details[open]")].map((d) => d.closest("tr")?.dataset.seq));
    const canCancel = CANCELLABLE_STATES.includes(state) && !j.cancel_requested;
    const duration = jobDurationMs(j);
    const queued = queuedMs(j);
    const downtime = job.downtimeMs(j);
    const gens = keptGeneration(j)
      ? `${esc(job.fromGeneration(j) ?? "?")} <span class="card-note">(unchanged)</span>`
      : esc(`${job.fromGeneration(j) ?? "?"} → ${job.toGeneration(j) ?? "?"}`);
    root.innerHTML = `
      <div class="page-head">
        <h1>${esc(job.deployment(j))} <span class="muted">${esc(sizeChange(j))}</span></h1>
        <span id="job-state">${badge(state, true)}</span>
        ${liveLabel()}
        ${j.cancel_requested && !isTerminal(state) ? `<span class="tag" id="cancel-requested">cancel requested</span>` : ""}
        <span class="spacer"></span>
        ${canCancel ? `<button class="btn btn-danger" id="cancel-job" type="button">Cancel job</button>` : ""}
      </div>
      <section class="panel" id="progress-panel">${progressHtml(j)}</section>
      <div class="cards">
        <div class="card"><div class="k">Downtime</div><div class="v" id="card-downtime">${downtime === null ? "–" : esc(fmtMs(downtime))}${job.source(j) === "self-heal" ? ` <span class="card-note block">the engines' pause in this job; the loss before it is the incident's</span>` : ""}</div></div>
        ${clientCards(j)}
        <div class="card"><div class="k">Duration</div><div class="v" id="card-duration"><span id="card-duration-value">${esc(fmtMs(duration))}</span>${queued >= 1 ? ` <span class="card-note block">${esc(fmtMs(queued))} of it queued</span>` : ""}</div></div>
        <div class="card"><div class="k">DP size</div><div class="v">${esc(sizeChange(j))}</div></div>
        <div class="card"><div class="k">Generation</div><div class="v" id="card-generation">${gens}</div></div>
        <div class="card"><div class="k">Warm-up · strategy</div><div class="v" style="font-size:15px;padding-top:4px">${esc(job.warmup(j) || "–")} · ${esc(job.strategy(j) || "–")}</div></div>
        <div class="card"><div class="k">Requested by</div><div class="v" style="font-size:15px;padding-top:4px">${esc(job.source(j) || "–")}</div></div>
      </div>
      ${selfHealHtml(j)}
      ${failureHtml(j)}
      <section class="panel"><div class="panel-head"><h2>Timeline</h2><span class="muted" id="timeline-note">${timelineNote(j)}</span></div>
        <div id="timeline"></div>
        <div class="legend"><span><i style="background:var(--accent)"></i>phase</span><span><i style="background:var(--pause)"></i>engine paused</span><span><i style="background:var(--bad)"></i>deployment down (union)</span></div>
      </section>
      ${probeHtml(j)}
      <section class="panel" id="commit-panel"><div class="panel-head"><h2>Commit window</h2><span class="muted">each engine's pause on its own scale, and where it went</span></div><div id="commit-window"></div>${commitLegend()}</section>
      <div class="grid-2">
        <section class="panel"><h2>Engines</h2>${enginesHtml(j)}</section>
        <section class="panel"><h2>Details</h2><dl class="kv">
          <dt>Job</dt><dd class="mono">${esc(job.id(j))}</dd>
          <dt>Deployment</dt><dd><a href="/ui/?deployment=${encodeURIComponent(job.deployment(j) || "")}" data-link>${esc(job.deployment(j))}</a></dd>
          <dt>Requested by</dt><dd>${esc(job.source(j) || "–")}${j.requester ? ` <span class="faint">(${esc(j.requester)})</span>` : ""}</dd>
          <dt>Reason</dt><dd>${esc(job.reason(j) || "–")}</dd>
          <dt>Created</dt><dd>${esc(fmtTime(job.createdMs(j)))}</dd>
          <dt>Finished</dt><dd>${esc(fmtTime(job.finishedMs(j)))}</dd>
          <dt>Commit</dt><dd id="job-commit">${esc(job.commit(j) || "–")}</dd>
          <dt>Downtime budget</dt><dd id="job-budget">${job.budgetMs(j) === null ? "none" : esc(fmtMs(job.budgetMs(j)))}</dd>
          <dt>Cleanup</dt><dd>${esc(job.cleanupState(j) || "–")}</dd>
          ${placementHtml(j)}
        </dl></section>
      </div>
      <section class="panel"><h2>Transition log</h2>${eventsHtml(j)}</section>`;
    for (const seq of openDetails) {
      const details = root.querySelector(`tr[data-seq="${CSS.escape(seq || "")}"] details`);
      if (details) details.open = true;
    }
    drawCharts();
    const cancel = document.getElementById("cancel-job");
    if (cancel) {
      cancel.addEventListener("click", async () => {
        if (!confirm(`Cancel reconfiguration ${jobId}?`)) return;
        cancel.disabled = true;
        try {
          await api(`/v1/reconfigurations/${encodeURIComponent(jobId)}/cancel`, { method: "POST", body: {} });
        } catch (err) {
          root.insertAdjacentHTML("afterbegin", problemHtml(err));
        }
        refresh();
      });
    }
  }

  function drawCharts() {
    if (!current) return;
    const box = document.getElementById("timeline");
    if (box) box.innerHTML = timelineSvg(current, box.clientWidth || 1000);
    const commit = document.getElementById("commit-window");
    const panel = document.getElementById("commit-panel");
    if (commit) {
      const svg = commitWindowSvg(current, commit.clientWidth || 1000);
      commit.innerHTML = svg;
      panel.hidden = !svg;
    }
  }

  const stopResize = onResize(drawCharts);
  refresh().then(() => {
    if (!alive || !current) return;
    if (isTerminal(job.state(current))) return;
    stopFollow = followJob(jobId, {
      onUpdate: () => refresh(),
      onMode: (m) => {
        mode = m;
        const label = document.getElementById("live-mode");
        if (label && current && !isTerminal(job.state(current))) label.outerHTML = liveLabel();
      },
      isFinished: () => !alive || (current && isTerminal(job.state(current))),
    });
    // The running phase's bar grows with the clock even between events.
    ticker = setInterval(() => {
      if (!current || isTerminal(job.state(current))) return;
      drawCharts();
      const elapsed = document.getElementById("progress-elapsed");
      if (elapsed) elapsed.textContent = stepElapsedText(current);
      // The duration card and the timeline's note move with the clock too, so they agree with the
      // timeline's bars between events (a card frozen at the last event read seconds short).
      const duration = document.getElementById("card-duration-value");
      if (duration) duration.textContent = fmtMs(jobDurationMs(current));
      const note = document.getElementById("timeline-note");
      if (note) note.innerHTML = timelineNote(current);
    }, 1000);
  });

  return () => {
    alive = false;
    stopFollow();
    clearInterval(ticker);
    stopResize();
  };
}

render();
