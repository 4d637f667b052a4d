// Plain SVG charts: a job's timeline, its commit window, and downtime per job.
import { NOT_MEASURED, badge, esc, fmtClock, fmtMs, fmtTime, job, sizeChange, stateClass, isTerminal } from "./model.js";

const LABEL_W = 150;
const ROW_H = 26;
const BAR_H = 14;

/** Round tick step (1, 2, 5 x 10^n) giving about `count` ticks over `span`. */
function niceStep(span, count) {
  const raw = span / Math.max(1, count);
  const pow = 10 ** Math.floor(Math.log10(raw || 1));
  for (const m of [1, 2, 5, 10]) if (raw <= m * pow) return m * pow;
  return 10 * pow;
}

function timeAxis(t0, t1, x, top, bottom, count) {
  const span = t1 - t0;
  const step = niceStep(span, count);
  let out = "";
  for (let t = 0; t <= span + 1e-9; t += step) {
    const px = x(t0 + t);
    out += `<g class="grid"><line x1="${px}" x2="${px}" y1="${top}" y2="${bottom}"></line></g>`;
    out += `<text x="${px}" y="${bottom + 14}" text-anchor="middle">+${esc(axisLabel(t))}</text>`;
  }
  return out;
}

/** Short tick labels: 0, 250 ms, 1.5 s, 2 s. */
function axisLabel(ms) {
  if (Math.abs(ms) < 1e-9) return "0";
  if (Math.abs(ms) < 1000) return `${+ms.toPrecision(3)} ms`;
  return `${+(ms / 1000).toPrecision(3)} s`;
}

function bar(cls, x0, x1, y, title, minWidth = 2) {
  const w = Math.max(minWidth, x1 - x0);
  return `<rect class="${cls}" x="${x0.toFixed(1)}" y="${y}" width="${w.toFixed(1)}" height="${BAR_H}" rx="3"><title>${esc(title)}</title></rect>`;
}

/**
 * The whole job on one time axis: a row per phase (start to end; an open phase runs to now),
 * then a row per engine with its pause interval, and the union of pauses (the job's downtime).
 */
export function timelineSvg(j, width, nowMs = Date.now()) {
  const phases = job.phases(j).filter((p) => p.start !== null);
  const engines = job.engines(j);
  const pausing = engines.filter((e) => e.start !== null);
  // The axis starts when the work starts: time spent queued (pending) would squash the phases.
  const times = [...phases.flatMap((p) => [p.start, p.end]), ...pausing.flatMap((e) => [e.start, e.end])]
    .filter((v) => v !== null);
  if (!times.length) return `<div class="empty">No phase has started yet.</div>`;
  const running = !isTerminal(job.state(j));
  // Open bars (a phase never closed, an engine never resumed) run to now while the job runs, and to
  // the job's end once it is over, so a finished job's axis does not keep growing.
  if (!running) nowMs = Math.max(...times, job.finishedMs(j) ?? 0);
  const t0 = Math.min(...times);
  let t1 = Math.max(...times, running ? nowMs : 0);
  if (t1 - t0 < 1) t1 = t0 + 1;
  const rows = phases.length + engines.length + (pausing.length ? 1 : 0) + (engines.length ? 1 : 0);
  const plotW = Math.max(200, width - LABEL_W - 90);
  const x = (t) => LABEL_W + ((t - t0) / (t1 - t0)) * plotW;
  const height = rows * ROW_H + 40;
  let body = "";
  let y = 8;
  for (const p of phases) {
    const end = p.end ?? nowMs;
    const open = p.end === null;
    const duration = end - p.start;
    body += `<text class="label-strong" x="0" y="${y + 11}">${esc(p.name.replace(/_/g, " "))}</text>`;
    body += bar(`bar-phase${open ? " open" : ""}`, x(p.start), x(end), y, `${p.name}: ${fmtMs(duration)}${open ? " (running)" : ""}`);
    body += `<text x="${x(end) + 6}" y="${y + 11}">${esc(fmtMs(duration))}${open ? " …" : ""}</text>`;
    body += `<g data-phase="${esc(p.name)}"></g>`;
    y += ROW_H;
  }
  if (engines.length) {
    body += `<text x="0" y="${y + 14}" class="faint">engine pauses</text>`;
    body += `<line x1="${LABEL_W}" x2="${LABEL_W + plotW}" y1="${y + 4}" y2="${y + 4}" stroke="var(--border)"></line>`;
    y += ROW_H;
  }
  for (const e of engines) {
    const role = e.role ? ` · ${e.role}` : "";
    body += `<text x="0" y="${y + 11}"><tspan class="label-strong">${esc(shortLabel(e.engineId))}</tspan>${esc(role)}</text>`;
    body += `<rect class="row-bg" x="${LABEL_W}" y="${y + BAR_H / 2 - 1}" width="${plotW}" height="2"></rect>`;
    if (e.start !== null) {
      const end = e.end ?? nowMs;
      body += bar("bar-pause", x(e.start), x(end), y, `${e.engineId} paused ${fmtMs(e.ms ?? end - e.start)}`, 3);
      body += `<text x="${x(end) + 6}" y="${y + 11}">${esc(fmtMs(e.ms ?? end - e.start))}</text>`;
    } else {
      body += `<text x="${LABEL_W + plotW + 6}" y="${y + 11}" class="faint">no pause</text>`;
    }
    y += ROW_H;
  }
  if (pausing.length) {
    const start = Math.min(...pausing.map((e) => e.start));
    const end = Math.max(...pausing.map((e) => e.end ?? nowMs));
    const downtime = job.downtimeMs(j);
    body += `<text class="label-strong" x="0" y="${y + 11}">downtime</text>`;
    body += bar("bar-union", x(start), x(end), y, `deployment down ${fmtMs(downtime ?? end - start)}`, 3);
    body += `<text x="${x(end) + 6}" y="${y + 11}">${esc(fmtMs(downtime ?? end - start))}</text>`;
    y += ROW_H;
  }
  const axis = timeAxis(t0, t1, x, 2, y, Math.max(3, Math.floor(plotW / 110)));
  let nowLine = "";
  if (running) nowLine = `<line class="now-line" x1="${x(nowMs)}" x2="${x(nowMs)}" y1="2" y2="${y}"></line>`;
  return `<svg class="chart timeline" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img"
    aria-label="timeline of job ${esc(job.id(j))}" data-start="${fmtTime(t0)}">${axis}${nowLine}${body}</svg>`;
}

/** The commit window zoomed in: each engine's pause on a millisecond axis. */
export function commitWindowSvg(j, width) {
  const engines = job.engines(j).filter((e) => e.start !== null && e.end !== null);
  if (!engines.length) return "";
  const t0 = Math.min(...engines.map((e) => e.start));
  let t1 = Math.max(...engines.map((e) => e.end));
  if (t1 - t0 < 0.5) t1 = t0 + 0.5;
  const pad = (t1 - t0) * 0.04;
  const a = t0 - pad;
  const b = t1 + pad;
  const plotW = Math.max(200, width - LABEL_W - 90);
  const x = (t) => LABEL_W + ((t - a) / (b - a)) * plotW;
  let y = 8;
  let body = "";
  for (const e of engines) {
    body += `<text x="0" y="${y + 11}" class="label-strong">${esc(shortLabel(e.engineId))}</text>`;
    body += bar("bar-pause", x(e.start), x(e.end), y, `${e.engineId}: paused ${fmtMs(e.ms ?? e.end - e.start)}${breakdownText(e)}`, 3);
    body += breakdownSegments(e, x, y);
    body += `<text x="${x(e.end) + 6}" y="${y + 11}">${esc(fmtMs(e.ms ?? e.end - e.start))}</text>`;
    y += ROW_H;
  }
  const axisLines = [];
  // Ticks at round offsets from the first pause, so "0 ms" marks where the window opens.
  const step = niceStep(b - a, Math.max(3, Math.floor(plotW / 110)));
  for (let r = Math.ceil((a - t0) / step) * step; r <= b - t0 + 1e-9; r += step) {
    const px = x(t0 + r);
    axisLines.push(`<g class="grid"><line x1="${px}" x2="${px}" y1="2" y2="${y}"></line></g>`);
    axisLines.push(`<text x="${px}" y="${y + 14}" text-anchor="middle">${esc(axisLabel(r))}</text>`);
  }
  const height = y + 24;
  return `<svg class="chart commit-window" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img"
    aria-label="commit window">${axisLines.join("")}${body}</svg>`;
}

// Where a pause went: the agent's own timings, drawn inside its bar. Work right after the pause
// (reaching the step boundary, blocking prepare, deferred warm-up and graph capture) from the left; the switch and the
// resume at the right; the gap between is the wait for the coordinator's switch command.
const LEADING = [["boundary_wait", "step boundary"], ["blocking_prepare", "blocking prepare"], ["warmup", "deferred warm-up"], ["capture", "graph capture"]];
const TRAILING = [["switch", "switch"], ["resume", "resume"]];

function breakdownText(e) {
  const parts = [...LEADING, ...TRAILING].filter(([k]) => e.breakdown && e.breakdown[k] > 0)
    .map(([k, label]) => `${label} ${fmtMs(e.breakdown[k])}`);
  return parts.length ? `\n${parts.join("\n")}` : "";
}

function breakdownSegments(e, x, y) {
  if (!e.breakdown) return "";
  let out = "";
  const segment = (key, label, from, to) => {
    const x0 = x(from);
    const w = x(to) - x0;
    if (w < 0.5) return;
    out += `<rect class="seg seg-${key}" x="${x0.toFixed(1)}" y="${y + 3}" width="${w.toFixed(1)}" height="${BAR_H - 6}"><title>${esc(`${e.engineId}: ${label} ${fmtMs(to - from)}`)}</title></rect>`;
  };
  let t = e.start;
  for (const [key, label] of LEADING) {
    const ms = e.breakdown[key];
    if (ms > 0) segment(key, label, t, Math.min(e.end, t + ms));
    t += ms;
  }
  t = e.end;
  for (const [key, label] of TRAILING.slice().reverse()) {
    const ms = e.breakdown[key];
    if (ms > 0) segment(key, label, Math.max(e.start, t - ms), t);
    t -= ms;
  }
  return out;
}

export function commitLegend() {
  const item = (cls, label) => `<span><i class="${cls}"></i>${label}</span>`;
  return `<div class="legend">${item("lg-pause", "paused")}${item("seg-boundary_wait", "reach step boundary")}${item("seg-blocking_prepare", "blocking prepare")}${item("seg-warmup", "deferred warm-up")}${item("seg-capture", "graph capture")}${item("seg-switch", "switch")}${item("seg-resume", "resume")}</div>`;
}

/**
 * A log scale over `values` (ms, the positive ones): whole decades from below the smallest to above
 * the largest, so a 7 s blocking job and 6 ms background jobs both read on one chart.
 */
export function logScale(values, top, bottom) {
  const positive = values.filter((v) => v !== null && v > 0);
  const lo = 10 ** Math.floor(Math.log10(Math.min(1, ...positive)));
  let hi = 10 ** Math.ceil(Math.log10(Math.max(10, ...positive)));
  if (hi / lo < 100) hi = lo * 100;
  const span = Math.log10(hi / lo);
  const y = (v) => (v <= lo ? bottom : bottom - (Math.log10(v / lo) / span) * (bottom - top));
  const ticks = [];
  for (let t = lo; t <= hi * 1.0001; t *= 10) ticks.push(+t.toPrecision(1));
  return { lo, hi, y, ticks };
}

/**
 * Downtime of each job (oldest left) on a log scale, coloured by outcome, blocking jobs striped;
 * beside each bar what the canary probe saw: the client outage (an outlined bar) and the slowest
 * answer (a tick). A click opens the job.
 */
export function downtimeChartSvg(jobs, width) {
  const rows = jobs.slice().reverse();
  if (!rows.length) return `<div class="empty">No jobs to chart.</div>`;
  const height = 204;
  const left = 56;
  const bottom = height - 40;
  const plotW = width - left - 8;
  const slot = plotW / rows.length;
  const barW = Math.max(3, Math.min(36, slot * 0.6));
  const values = rows.flatMap((j) => [job.downtimeMs(j), job.clientOutageMeasuredMs(j), job.clientSlowestAnswerMs(j)]);
  // Each bar is labelled by what the job did and when (UTC), as many as fit side by side.
  const labelEvery = Math.max(1, Math.ceil(52 / slot));
  const { y, ticks } = logScale(values, 10, bottom);
  let out = `<defs><pattern id="blocking-stripes" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
    <rect width="3" height="6" class="stripe"></rect></pattern></defs>`;
  for (const v of ticks) {
    out += `<g class="grid"><line x1="${left}" x2="${width - 8}" y1="${y(v)}" y2="${y(v)}"></line></g>`;
    out += `<text class="tick" data-ms="${v}" x="${left - 6}" y="${y(v) + 4}" text-anchor="end">${esc(axisLabel(v))}</text>`;
  }
  rows.forEach((j, i) => {
    const v = job.downtimeMs(j);
    const cx = left + slot * i + slot / 2;
    const h = v ? Math.max(1.5, bottom - y(v)) : 0;
    const id = job.id(j);
    const strategy = job.strategy(j) || "background";
    const x0 = (cx - barW / 2).toFixed(1);
    const title = `${id} · ${job.deployment(j)} ${sizeChange(j)} · ${fmtTime(job.createdMs(j))} · ${strategy} · ${job.state(j)} · downtime ${v === null ? "–" : fmtMs(v)}`;
    out += `<a href="/ui/jobs/${encodeURIComponent(id)}" data-link>`;
    out += `<rect class="bar ${stateClass(job.state(j))} strategy-${esc(strategy)}" data-job="${esc(id)}" data-strategy="${esc(strategy)}" x="${x0}" y="${(bottom - h).toFixed(1)}" width="${barW.toFixed(1)}" height="${h.toFixed(1)}" rx="2"><title>${esc(title)}</title></rect>`;
    if (strategy === "blocking" && h > 0) out += `<rect class="stripes" x="${x0}" y="${(bottom - h).toFixed(1)}" width="${barW.toFixed(1)}" height="${h.toFixed(1)}" fill="url(#blocking-stripes)" pointer-events="none"></rect>`;
    if (!v) out += `<rect x="${x0}" y="${bottom - 2}" width="${barW.toFixed(1)}" height="2" class="bar ${stateClass(job.state(j))}" opacity=".5"></rect>`;
    const outage = job.clientOutageMeasuredMs(j);
    const slowest = job.clientSlowestAnswerMs(j);
    const cw = Math.max(3, barW / 3);
    const cx0 = cx + barW / 2 + 1;
    if (outage !== null) {
      const ch = outage ? Math.max(1.5, bottom - y(outage)) : 0;
      const where = job.outagePhase(j) ? ` in ${job.outagePhase(j)}` : "";
      out += `<rect class="bar client-bar" data-client-job="${esc(id)}" x="${cx0.toFixed(1)}" y="${(bottom - ch).toFixed(1)}" width="${cw.toFixed(1)}" height="${ch.toFixed(1)}" fill="none"><title>${esc(`client outage ${fmtMs(outage)}${outage ? where : ""} (canary probe)`)}</title></rect>`;
    }
    if (slowest !== null) {
      const where = job.slowestAnswerPhase(j) ? ` in ${job.slowestAnswerPhase(j)}` : "";
      out += `<rect class="slowest-tick" data-slowest-job="${esc(id)}" x="${(cx0 - 1).toFixed(1)}" y="${(y(slowest) - 1).toFixed(1)}" width="${(cw + 2).toFixed(1)}" height="2"><title>${esc(`slowest answer ${fmtMs(slowest)}${where} (canary probe)`)}</title></rect>`;
    }
    out += `</a>`;
    if (i % labelEvery === 0) {
      out += `<text x="${cx}" y="${bottom + 15}" text-anchor="middle" class="bar-label" data-label-job="${esc(id)}">${esc(sizeChange(j))}</text>`;
      out += `<text x="${cx}" y="${bottom + 28}" text-anchor="middle" class="faint">${esc(fmtClock(job.createdMs(j)))}</text>`;
    }
  });
  out += `<line x1="${left}" x2="${width - 8}" y1="${bottom}" y2="${bottom}" stroke="var(--border)"></line>`;
  return `<svg class="chart downtime-chart" data-scale="log" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img" aria-label="downtime per job, log scale">${out}</svg>`;
}

export function chartLegend() {
  const item = (cls, label) => `<span><i class="lg-${cls}"></i>${label}</span>`;
  return `<div class="legend">${item("ok", "succeeded")}${item("warn", "rolled back")}${item("bad", "failed")}${item("idle", "cancelled / pending")}${item("run", "running")}${item("blocking", "blocking strategy (striped)")}${item("client", `client outage (canary probe; none drawn: ${NOT_MEASURED})`)}${item("slowest", "slowest answer (canary probe)")}<span class="faint">log scale · labels: size change, created (UTC)</span></div>`;
}

function shortLabel(id) {
  const s = String(id ?? "?");
  return s.length > 20 ? `${s.slice(0, 19)}…` : s;
}

export { badge };
