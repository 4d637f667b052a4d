// Incidents: every time a deployment stopped being whole. Rows for the history page, and a page of its
// own that links the jobs it shares (the job it hit, the self-heal jobs that recovered from it).
import { api } from "./api.js";
import { NOT_MEASURED, badge, esc, fmtMs, fmtTime, job, sizeChange, timeCell, toMs } from "./model.js";

const jobLink = (id) => `<a href="/ui/jobs/${encodeURIComponent(id)}" data-link class="mono">${esc(id)}</a>`;
const incidentLink = (id) => `<a href="/ui/incidents/${encodeURIComponent(id)}" data-link class="mono">${esc(id)}</a>`;

/** The client outage in words: "not measured" where nothing measured it (never a 0 nobody saw). */
function outageText(i) {
  if (typeof i.client_outage_ms === "number") return fmtMs(i.client_outage_ms);
  if (i.outage_evidence === "not-measured") return NOT_MEASURED;
  return i.state === "open" ? "not over" : "–";
}

export function incidentRows(incidents) {
  return incidents.map((i) => {
    const jobs = (i.recovery_job_ids || []).length + (i.hit_job_id ? 1 : 0);
    return `<tr class="incident ${esc(i.state)}" data-incident="${esc(i.id)}">
      <td class="job-id" title="${esc(i.message)}">${incidentLink(i.id)}</td><td>${esc(i.deployment)}</td><td>${esc(i.state)}</td>
      <td class="wide-only">${esc(i.reason)}</td><td class="wide-only">${esc((i.engines || []).join(", ") || "–")}</td>
      <td class="created">${timeCell(toMs(i.loss_at))}</td><td class="num">${esc(fmtMs(i.time_to_serving_ms))}</td>
      <td class="num">${esc(outageText(i))}</td><td class="wide-only num">${jobs || "–"}</td></tr>`;
  }).join("");
}

async function jobRow(id, role) {
  let j = null;
  try {
    j = await api(`/v1/reconfigurations/${encodeURIComponent(id)}`);
  } catch {
    return `<tr data-job="${esc(id)}"><td class="job-id">${jobLink(id)}</td><td>${esc(role)}</td><td colspan="5" class="faint">not found</td></tr>`;
  }
  return `<tr data-job="${esc(id)}"><td class="job-id">${jobLink(id)}</td><td>${esc(role)}</td>
    <td class="nowrap">${esc(sizeChange(j))}</td><td>${badge(job.state(j))}</td>
    <td class="created">${timeCell(job.createdMs(j))}</td>
    <td class="num">${esc(job.downtimeMs(j) === null ? "–" : fmtMs(job.downtimeMs(j)))}</td>
    <td class="num client-outage">${esc(job.clientOutageMeasuredMs(j) === null ? NOT_MEASURED : fmtMs(job.clientOutageMeasuredMs(j)))}</td></tr>`;
}

export function incidentPage(view, incidentId, problemHtml) {
  let alive = true;
  view.innerHTML = `<div class="crumbs"><a href="/ui/" data-link>History</a> / incident <span class="mono">${esc(incidentId)}</span></div>
    <div id="incident-root"><div class="panel empty">Loading…</div></div>`;
  const root = document.getElementById("incident-root");
  (async () => {
    let i;
    try {
      i = await api(`/v1/incidents/${encodeURIComponent(incidentId)}`);
    } catch (err) {
      if (alive) root.innerHTML = problemHtml(err);
      return;
    }
    const ids = [...(i.hit_job_id ? [[i.hit_job_id, "hit by the loss right after it"]] : []),
      ...(i.recovery_job_ids || []).map((id) => [id, "self-heal (recovery)"])];
    const rows = await Promise.all(ids.map(([id, role]) => jobRow(id, role)));
    if (!alive) return;
    root.innerHTML = `
      <div class="page-head"><h1>${esc(i.deployment)} <span class="muted">incident</span></h1>
        <span class="badge ${i.state === "open" ? "s-failed" : "s-succeeded"} big" id="incident-state">${esc(i.state)}</span>
        <span class="tag">${esc(i.reason)}</span></div>
      <div class="cards">
        <div class="card"><div class="k">Detected after</div><div class="v" id="incident-detect">${esc(fmtMs(i.time_to_detect_ms))}</div></div>
        <div class="card"><div class="k">Serving again after</div><div class="v" id="incident-serving">${i.time_to_serving_ms == null ? (i.state === "open" ? "not yet" : "–") : esc(fmtMs(i.time_to_serving_ms))}</div></div>
        <div class="card"><div class="k">Client outage</div><div class="v" id="incident-outage">${esc(outageText(i))}${i.outage_evidence && i.outage_evidence !== "not-measured" ? ` <span class="card-note">from ${esc(i.outage_evidence)}</span>` : ""}</div></div>
        <div class="card"><div class="k">Generation hit</div><div class="v">${esc(i.generation)}</div></div>
      </div>
      <section class="panel"><h2>What happened</h2><dl class="kv">
        <dt>Message</dt><dd>${esc(i.message)}</dd>
        <dt>Engines lost</dt><dd class="mono">${esc((i.engines || []).join(", ") || "–")}</dd>
        <dt>Loss at</dt><dd>${esc(fmtTime(toMs(i.loss_at)))} <span class="faint">(${esc(i.loss_evidence || "recorded")})</span></dd>
        <dt>Detected at</dt><dd>${esc(fmtTime(toMs(i.detected_at)))}</dd>
        <dt>Serving again at</dt><dd>${esc(fmtTime(toMs(i.serving_again_at)))}</dd>
        <dt>Outage started at</dt><dd>${esc(fmtTime(toMs(i.outage_started_at)))}</dd>
        <dt>Deployment</dt><dd><a href="/ui/?deployment=${encodeURIComponent(i.deployment)}" data-link>${esc(i.deployment)}</a></dd>
      </dl></section>
      <section class="panel"><div class="panel-head"><h2>Jobs</h2><span class="muted">the job it hit and the jobs that recovered from it</span></div>
        ${rows.length ? `<div class="table-wrap"><table id="incident-jobs"><thead><tr><th>Job</th><th>Role</th><th>Size</th><th>State</th><th>Created (UTC)</th><th class="num">Downtime</th><th class="num">Client outage</th></tr></thead>
        <tbody>${rows.join("")}</tbody></table></div>` : `<div class="empty">No job linked.</div>`}
      </section>`;
  })();
  return () => {
    alive = false;
  };
}
