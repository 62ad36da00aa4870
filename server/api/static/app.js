// dpfl dashboard: reads the coordinator's REST API (/api/v1) with the admin token and renders
// the clients' privacy spending, ε over rounds, accuracy per round and the round timeline.
// A figure the API flags `approximate` (it adds up ledger entries charged for discrete Gaussian
// noise as the continuous Gaussian) is shown with the APPROXIMATE marker: not a proven bound.
// The token is entered once and kept in sessionStorage (this tab only), or comes from a one-time
// dashboard link (`#login=CODE`, `dpfl-coordinator dashboard-link`): the code is exchanged once
// for a read-only session token and removed from the address bar. Text from the API is always
// inserted with textContent, never parsed as HTML.

import { lineChart } from "./chart.js";

const TOKEN_KEY = "dpfl.adminToken";
const REFRESH_MS = 30000;
const $ = (id) => document.getElementById(id);

const state = { clients: [], jobs: [], names: new Map(), clientId: null, jobId: null, timer: null };

class AuthError extends Error {}

const APPROXIMATE = "≈ approximate: not a proven bound";
const APPROXIMATE_WHY =
  "Adds up rounds whose discrete Gaussian noise (privacy.noise: gaussian) was charged as the continuous Gaussian: not a proven upper bound.";

// the marker shown beside an approximate ε (`short`: "≈" alone, for narrow cells)
function approxMark(short = false) {
  return node("span", { cls: "approx", text: short ? "≈" : APPROXIMATE, attrs: { title: APPROXIMATE_WHY } });
}

function fmtEps(value) {
  if (value === null || value === undefined) return "–";
  const v = Number(value);
  if (!Number.isFinite(v)) return "∞";
  return v.toFixed(3);
}

function fmtNum(value) {
  if (value === null || value === undefined) return "–";
  return Number(value).toPrecision(3).replace(/\.?0+(e|$)/, "$1");
}

function fmtPct(value) {
  return value === null || value === undefined ? "–" : `${(100 * value).toFixed(1)} %`;
}

// "1 job", "2 jobs"
function plural(count, one, many = `${one}s`) {
  return `${count} ${count === 1 ? one : many}`;
}

function fmtDate(iso) {
  return iso ? new Date(iso).toLocaleString() : "–";
}

function node(tag, { text, cls, attrs } = {}, ...children) {
  const n = document.createElement(tag);
  if (cls) n.className = cls;
  if (text !== undefined) n.textContent = text;
  for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
  n.append(...children);
  return n;
}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) throw new AuthError("no token");
  const res = await fetch(`/api/v1${path}`, {
    headers: { Authorization: `Bearer ${token}`, Accept: "application/json" },
    cache: "no-store",
    credentials: "omit",
  });
  let body = null;
  try {
    body = await res.json();
  } catch {
    body = null;
  }
  if (res.status === 401 || res.status === 403) {
    throw new AuthError(body?.detail || `the coordinator refused the token (HTTP ${res.status})`);
  }
  if (!res.ok) throw new Error(body?.detail || `HTTP ${res.status} for ${path}`);
  return body;
}

function clientName(id) {
  return state.names.get(id) || id;
}

// clients ------------------------------------------------------------------------------------
function budgetBar(client) {
  const wrap = node("div", { cls: "bar" });
  if (!client.budget) {
    wrap.classList.add("bar-none");
    wrap.append(node("span", { cls: "bar-text", text: "no budget" }));
    return wrap;
  }
  const spent = Number(client.epsilon_at_budget_delta ?? client.epsilon);
  const ratio = Number.isFinite(spent) ? spent / client.budget.epsilon : Infinity;
  const pct = Math.min(100, Math.max(0, 100 * ratio));
  const level = client.exceeded || ratio > 1 ? "over" : ratio >= 0.8 ? "high" : "ok";
  wrap.classList.add(`bar-${level}`);
  wrap.setAttribute("role", "progressbar");
  wrap.setAttribute("aria-valuemin", "0");
  wrap.setAttribute("aria-valuemax", String(client.budget.epsilon));
  wrap.setAttribute("aria-valuenow", String(Number.isFinite(spent) ? spent : client.budget.epsilon));
  wrap.setAttribute("aria-label", `${clientName(client.id)}: ε ${fmtEps(spent)}${client.approximate ? ` (${APPROXIMATE})` : ""} of ${fmtEps(client.budget.epsilon)}`);
  const fill = node("span", { cls: "bar-fill" });
  fill.style.setProperty("--pct", `${pct}%`);
  wrap.append(fill, node("span", { cls: "bar-text", text: Number.isFinite(ratio) ? `${Math.round(100 * ratio)} %` : "∞" }));
  return wrap;
}

const OWN_SHARE_WHY =
  "ε with only the noise this client's own share adds to each round (its share of the announced noise): what an agent that trusts no peer records in its own ledger.";

// the "own share only" figure beside the announced cohort's: "unknown" (the API's reason as its
// title) where some ledger entry predates the coordinator keeping its own-noise fraction
function ownShareCell(c) {
  const known = c.own_share_epsilon !== null && c.own_share_epsilon !== undefined;
  const attrs = {
    "data-epsilon": known ? String(c.own_share_epsilon) : "",
    title: known ? OWN_SHARE_WHY : `unknown: ${c.own_share_unknown ?? "not reported"}`,
  };
  if (!known) return node("td", { cls: "num own-share unknown", text: "unknown", attrs });
  return node("td", { cls: "num own-share", attrs }, fmtEps(c.own_share_epsilon), ...(c.approximate ? [" ", approxMark(true)] : []));
}

function renderClients() {
  const body = $("clients-table").tBodies[0];
  body.replaceChildren();
  $("clients-empty").hidden = state.clients.length > 0;
  for (const c of state.clients) {
    const row = node("tr", { attrs: { "data-client-id": c.id } });
    if (c.id === state.clientId) row.classList.add("selected");
    const pick = node("button", { cls: "link", text: c.name, attrs: { type: "button", "aria-label": `Show ε over rounds of ${c.name}` } });
    pick.addEventListener("click", () => selectClient(c.id));
    row.append(
      node("th", { attrs: { scope: "row" } }, pick, node("span", { cls: "id", text: c.id })),
      node("td", { text: c.status, cls: `status-${c.status}` }),
      node(
        "td",
        { cls: "num epsilon", attrs: { "data-epsilon": String(c.epsilon), "data-approximate": String(Boolean(c.approximate)) } },
        fmtEps(c.epsilon),
        ...(c.approximate ? [approxMark()] : []),
      ),
      ownShareCell(c),
      node("td", { cls: "num", text: fmtNum(c.delta) }),
      node("td", { cls: "num", text: c.budget ? fmtEps(c.budget.epsilon) : "none" }),
      node("td", { cls: "bar-col" }, budgetBar(c)),
      node(
        "td",
        { cls: "num remaining", attrs: { "data-remaining": String(c.remaining_epsilon) } },
        fmtEps(c.remaining_epsilon),
        ...(c.approximate && c.remaining_epsilon !== null ? [" ", approxMark(true)] : []),
      ),
    );
    if (c.approximate) row.classList.add("approximate");
    if (c.exceeded) row.classList.add("exceeded");
    body.append(row);
  }
  $("clients-approximate").hidden = !state.clients.some((c) => c.approximate);
  const select = $("client-select");
  select.replaceChildren(...state.clients.map((c) => node("option", { text: `${c.name} (${c.id})`, attrs: { value: c.id } })));
  if (state.clientId) select.value = state.clientId;
}

async function renderClientChart() {
  const target = $("eps-chart");
  const id = state.clientId;
  if (!id) {
    target.replaceChildren(node("p", { cls: "muted", text: "No client selected." }));
    return;
  }
  const history = await api(`/clients/${encodeURIComponent(id)}/history`);
  if (id !== state.clientId) return; // another client was selected meanwhile
  const client = state.clients.find((c) => c.id === id);
  const jobNames = new Map(state.jobs.map((j) => [j.id, j.name]));
  const steps = history.points.map((p, i) => ({ ...p, x: i + 1 }));
  const jobs = [...new Set(steps.map((p) => p.job_id))];
  // with several jobs, each gets a letter (A, B, …) that prefixes its rounds on the x axis
  const letter = new Map(jobs.map((job, i) => [job, jobs.length > 1 ? `${String.fromCharCode(65 + (i % 26))}·` : ""]));
  const jobName = (job) => jobNames.get(job) || job;
  // tick "r3" is round 3; "r3 #2" its second attempt (the first was aborted); "A·r3": job A
  const stepLabel = (p) => `${letter.get(p.job_id)}r${p.round_number}${p.attempt > 1 ? ` #${p.attempt}` : ""}`;
  const roundName = (p) => `${jobName(p.job_id)} round ${p.round_number}${p.attempt > 1 ? ` (attempt ${p.attempt})` : ""}`;
  const series = [{ name: "total ε (all jobs)", points: steps.map((p) => ({ x: p.x, y: Number(p.epsilon), label: roundName(p) })) }];
  if (jobs.length > 1) {
    for (const job of jobs) {
      series.push({
        name: `ε in ${letter.get(job)} ${jobName(job)}`,
        dashed: true,
        points: steps.filter((p) => p.job_id === job).map((p) => ({ x: p.x, y: Number(p.job_epsilon), label: roundName(p) })),
      });
    }
  }
  const references = client?.budget && client.budget.delta === history.delta ? [{ y: client.budget.epsilon, label: `budget ε = ${fmtEps(client.budget.epsilon)}` }] : [];
  const labels = new Map(steps.map((p) => [p.x, stepLabel(p)]));
  const approximate = steps.some((p) => p.approximate);
  lineChart(target, {
    title: `ε spent by ${clientName(id)} after each charged round${approximate ? ` (${APPROXIMATE} from ${stepLabel(steps.find((p) => p.approximate))} on)` : ""}`,
    description: `Cumulative privacy loss at δ = ${fmtNum(history.delta)}; ${steps.length} ledger entries; latest ε ${fmtEps(steps.at(-1)?.epsilon)}${steps.at(-1)?.approximate ? ` (${APPROXIMATE})` : ""}.`,
    xLabel: `charged round, in ledger order (r3 = round 3, r3 #2 = its attempt 2${jobs.length > 1 ? "; A·, B· = the job" : ""})`,
    yLabel: `ε at δ = ${fmtNum(history.delta)}`,
    series,
    references,
    xTickLabel: (x) => labels.get(x) || String(x),
    format: fmtEps,
    empty: `${clientName(id)} has not been charged yet.`,
  });
}

function selectClient(id) {
  state.clientId = id;
  $("client-select").value = id;
  for (const row of $("clients-table").tBodies[0].rows) row.classList.toggle("selected", row.dataset.clientId === id);
  renderClientChart().catch(showError);
}

// jobs ---------------------------------------------------------------------------------------
function renderJobSelect() {
  const select = $("job-select");
  select.replaceChildren(...state.jobs.map((j) => node("option", { text: `${j.name} · ${j.algorithm} · ${j.status}`, attrs: { value: j.id } })));
  if (state.jobId) select.value = state.jobId;
}

function stageBar(rnd) {
  const total = Object.values(rnd.stage_seconds).reduce((a, b) => a + b, 0);
  const bar = node("div", { cls: "stages", attrs: { "aria-hidden": "true" } });
  if (total <= 0) return bar;
  for (const [stage, seconds] of Object.entries(rnd.stage_seconds)) {
    const seg = node("span", { cls: `stage stage-${stage}`, attrs: { title: `${stage}: ${seconds.toFixed(3)} s` } });
    seg.style.setProperty("--w", `${(100 * seconds) / total}%`);
    bar.append(seg);
  }
  return bar;
}

function renderTimeline(rounds) {
  const list = $("timeline");
  list.replaceChildren();
  if (rounds.length === 0) {
    list.append(node("li", { cls: "muted", text: "No round has started yet." }));
    return;
  }
  for (const r of rounds) {
    const icon = { completed: "✓", aborted: "✕", committed: "…", running: "…" }[r.status] || "";
    const item = node("li", { cls: `round round-${r.status}`, attrs: { "data-round": r.number, "data-attempt": r.attempt, "data-status": r.status } });
    item.append(node("div", { cls: "round-head" },
      node("strong", { text: `Round ${r.number}${r.attempt > 1 ? ` · attempt ${r.attempt}` : ""}` }),
      node("span", { cls: `badge badge-${r.status}`, text: `${icon} ${r.status}` })));
    const seconds = Object.values(r.stage_seconds).reduce((a, b) => a + b, 0);
    const facts = [
      `${r.invited.length} invited`,
      `${r.accepted.length} accepted`,
      `${r.participants.length} contributed`,
      `${seconds.toFixed(2)} s`,
    ];
    if (r.epsilon !== null) facts.push(`max ε ${fmtEps(r.epsilon)}${r.approximate ? ` ${APPROXIMATE}` : ""}`);
    if (r.accuracy !== null) facts.push(`accuracy ${fmtPct(r.accuracy)}`);
    item.append(node("p", { cls: "round-facts", text: facts.join(" · ") }));
    item.append(stageBar(r));
    const drops = Object.entries(r.dropped).filter(([, ids]) => ids.length > 0);
    if (drops.length) {
      const ul = node("ul", { cls: "dropouts" });
      for (const [stage, ids] of drops) {
        ul.append(node("li", { text: `${ids.length} dropped at ${stage.replace("_", " ")}: ${ids.map(clientName).join(", ")}` }));
      }
      item.append(ul);
    }
    if (r.abort_reason) item.append(node("p", { cls: "abort-reason", text: `Aborted: ${r.abort_reason}` }));
    list.append(item);
  }
}

function renderAudits(audits) {
  $("audits").hidden = audits.length === 0;
  const body = $("audits-table").querySelector("tbody");
  body.replaceChildren(
    ...audits.map((a) => {
      const violated = Number(a.epsilon_lower) > Number(a.epsilon_upper);
      const row = node(
        "tr",
        { cls: violated ? "violation" : "", attrs: { "data-audit-id": a.id } },
        node("td", { text: fmtDate(a.created_at) }),
        node("td", { text: `${a.mode}, ${a.canaries} ${a.unit} canaries, ${a.correct} of ${a.guesses} guesses right` }),
        node("td", { cls: "num epsilon-lower", text: fmtEps(a.epsilon_lower), attrs: { "data-epsilon": String(a.epsilon_lower) } }),
        node("td", { cls: "num epsilon-lower-gdp", text: fmtEps(a.epsilon_lower_gdp), attrs: { "data-epsilon": String(a.epsilon_lower_gdp) } }),
        node("td", { cls: "num epsilon-upper", text: fmtEps(a.epsilon_upper), attrs: { "data-epsilon": String(a.epsilon_upper) } }),
        node("td", { cls: "num", text: fmtNum(a.delta) }),
        node("td", { cls: "num", text: fmtPct(a.confidence) }),
      );
      if (violated) row.setAttribute("title", "The measured lower bound exceeds the ledger's ε");
      return row;
    }),
  );
}

async function renderJob() {
  const facts = $("job-facts");
  const id = state.jobId;
  if (!id) {
    facts.replaceChildren(node("dt", { text: "Jobs" }), node("dd", { text: "none submitted yet" }));
    renderTimeline([]);
    renderAudits([]);
    lineChart($("acc-chart"), { title: "Accuracy per round", series: [], xLabel: "", yLabel: "", empty: "No job yet." });
    return;
  }
  const path = `/jobs/${encodeURIComponent(id)}`;
  const [job, rounds, audits] = await Promise.all([api(path), api(`${path}/rounds`), api(`${path}/privacy-audits`)]);
  if (id !== state.jobId) return;
  const latest = audits.at(-1);
  const done = rounds.filter((r) => r.status === "completed");
  const aborted = rounds.filter((r) => r.status === "aborted").length;
  const eps = Object.values(job.epsilons).map(Number);
  const entries = [
    ["Algorithm", job.algorithm],
    ["Status", job.status],
    ["Rounds completed", `${done.length} of ${job.rounds}`],
    ["Aborted attempts", String(aborted)],
    ["Members", String(job.members.length)],
    [`Max ε in this job (δ = ${fmtNum(job.delta)})`, eps.length ? `${fmtEps(Math.max(...eps))}${job.approximate ? ` ${APPROXIMATE}` : ""}` : "–"],
    ...(latest
      ? [[`Audited ε lower bound (${fmtPct(latest.confidence)} confidence)`, `${fmtEps(latest.epsilon_lower)} ≤ ε ${fmtEps(latest.epsilon_upper)}`]]
      : []),
    ["Started", fmtDate(job.started_at)],
    ["Finished", fmtDate(job.finished_at)],
  ];
  facts.replaceChildren(...entries.flatMap(([k, v]) => [node("dt", { text: k }), node("dd", { text: v })]));
  renderAudits(audits);
  const evaluated = done.filter((r) => r.accuracy !== null);
  lineChart($("acc-chart"), {
    title: `Accuracy per round of ${job.name}`,
    description: `${evaluated.length} evaluated rounds; latest accuracy ${fmtPct(evaluated.at(-1)?.accuracy)}.`,
    xLabel: "round",
    yLabel: "test accuracy",
    series: [{ name: "accuracy", points: evaluated.map((r) => ({ x: r.number, y: r.accuracy, label: `round ${r.number}` })) }],
    yMin: 0,
    yMax: 1,
    format: fmtPct,
    tickFormat: (y) => `${Math.round(100 * y)} %`,
    empty: "No round has been evaluated yet.",
  });
  renderTimeline(rounds);
}

// life cycle ---------------------------------------------------------------------------------
function showError(err) {
  if (err instanceof AuthError) {
    signOut(`The coordinator refused the token: ${err.message}`);
    return;
  }
  $("status").textContent = `Could not load: ${err.message}`;
  $("status").classList.add("error");
}

async function load() {
  $("status").classList.remove("error");
  $("status").textContent = "Loading…";
  const [clients, jobs] = await Promise.all([api("/clients"), api("/jobs")]);
  state.clients = clients;
  state.jobs = [...jobs].reverse(); // newest first
  state.names = new Map(clients.map((c) => [c.id, c.name]));
  if (!clients.some((c) => c.id === state.clientId)) state.clientId = clients[0]?.id ?? null;
  if (!state.jobs.some((j) => j.id === state.jobId)) state.jobId = state.jobs[0]?.id ?? null;
  renderClients();
  renderJobSelect();
  await Promise.all([renderClientChart(), renderJob()]);
  $("status").textContent = `${plural(clients.length, "client")}, ${plural(jobs.length, "job")}.`;
  $("updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
  document.body.dataset.loaded = "true";
}

function showDashboard() {
  $("login").hidden = true;
  $("dashboard").hidden = false;
  $("session").hidden = false;
  load().catch(showError);
  clearInterval(state.timer);
  state.timer = setInterval(() => {
    if (document.visibilityState === "visible") load().catch(showError);
  }, REFRESH_MS);
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  clearInterval(state.timer);
  delete document.body.dataset.loaded;
  $("dashboard").hidden = true;
  $("session").hidden = true;
  $("login").hidden = false;
  const error = $("login-error");
  error.hidden = !message;
  error.textContent = message || "";
  $("token").value = "";
  $("token").focus();
}

const LINK_KEY = "login";

// `#login=CODE` (a one-time dashboard link): the code, removed from the address bar at once
function takeLinkCode() {
  const params = new URLSearchParams(location.hash.slice(1));
  const code = params.get(LINK_KEY);
  if (code === null) return null;
  history.replaceState(null, "", location.pathname + location.search);
  return code;
}

async function redeemLink(code) {
  const res = await fetch("/api/v1/dashboard/sessions", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify({ code }),
    cache: "no-store",
    credentials: "omit",
  });
  let body = null;
  try {
    body = await res.json();
  } catch {
    body = null;
  }
  if (!res.ok || !body?.token) {
    signOut(`This dashboard link does not work: ${body?.detail || `HTTP ${res.status}`}`);
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, body.token);
  showDashboard();
}

function init() {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token").value = "";
    $("login-error").hidden = true;
    showDashboard();
  });
  $("sign-out").addEventListener("click", () => signOut());
  $("refresh").addEventListener("click", () => load().catch(showError));
  $("client-select").addEventListener("change", (e) => selectClient(e.target.value));
  $("job-select").addEventListener("change", (e) => {
    state.jobId = e.target.value;
    renderJob().catch(showError);
  });
  const code = takeLinkCode();
  if (code) redeemLink(code).catch((err) => signOut(`This dashboard link does not work: ${err.message}`));
  else if (sessionStorage.getItem(TOKEN_KEY)) showDashboard();
  else $("token").focus();
}

init();
