// gpupool dashboard: reads the same REST API as the CLI with the token signed in with
// (kept in sessionStorage, sent as a bearer token) and redraws its panels every
// REFRESH_MS. Plain DOM, no framework, nothing fetched from anywhere but this server.
"use strict";

const REFRESH_MS = 2000;
const TOKEN_KEY = "gpupool-token";
const EVENTS_KEPT = 200;
const EVENTS_SHOWN = 60;
const LOG_KEPT = 64 * 1024;
const LOG_READ = 1 << 20;
const EVENT_PAGES = 50; // first load: at most this many pages of 500 to reach the newest

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  me: null,
  timer: null,
  busy: false,
  eventsAfter: 0,
  events: [],
  eventsPrimed: false,
  jobsById: new Map(),
  open: null, // {id, logOffset, logText, refused, eventsAfter, events}
};

class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

// ---- helpers -------------------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function table(headers, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows));
}

function bar(fraction, label) {
  const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
  const b = h("div", { class: fraction > 1 ? "bar over" : "bar", title: label || "" },
    h("span", {}));
  b.firstChild.style.width = pct.toFixed(1) + "%";
  return b;
}

function num(v, digits, unit) {
  if (v === null || v === undefined) return "–";
  return Number(v).toFixed(digits) + (unit || "");
}

function clock(at) {
  if (at === null || at === undefined) return "–";
  return new Date(at * 1000).toISOString().slice(5, 19).replace("T", " ");
}

function ago(at) {
  if (at === null || at === undefined) return "";
  const s = Math.max(0, Date.now() / 1000 - at);
  if (s < 90) return Math.round(s) + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function panel(id) {
  const el = document.getElementById(id);
  return { el, status: el.querySelector(".status"), body: el.querySelector(".body") };
}

function setStatus(p, text, error) {
  p.status.textContent = text || "";
  p.status.classList.toggle("error", !!error);
}

async function api(path, raw) {
  const headers = {};
  if (state.token) headers.Authorization = "Bearer " + state.token;
  const r = await fetch(path, { headers, cache: "no-store" });
  if (!r.ok) {
    let detail = r.status + " " + r.statusText;
    try {
      const body = await r.json();
      if (typeof body.detail === "string") detail = body.detail;
      else if (body.detail) detail = JSON.stringify(body.detail);
    } catch (_) { /* not JSON: keep the status line */ }
    throw new ApiError(r.status, detail);
  }
  return raw ? r : r.json();
}

function notice(text) {
  const n = document.getElementById("notice");
  n.textContent = text || "";
  n.hidden = !text;
}

// ---- sign-in ------------------------------------------------------------------------------
async function signIn(token) {
  state.token = token;
  try {
    state.me = await api("/v1/me");
  } catch (err) {
    state.me = null;
    state.token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    stop();
    showWho();
    notice(err.message);
    return;
  }
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  showWho();
  if (state.me.auth && !state.me.signed_in) {
    stop();
    notice("Sign in with a gpupool token (gpupool token create, or the admin token the " +
      "server printed at its first start) to see the pool.");
    return;
  }
  notice("");
  start();
}

function showWho() {
  const who = document.getElementById("whoami");
  const me = state.me;
  if (!me) who.textContent = "not signed in";
  else if (!me.auth) who.textContent = "no token needed (auth off)";
  else if (!me.signed_in) who.textContent = "not signed in";
  else who.textContent = `signed in as ${me.name} (${me.role}${me.team ? ", team " + me.team : ""})`;
  document.getElementById("signout-button").hidden = !(me && me.signed_in && me.auth);
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = "";
  closeJob();
  for (const id of ["panel-gpus", "panel-signals", "panel-teams", "panel-queue",
    "panel-services", "panel-jobs", "panel-events"]) {
    const p = panel(id);
    p.body.replaceChildren();
    setStatus(p, "");
  }
  state.events = [];
  state.eventsAfter = 0;
  state.eventsPrimed = false;
  signIn("");
}

function start() {
  stop();
  tick();
}

function stop() {
  if (state.timer !== null) clearTimeout(state.timer);
  state.timer = null;
}

// ---- the refresh loop ---------------------------------------------------------------------
async function tick() {
  state.timer = null;
  if (!state.busy) {
    state.busy = true;
    try {
      await refresh();
    } finally {
      state.busy = false;
    }
  }
  if (state.me && (state.me.signed_in || !state.me.auth)) {
    state.timer = setTimeout(tick, REFRESH_MS);
  }
}

async function refresh() {
  const calls = {
    cluster: api("/v1/cluster"),
    running: api("/v1/jobs?state=running&limit=1000"),
    pending: api("/v1/jobs?state=pending&limit=1000"),
    suspended: api("/v1/jobs?state=suspended&limit=1000"),
    recent: api("/v1/jobs?order=desc&limit=50"),
    teams: api("/v1/teams"),
    services: api("/v1/services"),
  };
  const got = {};
  let unauthorized = null;
  await Promise.all(Object.entries(calls).map(async ([k, p]) => {
    try {
      got[k] = await p;
    } catch (err) {
      got[k] = err;
      if (err.status === 401) unauthorized = err;
    }
  }));
  if (unauthorized) {
    stop();
    state.me = null;
    showWho();
    notice(unauthorized.message);
    return;
  }
  const jobs = [];
  for (const k of ["running", "pending", "suspended", "recent"]) {
    if (!(got[k] instanceof Error)) jobs.push(...got[k].jobs);
  }
  state.jobsById = new Map(jobs.map((j) => [j.id, j]));
  drawCluster(got.cluster);
  drawQueue(got.pending, got.suspended);
  drawJobs(got.recent);
  drawTeams(got.teams);
  drawServices(got.services);
  await refreshEvents();
  if (state.open) await refreshJob();
  document.getElementById("updated").textContent = "updated " + new Date().toISOString()
    .slice(11, 19) + " UTC, every " + REFRESH_MS / 1000 + " s";
}

function failed(p, result) {
  if (result instanceof Error) {
    setStatus(p, result.message, true);
    return true;
  }
  return false;
}

// ---- panels -------------------------------------------------------------------------------
function jobLabel(id) {
  const j = state.jobsById.get(id);
  if (!j) return `job ${id}`;
  return `${j.name} (#${id}, ${j.team})`;
}

function drawCluster(view) {
  const gp = panel("panel-gpus");
  const sp = panel("panel-signals");
  if (failed(gp, view)) {
    setStatus(sp, view.message, true);
    return;
  }
  const nodes = view.nodes.map((node) => {
    const gpus = node.gpus.map((g) => {
      const used = g.mem_used_mib;
      const total = g.mem_total_mib;
      const who = g.job_id === null
        ? h("span", { class: "muted" }, "idle")
        : h("span", { class: "who" }, jobLabel(g.job_id));
      const kept = g.reserved_for === null || g.reserved_for === undefined ? null
        : h("span", { class: "badge kept", title: "kept for a waiting wide job: nothing that "
            + "would still run when it starts may take it" }, `reserved for #${g.reserved_for}`);
      const cls = ["gpu", g.job_id === null ? "idle" : "busy", g.healthy ? "" : "unhealthy",
        kept === null ? "" : "reserved"];
      return h("div", { class: cls.join(" "), "data-gpu": `${node.name}/${g.index}` },
        h("div", {}, h("b", {}, `GPU ${g.index}`), " ", g.model,
          g.reclaimable ? h("span", { class: "badge warn" }, "reclaimable") : null, kept,
          g.healthy ? null : h("span", { class: "badge bad" }, g.problem || "unhealthy")),
        h("div", {}, who),
        h("div", {}, "memory ", used === null ? "–" : `${(used / 1024).toFixed(1)}`,
          total ? ` / ${(total / 1024).toFixed(1)} GiB` : " GiB"),
        bar(total ? used / total : 0, "memory used"),
        h("div", {}, "utilisation ", num(g.util_pct, 0, " %")),
        bar((g.util_pct || 0) / 100, "SM utilisation"),
        h("div", {}, "power ", num(g.power_w, 0, " W"),
          g.power_limit_w ? ` / ${num(g.power_limit_w, 0, " W")}` : "",
          ", ", num(g.temp_c, 0, " °C")));
    });
    const badge = node.state === "up" ? "badge ok" : "badge bad";
    return h("div", { class: "node", "data-node": node.name },
      h("h3", {}, node.name, " ", h("span", { class: badge }, node.state),
        h("span", { class: "muted" }, `  ${node.gpu_model} · site ${node.site}`)),
      h("div", { class: "gpus" }, gpus));
  });
  gp.body.replaceChildren(...nodes);
  const busy = view.nodes.reduce((n, x) => n + x.gpus.filter((g) => g.job_id !== null).length, 0);
  const all = view.nodes.reduce((n, x) => n + x.gpus.length, 0);
  setStatus(gp, `${view.nodes.length} node(s), ${busy} of ${all} GPUs in use; ` +
    `${view.queue.running} running, ${view.queue.pending} waiting` +
    (view.scheduler_error ? `; scheduler error: ${view.scheduler_error}` : ""),
    !!view.scheduler_error);

  const sig = view.signals;
  const flagged = [];
  for (const node of view.nodes) {
    for (const g of node.gpus) if (g.reclaimable) flagged.push(`${node.name} GPU ${g.index}`);
  }
  sp.body.replaceChildren(h("dl", { class: "facts" },
    h("dt", {}, "scale out"),
    h("dd", { id: "signal-scale-out" }, sig.scale_out
      ? h("span", { class: "badge warn" }, "yes: the fleet is busy, add GPUs")
      : h("span", { class: "badge ok" }, "no")),
    h("dt", {}, "reclaimable"),
    h("dd", { id: "signal-reclaimable" }, flagged.length
      ? `${flagged.length} GPU(s): ${flagged.join(", ")}` : "none"),
    h("dt", {}, "mean utilisation"),
    h("dd", {}, num(sig.mean_util_pct, 1, " %")),
    h("dt", {}, "window"),
    h("dd", {}, num(sig.window_s, 0, " s")),
    h("dt", {}, "evaluated"),
    h("dd", {}, sig.evaluated_at ? `${clock(sig.evaluated_at)} (${ago(sig.evaluated_at)} ago)`
      : "not yet (needs a full window of samples)")));
  setStatus(sp, "The monitor: GPUs held but barely used, and whether the pool needs more.");
}

function reasonCell(j) {
  return h("td", { class: "text" },
    j.reason_code ? h("span", { class: "code" }, j.reason_code) : null,
    j.reason_code ? " " : "",
    (j.reason || "").replace(/^[A-Z][A-Za-z]+: /, ""));
}

function jobRow(j, cells) {
  const tr = h("tr", { class: "clickable" + (state.open && state.open.id === j.id ? " selected" : ""),
    "data-job": j.id, onclick: () => openJob(j.id) }, cells);
  return tr;
}

function gpusAsked(j) {
  if (j.gpu_milli && j.gpu_milli < 1000) return `${(j.gpu_milli / 1000).toFixed(2)} GPU`;
  const range = j.gpu_count_min ? `${j.gpu_count_min}..${j.gpu_count}` : `${j.gpu_count}`;
  return `${range}${j.gpu_model ? " " + j.gpu_model : ""}`;
}

function drawQueue(pending, suspended) {
  const p = panel("panel-queue");
  if (failed(p, pending) || failed(p, suspended)) return;
  const waiting = [...pending.jobs, ...suspended.jobs].sort((a, b) => a.id - b.id);
  if (!waiting.length) {
    p.body.replaceChildren(h("p", { class: "muted" }, "Nothing waits."));
    setStatus(p, "");
    return;
  }
  p.body.replaceChildren(table(["job", "team", "kind", "GPUs", "waiting", "why"],
    waiting.map((j) => jobRow(j, [
      h("td", {}, `#${j.id} ${j.name}`), h("td", {}, j.team), h("td", {}, j.kind),
      h("td", {}, gpusAsked(j)), h("td", {}, ago(j.submitted_at) + (j.held ? " (held)" : "")),
      reasonCell(j),
    ]))));
  setStatus(p, `${waiting.length} job(s) waiting, each with its reason code and why.`);
}

function drawJobs(recent) {
  const p = panel("panel-jobs");
  if (failed(p, recent)) return;
  p.body.replaceChildren(table(
    ["job", "team", "kind", "state", "GPUs", "on", "submitted", "ran", "tries"],
    recent.jobs.map((j) => jobRow(j, [
      h("td", {}, `#${j.id} ${j.name}`), h("td", {}, j.team), h("td", {}, j.kind),
      h("td", {}, j.state, j.held ? " (held)" : ""), h("td", {}, gpusAsked(j)),
      h("td", {}, j.gpus.map((g) => `${g.node}:${g.index}`).join(" ")),
      h("td", {}, clock(j.submitted_at)),
      h("td", {}, j.started_at ? ago(j.started_at) + (j.ended_at ? " (ended)" : "") : "–"),
      h("td", {}, `${j.attempts}${j.preemptions ? `, ${j.preemptions} preempted` : ""}`),
    ]))));
  setStatus(p, `The newest ${recent.jobs.length} job(s); click one for its history and logs.`);
}

function drawTeams(view) {
  const p = panel("panel-teams");
  if (failed(p, view)) return;
  const rows = [];
  for (const t of view.teams) {
    for (const q of t.pools) {
      rows.push(h("tr", { "data-team": t.team },
        h("td", {}, t.team), h("td", {}, q.pool),
        h("td", {}, `${q.used_gpus}`, bar(q.max_gpus ? q.used_gpus / q.max_gpus : 0, "of max")),
        h("td", {}, `${q.guaranteed_gpus}`), h("td", {}, `${q.max_gpus}`),
        h("td", {}, `${t.running_jobs} / ${t.waiting_jobs}`)));
    }
  }
  const w = view.window;
  const windowText = w
    ? `Active window ${w.start}–${w.end} (scheduler clock, UTC): guaranteed shares ` +
      (Object.entries(w.guaranteed_share).map(([k, v]) => `${k} ${Math.round(v * 100)} %`)
        .join(", ") || "none") + "; max shares " +
      (Object.entries(w.max_share).map(([k, v]) => `${k} ${Math.round(v * 100)} %`)
        .join(", ") || "none")
    : (view.windows.length ? "No window is active now: the teams' own quotas hold."
      : "No time windows configured: the teams' own quotas hold.");
  p.body.replaceChildren(h("p", { id: "active-window" }, windowText),
    table(["team", "pool", "GPUs held", "guaranteed", "max", "running / waiting"], rows));
  setStatus(p, "GPUs held now against what each team is guaranteed and may hold at most.");
}

// A crash loop: replicas failed in a row, the next waits (GET /v1/services: backoff).
function backoffBadge(backoff) {
  if (!backoff) return null;
  const at = new Date(backoff.retry_at * 1000).toLocaleTimeString();
  const last = backoff.last_reason ? ` (last: ${backoff.last_reason})` : "";
  return h("span", {
    class: "badge bad backoff",
    title: `${backoff.failures} replicas in a row failed soon after they started${last}; ` +
      `the next one starts at ${at} at the earliest`,
  }, `backing off: ${backoff.failures} failed`);
}

function drawServices(view) {
  const p = panel("panel-services");
  if (failed(p, view)) return;
  if (!view.services.length) {
    p.body.replaceChildren(h("p", { class: "muted" }, "No online services."));
    setStatus(p, "");
    return;
  }
  const rows = view.services.map((s) => {
    const serving = s.replicas.filter((r) => r.state === "running").length;
    const p99 = s.p99_ms;
    const over = p99 !== null && p99 > s.slo_p99_ms;
    return h("tr", { "data-service": s.name },
      h("td", {}, h("b", {}, s.name)), h("td", {}, s.team), h("td", {}, s.model || "–"),
      h("td", { class: "replicas" }, `${serving} serving / ${s.target_replicas} wanted ` +
        `(${s.min_replicas}..${s.max_replicas})`, backoffBadge(s.backoff)),
      h("td", {}, num(s.rps, 1, " rps")),
      h("td", {}, num(p99, 1, " ms"), over ? h("span", { class: "badge bad" }, "over SLO") : null),
      h("td", {}, `${s.slo_p99_ms} ms`),
      h("td", { class: "text" }, s.replicas.map((r) =>
        `${r.name} ${r.state}${r.node ? " on " + r.node : ""}`).join("; ") || "–"));
  });
  p.body.replaceChildren(table(
    ["service", "team", "model", "replicas", "rate", "p99", "SLO p99", "replica list"], rows));
  setStatus(p, `${view.services.length} service(s); rate and p99 as the replicas report them.`);
}

async function refreshEvents() {
  const p = panel("panel-events");
  try {
    for (let page = 0; page < EVENT_PAGES; page++) {
      const got = await api(`/v1/events?after=${state.eventsAfter}&wait=0`);
      state.events.push(...got.events);
      state.eventsAfter = got.next;
      if (state.events.length > EVENTS_KEPT) state.events.splice(0, state.events.length - EVENTS_KEPT);
      if (got.events.length < 500 || state.eventsPrimed) break;
    }
    state.eventsPrimed = true;
  } catch (err) {
    setStatus(p, err.message, true);
    return;
  }
  const shown = state.events.slice(-EVENTS_SHOWN).reverse();
  p.body.replaceChildren(table(["#", "at (UTC)", "kind", "job", "message"], shown.map((e) =>
    h("tr", { "data-seq": e.seq }, h("td", {}, e.seq), h("td", {}, clock(e.at_s)),
      h("td", {}, e.kind), h("td", {}, e.job_id === null ? "–" : `#${e.job_id}`),
      h("td", { class: "text" }, e.message)))));
  setStatus(p, `The newest ${shown.length} event(s), newest first.`);
}

// ---- one job: its history and logs --------------------------------------------------------
function openJob(id) {
  state.open = {
    id, logOffset: 0, logText: "", refused: null, eventsAfter: 0, events: [], loading: false,
  };
  document.getElementById("panel-job").hidden = false;
  document.getElementById("job-title").textContent = `#${id}`;
  document.getElementById("job-events").replaceChildren();
  document.getElementById("job-logs").textContent = "";
  document.getElementById("job-logs-refused").hidden = true;
  for (const tr of document.querySelectorAll("tr.selected")) tr.classList.remove("selected");
  refreshJob().then(() => document.getElementById("panel-job").scrollIntoView());
}

function closeJob() {
  state.open = null;
  document.getElementById("panel-job").hidden = true;
}

async function refreshJob() {
  const open = state.open;
  if (!open || open.loading) return; // one read at a time, so no log chunk is added twice
  open.loading = true;
  try {
    await readJob(open);
  } finally {
    open.loading = false;
  }
}

async function readJob(open) {
  const summary = document.getElementById("job-summary");
  let job;
  try {
    job = await api(`/v1/jobs/${open.id}`);
    const got = await api(`/v1/jobs/${open.id}/events?after=${open.eventsAfter}`);
    open.events.push(...got.events);
    open.eventsAfter = got.next;
  } catch (err) {
    summary.replaceChildren(h("p", { class: "refusal" }, err.message));
    return;
  }
  if (state.open !== open) return;
  document.getElementById("job-title").textContent = `#${job.id} ${job.name}`;
  summary.replaceChildren(h("dl", { class: "facts" },
    h("dt", {}, "team"), h("dd", {}, job.team),
    h("dt", {}, "kind"), h("dd", {}, `${job.kind}, priority ${job.priority}`),
    h("dt", {}, "state"), h("dd", { id: "job-state" }, job.state, job.held ? " (held)" : ""),
    job.reason ? h("dt", {}, "reason") : null,
    job.reason ? h("dd", {}, job.reason_code ? h("span", { class: "code" }, job.reason_code) : null,
      " ", job.reason.replace(/^[A-Z][A-Za-z]+: /, "")) : null,
    h("dt", {}, "GPUs"), h("dd", {}, gpusAsked(job),
      job.gpus.length ? " on " + job.gpus.map((g) => `${g.node}:${g.index}`).join(" ") : ""),
    h("dt", {}, "command"), h("dd", { class: "code" }, job.command.join(" ")),
    h("dt", {}, "times"), h("dd", {}, `submitted ${clock(job.submitted_at)}, started ` +
      `${clock(job.started_at)}, ended ${clock(job.ended_at)}`),
    h("dt", {}, "attempts"), h("dd", {}, `${job.attempts} (${job.preemptions} preemptions, ` +
      `${job.retries} retries)${job.exit_code === null ? "" : ", exit " + job.exit_code}`)));
  document.getElementById("job-events").replaceChildren(table(["at (UTC)", "kind", "message"],
    open.events.map((e) => h("tr", {}, h("td", {}, clock(e.at_s)), h("td", {}, e.kind),
      h("td", { class: "text" }, e.message)))));
  if (open.refused !== null) return; // asked once; the answer will not change
  const refused = document.getElementById("job-logs-refused");
  const pre = document.getElementById("job-logs");
  try {
    const r = await api(`/v1/jobs/${open.id}/logs?offset=${open.logOffset}&limit=${LOG_READ}`, true);
    const text = await r.text();
    open.logOffset = Number(r.headers.get("X-Log-Offset") || open.logOffset);
    open.logText = (open.logText + text).slice(-LOG_KEPT);
    if (state.open !== open) return;
    pre.textContent = open.logText || "(no output yet)";
    refused.hidden = true;
  } catch (err) {
    if (err.status === 403) open.refused = err.message;
    refused.textContent = `Logs not shown: ${err.message}`;
    refused.hidden = false;
    pre.textContent = "";
  }
}

// ---- start --------------------------------------------------------------------------------
document.getElementById("signin").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = document.getElementById("token");
  const token = input.value.trim();
  input.value = "";
  closeJob();
  signIn(token);
});
document.getElementById("signout-button").addEventListener("click", signOut);
document.getElementById("job-close").addEventListener("click", closeJob);
signIn(state.token);
