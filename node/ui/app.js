// The xr dashboard's script: reads the node's API with the caller's bearer token and follows
// /v1/ui/events (Server-Sent Events read through fetch, because an EventSource cannot send the
// Authorization header and a token must never go into a URL). Every value from the API is put
// into the page as text (textContent), never as HTML.
"use strict";

const TOKEN_KEY = "xr.token";
const TABS = ["cluster", "jobs", "locks", "kv"];
const RECONNECT_MS_MAX = 10000;
const LOGS_REFRESH_MS = 2000;
// While the node has no stream slot free, the page reads the snapshot this often and tries the
// stream again every STREAM_RETRY_MS.
const POLL_MS = 2000;
const STREAM_RETRY_MS = 10000;

// What the page holds of the signed-in caller. Signing out puts these values back, so nothing of
// one caller is left for the next one in a shared tab.
function callerState() {
  return {
    snapshot: null,
    selectedJob: null,
    // The attempt whose log is shown: {jobId, taskIndex, attempt}.
    logsOf: null,
    logsFetchedMs: 0,
    logsIndex: -1,
    kvPrefix: "",
    kvNext: null,
  };
}

const ui = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  streamAbort: null,
  // Counts sign-outs: an answer to a request made before the latest one is dropped.
  signOuts: 0,
  ...callerState(),
};

// Small helpers.

function $(selector) {
  return document.querySelector(selector);
}

// h("td", {class: "x", title: "y"}, child, "text") builds an element; strings become text nodes.
function h(tag, attributes, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

function replaceChildren(parent, children) {
  parent.replaceChildren(...children);
}

function ago(ms) {
  if (ms === null || ms === undefined) return "never";
  const seconds = Math.max(0, Math.round(ms / 1000));
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

function duration(ms) {
  const seconds = Math.max(0, Math.round(ms / 1000));
  if (seconds < 120) return `${seconds} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${Math.round(seconds / 3600)} h`;
}

function badge(text, kind) {
  return h("span", { class: `badge ${kind || text}` }, text);
}

function bar(fraction, label, kind) {
  const fill = h("span");
  fill.style.width = `${Math.round(Math.min(1, Math.max(0, fraction)) * 100)}%`;
  return h("div", {}, h("div", { class: `bar ${kind || ""}` }, fill),
    label ? h("div", { class: "bar-label" }, label) : null);
}

function showError(message) {
  const banner = $("#error");
  banner.textContent = message || "";
  banner.hidden = !message;
}

function setLive(state) {
  const live = $("#live");
  live.dataset.state = state;
  live.textContent = state.replace("-", " ");
}

// The API.

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function headers(extra) {
  const sent = { Accept: "application/json", ...(extra || {}) };
  if (ui.token) sent.Authorization = `Bearer ${ui.token}`;
  return sent;
}

async function failure(response) {
  let code = "http";
  let message = `${response.status} ${response.statusText}`;
  try {
    const document = await response.json();
    if (document.error) ({ code, message } = document.error);
  } catch (ignored) {
    // Not an error document; the status says enough.
  }
  return new ApiError(response.status, code, message);
}

async function api(path, signal) {
  const response = await fetch(path, { headers: headers(), cache: "no-store", signal });
  if (!response.ok) {
    const error = await failure(response);
    if (error.status === 401) signOut(error.message);
    throw error;
  }
  return response.json();
}

// Sign-in.

function showLogin(message) {
  $("#login").hidden = false;
  $("#views").hidden = true;
  $("#tabs").hidden = true;
  $("#sign-out").hidden = true;
  $("#login-message").textContent = message || "This node needs a bearer token.";
  setLive("signed-out");
  $("#token-input").focus();
}

function signOut(message) {
  ui.token = "";
  sessionStorage.removeItem(TOKEN_KEY);
  if (ui.streamAbort) ui.streamAbort.abort();
  ui.streamAbort = null;
  ui.signOuts += 1;
  Object.assign(ui, callerState());
  clearViews();
  showLogin(message);
}

// Empties every view, hidden ones too: the next caller of a shared tab sees nothing of this one.
function clearViews() {
  for (const selector of ["#node-status", "#raft", "#regions", "#rtt", "#job-counts", "#jobs tbody",
    "#job-detail", "#locks tbody", "#sessions tbody", "#kv tbody"]) {
    replaceChildren($(selector), []);
  }
  for (const selector of ["#who", "#lock-count", "#session-count", "#kv-summary", "#kv-value"]) {
    $(selector).textContent = "";
  }
  for (const selector of ["#job-detail", "#jobs-empty", "#kv-more", "#kv-value"]) {
    $(selector).hidden = true;
  }
  $("#kv-prefix").value = "";
  showError("");
}

function signIn(token) {
  ui.token = token.trim();
  if (ui.token) sessionStorage.setItem(TOKEN_KEY, ui.token);
  $("#login").hidden = true;
  $("#views").hidden = false;
  $("#tabs").hidden = false;
  showError("");
  follow();
  openTab(location.hash.slice(1));
}

// Live updates: the snapshot stream, with reconnects, or polling while the node has no room
// for another stream.

function parseEvents(buffer, onEvent) {
  // Events end with a blank line; returns what is left of an unfinished one.
  let end;
  while ((end = buffer.indexOf("\n\n")) >= 0) {
    const block = buffer.slice(0, end);
    buffer = buffer.slice(end + 2);
    let name = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;
      if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    if (data.length) onEvent(name, data.join("\n"));
  }
  return buffer;
}

async function follow() {
  if (ui.streamAbort) ui.streamAbort.abort();
  const controller = new AbortController();
  ui.streamAbort = controller;
  let delayMs = 500;
  while (!controller.signal.aborted) {
    try {
      const response = await fetch("/v1/ui/events", {
        headers: headers({ Accept: "text/event-stream" }),
        cache: "no-store",
        signal: controller.signal,
      });
      if (response.status === 401) {
        signOut((await failure(response)).message);
        return;
      }
      if (response.status === 429) {
        // No stream slot is free (the node's or the tenant's share): poll the snapshot, and try
        // the stream again now and then. Polling is no failure: no backoff, no "reconnecting".
        await pollAWhile(controller.signal);
        delayMs = 500;
        continue;
      } else if (!response.ok) {
        throw await failure(response);
      } else {
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer = parseEvents(buffer + value.replace(/\r\n/g, "\n"), (name, data) => {
            if (name === "state") {
              delayMs = 500;
              setLive("live");
              showError("");
              render(JSON.parse(data));
            }
          });
        }
      }
    } catch (error) {
      if (controller.signal.aborted) return;
      if (error instanceof ApiError) showError(`${error.code}: ${error.message}`);
    }
    if (controller.signal.aborted) return;
    setLive("reconnecting");
    await new Promise((resolve) => setTimeout(resolve, delayMs));
    delayMs = Math.min(RECONNECT_MS_MAX, delayMs * 2);
  }
}

// Reads the snapshot every POLL_MS for STREAM_RETRY_MS, or until signed out.
async function pollAWhile(signal) {
  setLive("polling");
  for (let elapsedMs = 0; elapsedMs < STREAM_RETRY_MS && !signal.aborted; elapsedMs += POLL_MS) {
    try {
      const snapshot = await api("/v1/ui/state?consistency=stale", signal);
      if (signal.aborted) return;
      showError("");
      render(snapshot);
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof ApiError) showError(`${error.code}: ${error.message}`);
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

// Rendering.

function render(snapshot) {
  ui.snapshot = snapshot;
  renderHeader(snapshot);
  renderCluster(snapshot);
  renderJobs(snapshot);
  renderLocks(snapshot);
}

function renderHeader(snapshot) {
  const node = snapshot.node;
  replaceChildren($("#node-status"), [
    "node ", h("b", { id: "node-region" }, node.region), ` (${node.state})`,
    " · leader ", h("b", { id: "header-leader" }, node.leader_region || "none"),
    ` · term ${node.term} · commit ${node.commit_index}`,
  ]);
  const who = snapshot.principal;
  $("#who").textContent = `${who.name} · ${who.role} · tenant ${who.tenant}`;
  $("#sign-out").hidden = !ui.token;
}

function fact(label, value, id) {
  return h("div", {}, h("dt", {}, label), h("dd", { id }, value));
}

function renderCluster(snapshot) {
  const node = snapshot.node;
  // The Raft members come only to a caller who may read them (an operator or admin).
  const members = node.members;
  replaceChildren($("#raft"), [
    fact("Leader", node.leader_region || "none", "leader"),
    fact("This node", `${node.region} (${node.state})`, "this-node"),
    fact("Term", node.term, "term"),
    fact("Commit index", node.commit_index, "commit-index"),
    fact("Applied index", node.applied_index, "applied-index"),
    fact("Quorum", node.has_quorum ? "yes" : "no", "quorum"),
    members ? fact("Peers connected",
      `${members.filter((member) => member.connected).length} of ${members.length}`, "peers") : null,
  ].filter((item) => item !== null));
  replaceChildren($("#regions"), snapshot.regions.map((region) => regionCard(snapshot, region)));
  renderHeatMap(snapshot.regions);
}

function regionCard(snapshot, region) {
  const node = snapshot.node;
  const title = h("h3", {}, region.name,
    badge(region.healthy ? "healthy" : "unhealthy"),
    region.name === node.leader_region ? badge("leader") : null,
    region.name === node.region ? badge("this node", "self") : null);
  const memory = region.gpus.reduce((sum, gpu) => sum + gpu.memory_mb, 0);
  const free = region.gpus.reduce((sum, gpu) => sum + gpu.free_mb, 0);
  const models = [...new Set(region.gpus.map((gpu) => gpu.model))].join(", ");
  const capacity = region.gpus.length || region.cpu_slots || 1;
  const busy = region.load.running + region.load.assigned;
  const line = (label, value) => h("div", { class: "line" }, h("span", {}, label), h("span", {}, value));
  return h("div", { class: `card region ${region.healthy ? "" : "unhealthy"}`, "data-region": region.name },
    title,
    line("Provider", region.provider || "—"),
    line("GPUs", region.gpus.length ? `${region.gpus.length} × ${models}` : "none (CPU)"),
    region.gpus.length
      ? bar((memory - free) / Math.max(1, memory),
        `GPU memory ${Math.round((memory - free) / 1024)} of ${Math.round(memory / 1024)} GiB in use`)
      : null,
    line("CPU slots", region.cpu_slots),
    line("Load", `${region.load.running} running, ${region.load.assigned} assigned`),
    bar(busy / capacity, `${busy} of ${capacity} ${region.gpus.length ? "GPUs" : "slots"}`,
      busy >= capacity ? "bad" : "ok"),
    line("Price", `$${region.price_per_gpu_hour.toFixed(2)} / GPU·h`),
    line("Carbon", `${Math.round(region.carbon_g_per_kwh)} g/kWh`),
    line("Heartbeat", region.heartbeat_at_ms === null ? "never" : ago(snapshot.now_ms - region.heartbeat_at_ms)),
    h("div", {}, Object.entries(region.labels).map(([key, value]) => h("span", { class: "chip" }, `${key}=${value}`))));
}

function heatColour(ms) {
  // Green at 0 ms to red at 300 ms and beyond, on a square-root scale (most links are short).
  const fraction = Math.min(1, Math.sqrt(ms / 300));
  return `hsl(${Math.round(120 * (1 - fraction))}, 65%, 72%)`;
}

function renderHeatMap(regions) {
  const names = regions.map((region) => region.name);
  const head = h("tr", {}, h("th", {}, "from \\ to"), names.map((name) => h("th", {}, name)));
  const rows = regions.map((from) => h("tr", {}, h("th", {}, from.name), names.map((to) => {
    if (to === from.name) return h("td", { class: "none" }, "·");
    const ms = from.rtt_ms[to];
    if (ms === undefined) return h("td", { class: "none", title: "not reported" }, "—");
    const cell = h("td", { title: `${from.name} → ${to}: ${ms} ms` }, ms.toFixed(ms < 10 ? 1 : 0));
    cell.style.backgroundColor = heatColour(ms);
    return cell;
  })));
  replaceChildren($("#rtt"), names.length
    ? [h("table", { class: "heat", id: "rtt-table" }, h("thead", {}, head), h("tbody", {}, rows))]
    : [h("p", { class: "hint" }, "No regions registered yet.")]);
}

function jobProgress(job) {
  if (job.state === "succeeded") return 1;
  return job.total > 0 ? job.done / job.total : 0;
}

function progressLabel(job) {
  // Progress is reported every few steps, so a finished job's last report may be short of it.
  if (job.state === "succeeded") return "done";
  if (job.state === "pending") return "waiting";
  return job.total ? `${job.done} / ${job.total} steps` : "no progress reported";
}

function timeline(job, nowMs) {
  const attempts = job.tasks.flatMap((task) => task.attempts);
  const startMs = job.submitted_at_ms;
  const endMs = Math.max(nowMs, ...attempts.map((attempt) => attempt.ended_at_ms || 0), startMs + 1);
  const spans = attempts.map((attempt) => {
    const left = (attempt.started_at_ms - startMs) / (endMs - startMs);
    const right = ((attempt.ended_at_ms || nowMs) - startMs) / (endMs - startMs);
    const outcome = attempt.outcome || "running";
    const span = h("span", {
      class: outcome,
      title: `attempt ${attempt.number} in ${attempt.region}: ${outcome}` +
        (attempt.error ? ` (${attempt.error})` : ""),
    });
    span.style.left = `${(left * 100).toFixed(1)}%`;
    span.style.width = `${Math.max(0, (right - left) * 100).toFixed(1)}%`;
    return span;
  });
  const count = job.tasks.reduce((sum, task) => sum + task.attempt_count, 0);
  const title = count > attempts.length ? `${count} attempt(s), the latest ${attempts.length} shown`
    : `${count} attempt(s)`;
  return h("div", { class: "timeline", title }, spans);
}

function renderJobs(snapshot) {
  replaceChildren($("#job-counts"), Object.entries(snapshot.job_counts)
    .map(([state, count]) => badge(`${count} ${state}`, state)));
  const rows = snapshot.jobs.map((job) => {
    const why = job.reason || job.cancel_reason ||
      (job.tasks.find((task) => task.error) || {}).error || "";
    return h("tr", {
      class: `clickable job ${job.job_id === ui.selectedJob ? "selected" : ""}`,
      "data-job-id": job.job_id,
      "data-state": job.state,
      onclick: () => selectJob(job.job_id),
    },
    h("td", {}, h("div", { class: "mono" }, job.job_id), h("div", { class: "muted" }, job.name)),
    h("td", { class: "state" }, badge(job.state)),
    h("td", {}, job.regions.join(", ") || "—"),
    h("td", {}, bar(jobProgress(job), progressLabel(job),
      job.state === "failed" ? "bad" : job.state === "succeeded" ? "ok" : "")),
    h("td", {}, timeline(job, snapshot.now_ms)),
    h("td", { class: "reason" }, why),
    h("td", { title: new Date(job.submitted_at_ms).toISOString() }, ago(snapshot.now_ms - job.submitted_at_ms)));
  });
  replaceChildren($("#jobs tbody"), rows);
  $("#jobs-empty").hidden = snapshot.jobs.length > 0;
  renderJobDetail(snapshot);
}

function selectJob(jobId) {
  ui.selectedJob = ui.selectedJob === jobId ? null : jobId;
  ui.logsOf = null;
  if (ui.snapshot) renderJobs(ui.snapshot);
}

function renderJobDetail(snapshot) {
  const panel = $("#job-detail");
  const job = snapshot.jobs.find((candidate) => candidate.job_id === ui.selectedJob);
  if (!job) {
    panel.hidden = true;
    return;
  }
  panel.hidden = false;
  const tasks = job.tasks.map((task) => h("tr", {},
    h("td", {}, task.index),
    h("td", {}, badge(task.state)),
    h("td", {}, task.region || "—"),
    h("td", {}, `${task.done} / ${task.total || "?"}`),
    h("td", {}, task.failures),
    h("td", { class: "reason" }, task.error || task.reason || ""),
    h("td", { class: "attempt-list" },
      task.attempt_count > task.attempts.length
        ? h("span", { class: "muted" }, `${task.attempt_count - task.attempts.length} earlier not shown`)
        : null,
      task.attempts.map((attempt) => h("button", {
        type: "button",
        class: "quiet",
        title: `${attempt.region}, fencing token ${attempt.token}, ${attempt.outcome || "running"}`,
        onclick: () => showLogs(job.job_id, task.index, attempt.number),
      }, `#${attempt.number} ${attempt.region} ${attempt.outcome || "running"}`)))));
  let existingLog = $("#job-log");
  const log = existingLog || h("pre", { class: "log", id: "job-log" });
  if (!existingLog) log.textContent = "Choose an attempt to read its log.";
  replaceChildren(panel, [
    h("h2", {}, `Job ${job.job_id} `, h("span", { class: "muted" }, job.name)),
    h("p", { class: "muted" }, `${job.workload || job.entrypoint} · priority ${job.priority} · ` +
      `${job.array_size} task(s)` + (job.tasks_shown < job.array_size ? `, first ${job.tasks_shown} shown` : "")),
    h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, ["Task", "State", "Region", "Steps", "Failures", "Why", "Attempts (logs)"]
        .map((name) => h("th", {}, name)))),
      h("tbody", {}, tasks)),
    h("h2", {}, "Log ", h("span", { class: "muted", id: "job-log-title" },
      ui.logsOf ? `task ${ui.logsOf.taskIndex}, attempt ${ui.logsOf.attempt}` : "")),
    log,
  ]);
  // Follow the chosen attempt's log while it runs.
  if (ui.logsOf && ui.logsOf.jobId === job.job_id && snapshot.index !== ui.logsIndex &&
      Date.now() - ui.logsFetchedMs > LOGS_REFRESH_MS) {
    fetchLogs(snapshot.index);
  }
}

function showLogs(jobId, taskIndex, attempt) {
  ui.logsOf = { jobId, taskIndex, attempt };
  if (ui.snapshot) renderJobDetail(ui.snapshot);
  fetchLogs(ui.snapshot ? ui.snapshot.index : -1);
}

async function fetchLogs(index) {
  const wanted = ui.logsOf;
  const signOuts = ui.signOuts;
  ui.logsFetchedMs = Date.now();
  ui.logsIndex = index;
  const path = `/v1/jobs/${encodeURIComponent(wanted.jobId)}/logs?task_index=${wanted.taskIndex}` +
    `&attempt=${wanted.attempt}&tail_bytes=65536`;
  let text;
  try {
    const answer = await api(path);
    text = (answer.truncated ? "… (earlier output omitted)\n" : "") + (answer.log || "(no output)");
  } catch (error) {
    text = `The log could not be read: ${error.message}`;
  }
  const log = $("#job-log");
  if (log && ui.logsOf === wanted && ui.signOuts === signOuts) log.textContent = text;
}

// "and N more" after a list the snapshot cut.
function andMore(count, shown) {
  return count > shown ? h("span", { class: "muted" }, ` and ${count - shown} more`) : null;
}

function renderLocks(snapshot) {
  $("#lock-count").textContent = `(${snapshot.lock_count})`;
  $("#session-count").textContent = `(${snapshot.session_count})`;
  replaceChildren($("#locks tbody"), snapshot.locks.map((lock) => h("tr", { "data-lock": lock.name },
    h("td", { class: "mono" }, lock.name),
    h("td", { class: "mono" }, lock.holder),
    h("td", {}, lock.token),
    h("td", { class: "mono" }, lock.waiters.length ? lock.waiters.join(", ") : "—",
      andMore(lock.waiter_count, lock.waiters.length)),
    h("td", {}, ago(snapshot.now_ms - lock.granted_at_ms)))));
  replaceChildren($("#sessions tbody"), snapshot.sessions.map((session) => h("tr", { "data-session": session.session_id },
    h("td", { class: "mono" }, session.session_id),
    h("td", {}, duration(session.ttl_ms)),
    h("td", {}, duration(session.remaining_ms)),
    h("td", { class: "mono" }, session.locks.join(", ") || "—", andMore(session.lock_count, session.locks.length)),
    h("td", {}, session.keys))));
}

// The KV browser reads /v1/kv (a page at a time) when asked, not on every update.

async function listKeys(more) {
  const signOuts = ui.signOuts;
  if (!more) {
    ui.kvPrefix = $("#kv-prefix").value;
    ui.kvNext = null;
  }
  let path = `/v1/kv?limit=100&prefix=${encodeURIComponent(ui.kvPrefix)}`;
  if (more && ui.kvNext !== null) path += `&after=${encodeURIComponent(ui.kvNext)}`;
  try {
    const page = await api(path);
    if (ui.signOuts !== signOuts) return;
    const rows = page.items.map((item) => {
      const text = item.value === null ? `(binary, ${atob(item.value_base64).length} bytes)` : item.value;
      return h("tr", { class: "clickable", "data-key": item.key, onclick: () => showValue(item) },
        h("td", { class: "mono" }, item.key),
        h("td", { class: "mono" }, text.length > 80 ? `${text.slice(0, 80)}…` : text),
        h("td", {}, item.version),
        h("td", {}, item.mod_revision),
        h("td", { class: "mono" }, item.session_id || "—"));
    });
    const body = $("#kv tbody");
    if (more) body.append(...rows);
    else replaceChildren(body, rows);
    ui.kvNext = page.next;
    $("#kv-more").hidden = page.next === null;
    $("#kv-summary").textContent = `${body.children.length} key(s) shown at revision ${page.revision}` +
      (ui.snapshot ? ` · ${ui.snapshot.key_count} in all` : "");
    showError("");
  } catch (error) {
    if (ui.signOuts === signOuts) showError(`${error.code}: ${error.message}`);
  }
}

function showValue(item) {
  const pre = $("#kv-value");
  pre.hidden = false;
  pre.textContent = item.value === null ? `base64: ${item.value_base64}` : item.value;
}

// Tabs: the location's hash names the open one, so a reload keeps it.

function openTab(name) {
  const tab = TABS.includes(name) ? name : "cluster";
  for (const button of document.querySelectorAll(".tab")) {
    button.setAttribute("aria-selected", String(button.dataset.tab === tab));
  }
  for (const view of TABS) $(`#view-${view}`).hidden = view !== tab;
  if (tab === "kv" && $("#kv tbody").children.length === 0 && $("#login").hidden) {
    listKeys(false);
  }
}

function start() {
  for (const button of document.querySelectorAll(".tab")) {
    button.addEventListener("click", () => { location.hash = button.dataset.tab; });
  }
  window.addEventListener("hashchange", () => openTab(location.hash.slice(1)));
  $("#login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("#token-input").value);
    $("#token-input").value = "";
  });
  $("#sign-out").addEventListener("click", () => signOut("Signed out."));
  $("#kv-form").addEventListener("submit", (event) => {
    event.preventDefault();
    listKeys(false);
  });
  $("#kv-more").addEventListener("click", () => listKeys(true));
  // The node says in the page whether it needs a token; with authentication off the page
  // reads without one.
  const auth = document.querySelector('meta[name="xr-auth"]').content;
  if (ui.token || auth === "off") {
    signIn(ui.token);
  } else {
    showLogin();
    openTab(location.hash.slice(1));
  }
}

document.addEventListener("DOMContentLoaded", start);
