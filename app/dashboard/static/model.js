// Reading a reconfiguration job as the coordinator returns it, plus formatting helpers.
// One place knows the field names, so the pages stay readable.

export const PHASE_ORDER = ["preparing", "syncing", "committing", "cleaning_up"];
export const ACTIVE_STATES = ["pending", "preparing", "syncing", "committing", "cleaning_up"];
export const TERMINAL_STATES = ["succeeded", "rolled_back", "failed", "cancelled"];
export const ALL_STATES = [...ACTIVE_STATES, ...TERMINAL_STATES];
export const SOURCES = ["api", "cli", "autoscaler", "webhook", "system", "scale-subresource"];
export const CANCELLABLE_STATES = ["pending", "preparing", "syncing"];

export function isTerminal(state) {
  return TERMINAL_STATES.includes(state);
}

export function stateClass(state) {
  if (state === "pending") return "s-pending";
  if (ACTIVE_STATES.includes(state)) return "s-active";
  return `s-${state}`;
}

export function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

export function badge(state, big = false) {
  const label = String(state || "unknown").replace(/_/g, " ");
  return `<span class="badge ${stateClass(state)}${big ? " big" : ""}" data-state="${esc(state)}">${esc(label)}</span>`;
}

/** Milliseconds since the epoch from an ISO string (naive = UTC) or epoch seconds/milliseconds. */
export function toMs(value) {
  if (value === null || value === undefined || value === "") return null;
  if (typeof value === "number") return value > 1e11 ? value : value * 1000;
  if (/^-?\d+(\.\d+)?$/.test(value)) return toMs(Number(value));
  const iso = /[zZ]|[+-]\d\d:?\d\d$/.test(value) ? value : `${value}Z`;
  const ms = Date.parse(iso);
  return Number.isNaN(ms) ? null : ms;
}

// One duration format and one clock on every page, the CLI's too (app/cli/client.py): durations by size
// ("6.67 ms", "18.0 ms", "320 ms", "1.92 s", "37.7 s", "2 min 5 s"); times in UTC with the zone named
// ("2026-12-06 07:17:02 UTC"; a time alone, "07:17:02.123", sits under a heading that names UTC).
export function fmtMs(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "–";
  if (ms === 0) return "0 ms";
  if (ms < 10) return `${ms.toFixed(2)} ms`;
  if (ms < 100) return `${ms.toFixed(1)} ms`;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  const seconds = Math.round(ms / 1000);
  return `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
}

export const NOT_MEASURED = "not measured";

export function fmtTime(ms, withDate = true) {
  if (ms === null || ms === undefined) return "–";
  const iso = new Date(ms).toISOString();  // always UTC
  if (!withDate) return iso.slice(11, 23);
  return `${iso.slice(0, 10)} ${iso.slice(11, 19)} UTC`;
}

/** A table cell's time (the column's heading names UTC): date and clock, which stack in a narrow window. */
export function timeCell(ms) {
  if (ms === null || ms === undefined) return "–";
  const iso = new Date(ms).toISOString();
  return `<span class="date">${iso.slice(0, 10)}</span> <span class="clock">${iso.slice(11, 19)}</span>`;
}

/** A short clock for chart labels and narrow cells: "07:17" (UTC). */
export function fmtClock(ms) {
  return ms === null || ms === undefined ? "–" : new Date(ms).toISOString().slice(11, 16);
}

export function fmtAgo(ms) {
  if (ms === null || ms === undefined) return "";
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 5) return "just now";
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

/** The tail of a sortable id (prefix_<time><random>): the random part tells jobs apart. */
export function shortId(id) {
  const s = String(id ?? "");
  return s.length > 12 ? `…${s.slice(-6)}` : s;
}

const first = (obj, ...keys) => {
  for (const k of keys) if (obj && obj[k] !== undefined && obj[k] !== null) return obj[k];
  return null;
};

export const job = {
  id: (j) => first(j, "id", "job_id"),
  deployment: (j) => first(j, "deployment", "deployment_name", "deployment_id"),
  state: (j) => first(j, "state"),
  source: (j) => first(j, "requested_by", "source"),
  reason: (j) => first(j, "reason"),
  fromSize: (j) => first(j, "from_dp_size", "from_size", "current_dp_size"),
  toSize: (j) => first(j, "to_dp_size", "target_dp_size", "to_size"),
  fromGeneration: (j) => first(j, "from_generation", "old_generation"),
  toGeneration: (j) => first(j, "to_generation", "new_generation", "generation"),
  warmup: (j) => first(j, "warmup_policy", "warmup_policy_requested"),
  strategy: (j) => first(j, "strategy"),
  commit: (j) => first(j, "commit", "commit_mode"),
  budgetMs: (j) => {
    const v = first(j, "max_downtime_ms");
    return v === null ? null : Number(v);
  },
  progressPercent: (j) => Number(first(j.progress || {}, "percent") ?? first(j, "progress_percent") ?? 0),
  progressStep: (j) => first(j.progress || {}, "step") ?? first(j, "progress_step"),
  createdMs: (j) => toMs(first(j, "created_at")),
  startedMs: (j) => toMs(first(j, "started_at")),
  finishedMs: (j) => toMs(first(j, "finished_at", "ended_at", "completed_at")),
  downtimeMs: (j) => {
    const v = first(j, "downtime_ms");
    return v === null ? null : Number(v);
  },
  // Measured from outside by the canary probe (null where no probe ran): the outage (the longest
  // stretch with no successful answer) is the headline, the slowest answer beside it.
  clientOutageMs: (j) => {
    const v = first(j, "client_outage_ms");
    return v === null ? null : Number(v);
  },
  // The outage, or null where nothing measured it: no probe ran, or it sent no canary (a 0 from no
  // canary is no measurement; the CLI reads it the same way).
  clientOutageMeasuredMs: (j) => {
    const v = first(j, "client_outage_ms");
    if (v === null) return null;
    const sent = (j.probe || {}).canaries_sent;
    return Number(v) === 0 && sent === 0 ? null : Number(v);
  },
  canariesFailed: (j) => Number((j.probe || {}).canaries_failed || 0),
  incidentId: (j) => first(j, "incident_id"),
  lossMs: (j) => toMs(first(j, "loss_at")),
  timeToDetectMs: (j) => first(j, "time_to_detect_ms"),
  timeToServingMs: (j) => first(j, "time_to_serving_ms"),
  clientSlowestAnswerMs: (j) => {
    const v = first(j, "client_slowest_answer_ms");
    return v === null ? null : Number(v);
  },
  outagePhase: (j) => first(j.probe || {}, "outage_phase"),
  slowestAnswerPhase: (j) => first(j.probe || {}, "slowest_answer_phase"),
  // Jobs recorded before the two were told apart: one figure that counted slow answers as an outage.
  oldClientDowntimeMs: (j) => {
    if (first(j, "client_outage_ms") !== null) return null;
    const v = first(j, "client_downtime_ms");
    return v === null ? null : Number(v);
  },
  error: (j) => first(j, "error"),
  cleanupState: (j) => first(j, "cleanup_state"),
  cleanupDetail: (j) => first(j, "cleanup", "cleanup_detail", "cleanup_outcome"),
  events: (j) => first(j, "events", "transitions", "log") || [],

  /** [{name, start, end}] in the order the job runs them. */
  phases(j) {
    const raw = first(j, "phases") || {};
    const list = Array.isArray(raw)
      ? raw.map((p) => [p.name, p])
      : Object.entries(raw);
    const rows = list.map(([name, p]) => ({
      name,
      start: toMs(first(p, "started_at", "start")),
      end: toMs(first(p, "ended_at", "end", "finished_at")),
    }));
    const rank = (n) => {
      const i = PHASE_ORDER.indexOf(n);
      return i === -1 ? PHASE_ORDER.length : i;
    };
    return rows.sort((a, b) => rank(a.name) - rank(b.name) || (a.start ?? 0) - (b.start ?? 0));
  },

  /** [{engineId, role, ranks, generation, generations, start, end, ms}] for every engine in the job. */
  engines(j) {
    const results = first(j, "engine_results") || [];
    const detail = first(j, "downtime_detail", "downtime") || {};
    const detailIntervals = {};
    const perEngine = first(detail, "engines", "intervals", "per_engine") || [];
    if (Array.isArray(perEngine)) {
      for (const row of perEngine) detailIntervals[first(row, "engine_id", "engine")] = row;
    } else if (typeof perEngine === "object") {
      Object.assign(detailIntervals, perEngine);
    }
    const rows = (Array.isArray(results) ? results : Object.entries(results).map(([engine_id, r]) => ({ engine_id, ...r })))
      .map((r) => {
        const id = first(r, "engine_id", "id");
        const pause = first(r, "pause", "pause_interval") || detailIntervals[id] || {};
        const start = toMs(first(pause, "paused_at", "start"));
        const end = toMs(first(pause, "resumed_at", "end"));
        let ms = first(pause, "pause_ms", "ms", "downtime_ms");
        if (ms === null && start !== null && end !== null) ms = end - start;
        const part = (k) => Number(first(pause, k) ?? 0);
        return {
          breakdown: {
            boundary_wait: part("boundary_wait_ms"), blocking_prepare: part("blocking_prepare_ms"),
            warmup: part("warmup_ms"), capture: part("capture_ms"), switch: part("switch_ms"), resume: part("resume_ms"),
          },
          engineId: id,
          role: first(r, "role"),
          ranks: "old_rank" in r || "new_rank" in r ? [r.old_rank ?? null, r.new_rank ?? null] : first(r, "ranks", "rank"),
          generation: first(r, "generation"),
          // Each engine's own generation before and after the job (older records: only `generation`).
          generations: "generation_before" in r ? [r.generation_before ?? null, r.generation_after ?? null] : null,
          phase: first(r, "phase", "state", "result"),
          error: first(r, "error"),
          start, end, ms: ms === null ? null : Number(ms),
        };
      });
    for (const [id, pause] of Object.entries(detailIntervals)) {
      if (rows.some((r) => r.engineId === id) || !pause || typeof pause !== "object") continue;
      const start = toMs(first(pause, "paused_at", "start"));
      const end = toMs(first(pause, "resumed_at", "end"));
      rows.push({ engineId: id, role: null, ranks: null, generation: null, generations: null, phase: null, error: null,
        start, end, ms: Number(first(pause, "pause_ms", "ms") ?? (end !== null && start !== null ? end - start : NaN)) });
    }
    return rows;
  },
};

export function sizeChange(j) {
  const from = job.fromSize(j);
  const to = job.toSize(j);
  return `${from ?? "?"} → ${to ?? "?"}`;
}

/** From creation to the end (now while it runs): the job's duration, queue included. */
export function jobDurationMs(j) {
  const start = job.createdMs(j);
  const end = jobEndMs(j);
  return start !== null && end !== null ? Math.max(0, end - start) : null;
}

/** When the job ended: its finish time, else (older records) its last phase's end; now while it runs. */
export function jobEndMs(j) {
  return job.finishedMs(j) ?? (isTerminal(job.state(j)) ? lastPhaseEnd(j) : Date.now());
}

/** The time it sat queued before its first phase (null when it did not start). */
export function queuedMs(j) {
  const created = job.createdMs(j);
  const started = job.startedMs(j) ?? job.phases(j).map((p) => p.start).find((v) => v !== null) ?? null;
  return created !== null && started !== null ? Math.max(0, started - created) : null;
}

/** A job that ended without a new generation: cancelled, or rolled back to the one it started on. */
export function keptGeneration(j) {
  return ["cancelled", "rolled_back"].includes(job.state(j));
}

function lastPhaseEnd(j) {
  const ends = job.phases(j).map((p) => p.end).filter((v) => v !== null);
  return ends.length ? Math.max(...ends) : null;
}
