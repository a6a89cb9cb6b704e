"use strict";
// The dashboard: a finance page (every project of a month), a project page and a task page,
// all read from the API as the person signed in through the organisation's identity provider
// (a session cookie; writes carry its CSRF token) or with the token the user pasted. Every amount shown is a decimal string
// the API computed, rounded for display; floats only place marks on charts.
const state = {
  token: null, session: null, signInAvailable: false, role: null, projects: [], view: null, generation: 0, shown: null, tasks: null,
  focusSort: null, charts: [], notice: null, channels: new Map(),
};
const $ = (id) => document.getElementById(id);
const PARTS = [
  ["productive", "Productive", "--productive"],
  ["idle", "Idle GPUs", "--idle"],
  ["unmeasured", "Unmeasured", "--unmeasured"],
  ["failed", "Failed runs", "--failed"],
  ["unused_commitment", "Unused commitment", "--unused"],
  ["capacity_idle", "Idle capacity", "--capacity-idle"],
  ["capacity_down", "Down capacity", "--capacity-down"],
];
// Parts a record's own cost has; the others are charged to a project, not to its tasks.
const CHARGED_PARTS = ["unused_commitment", "capacity_idle", "capacity_down"];

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

// Rounds a decimal string half-even to `digits` places without passing through a float,
// so what is shown is what finance's CSV shows.
function roundDecimal(text, digits) {
  if (text === null || text === undefined) return null;
  let negative = text.startsWith("-");
  let [whole, fraction = ""] = text.replace("-", "").split(".");
  fraction = fraction.padEnd(digits + 1, "0");
  let kept = whole + fraction.slice(0, digits);
  const next = fraction.charCodeAt(digits) - 48;
  const rest = fraction.slice(digits + 1).replace(/0/g, "");
  const lastEven = (kept.charCodeAt(kept.length - 1) - 48) % 2 === 0;
  if (next > 5 || (next === 5 && (rest.length > 0 || !lastEven))) {
    let digitsArray = kept.split("").map(Number);
    let i = digitsArray.length - 1;
    while (i >= 0) {
      if (digitsArray[i] === 9) { digitsArray[i] = 0; i -= 1; } else { digitsArray[i] += 1; break; }
    }
    if (i < 0) digitsArray.unshift(1);
    kept = digitsArray.join("");
  }
  const intPart = kept.slice(0, kept.length - digits).replace(/^0+(?=\d)/, "") || "0";
  const fracPart = digits > 0 ? "." + kept.slice(kept.length - digits) : "";
  const grouped = intPart.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  if (/^[0.,]*$/.test(grouped + fracPart)) negative = false;
  return (negative ? "-" : "") + grouped + fracPart;
}

// Multiplies a decimal string by 10^places by moving its point (per-million unit costs).
function shiftDecimal(text, places) {
  const negative = text.startsWith("-");
  let [whole, fraction = ""] = text.replace("-", "").split(".");
  fraction = fraction.padEnd(places, "0");
  const shifted = `${whole}${fraction.slice(0, places)}.${fraction.slice(places) || "0"}`;
  return (negative ? "-" : "") + shifted.replace(/^0+(?=\d)/, "");
}

// a − b of two decimal strings, exactly (BigInt on a common scale), as a decimal string.
function subtractDecimal(a, b) {
  const scale = Math.max(...[a, b].map((t) => (t.split(".")[1] || "").length));
  const scaled = (t) => {
    const negative = t.startsWith("-");
    const [whole, fraction = ""] = t.replace("-", "").split(".");
    const value = BigInt(whole + fraction.padEnd(scale, "0"));
    return negative ? -value : value;
  };
  const difference = scaled(a) - scaled(b);
  const digits = (difference < 0n ? -difference : difference).toString().padStart(scale + 1, "0");
  const text = scale > 0 ? `${digits.slice(0, digits.length - scale)}.${digits.slice(digits.length - scale)}` : digits;
  return (difference < 0n ? "-" : "") + text;
}

function money(amount, currency) {
  if (amount === null || amount === undefined) return "—";
  return `${roundDecimal(amount, 2)} ${currency}`;
}

function share(part, total) {
  const t = Number(total);
  return t > 0 ? Math.max(0, Number(part) / t * 100) : 0;
}

// How a request proves who makes it: the session cookie goes by itself, and a write made with
// it carries the session's CSRF token; a pasted token goes as a bearer token.
function credentials(method) {
  if (state.session) {
    return method && method.toUpperCase() !== "GET" ? { "X-CSRF-Token": state.session.csrf_token } : {};
  }
  return { Authorization: `Bearer ${state.token}` };
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, credentials: "same-origin", headers: { ...credentials(options.method), ...(options.headers || {}) } });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const error = new Error(body && body.detail ? body.detail : `HTTP ${response.status}`);
    error.status = response.status;
    // A problem+json 422 names each bad field: `[{pointer: "/target", message}]`.
    error.errors = body && Array.isArray(body.errors) ? body.errors : [];
    throw error;
  }
  return body;
}

// Fetches a file the API serves to a token holder and hands it to the browser as a download.
async function download(path, fallbackName) {
  const response = await fetch(path, { credentials: "same-origin", headers: credentials("GET") });
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    throw new Error(body && body.detail ? body.detail : `HTTP ${response.status}`);
  }
  const disposition = response.headers.get("Content-Disposition") || "";
  const named = /filename="([^"]+)"/.exec(disposition);
  const url = URL.createObjectURL(await response.blob());
  const link = document.createElement("a");
  link.href = url;
  link.download = named ? named[1] : fallbackName;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function announce(text) {
  $("announce").textContent = text;
}

function showLogin(message) {
  $("nav").innerHTML = "";
  $("who").textContent = "";
  $("logout").hidden = true;
  const returnTo = encodeURIComponent(`/${location.hash}`);
  $("main").innerHTML = `
    <div class="panel login">
      <h2>Sign in</h2>
      ${message ? `<div class="error" role="alert">${escapeHtml(message)}</div>` : ""}
      ${state.signInAvailable ? `
      <p><a class="button primary" id="sso" href="/auth/login?return_to=${returnTo}">Sign in with your organisation</a></p>
      <p class="muted">Or, for scripts and service accounts, paste an API token.</p>` : `
      <p class="muted">Paste an API token (admin, finance or a reader of your project).</p>`}
      <form id="login-form"><label for="token" class="sr-only">Token</label>
      <input id="token" type="password" autocomplete="off" placeholder="tl_…">
      <button class="primary" type="submit">Open dashboard</button></form>
    </div>`;
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.token = $("token").value.trim();
    localStorage.setItem("taskledger.token", state.token);
    start();
  });
  (state.signInAvailable ? $("sso") : $("token")).focus();
}

function currentMonth() {
  const now = new Date();
  return `${now.getUTCFullYear()}-${String(now.getUTCMonth() + 1).padStart(2, "0")}`;
}

const ROLE_LABELS = { admin: "Admin", finance: "Finance", reader: "Reader", ingest: "Ingest" };

function mayReadReports() {
  return state.role === "finance" || state.role === "admin";
}

async function start() {
  $("main").innerHTML = `<p class="muted" role="status">${state.session ? "Opening…" : "Checking the token…"}</p>`;
  $("logout").hidden = false;
  $("logout").textContent = state.session ? "Sign out" : "Change token";
  try {
    const token = await api("/v1/tokens/current");
    state.role = token.role;
    if (token.role === "ingest") {
      $("main").innerHTML = `<div class="panel login" role="alert"><h2>This token cannot read</h2>
        <p>It is an <b>ingest</b> token: it may only post job records for ${token.projects.map((p) => `<code>${escapeHtml(p)}</code>`).join(", ")}.
        Ask for a reader, finance or admin token to see costs.</p>
        <button type="button" class="primary" id="other-token">Use another token</button></div>`;
      $("who").textContent = "Ingest token";
      $("other-token").addEventListener("click", () => signOut());
      return;
    }
    const page = await api("/v1/projects?limit=1000");
    state.projects = page.items;
  } catch (error) {
    localStorage.removeItem("taskledger.token");
    const expired = state.session ? "Your session has ended; sign in again." : "That token is not valid (or was revoked).";
    state.session = null;
    showLogin(error.status === 401 ? expired : error.message);
    return;
  }
  $("who").textContent = state.session
    ? `${state.session.actor.name} · ${ROLE_LABELS[state.role] || state.role}`
    : `${ROLE_LABELS[state.role] || state.role} token`;
  $("project").innerHTML = state.projects.map((p) =>
    `<option value="${escapeHtml(p.id)}">${escapeHtml(p.name)} (${escapeHtml(p.id)})</option>`).join("");
  if (state.projects.length === 0 && !mayReadReports()) {
    $("main").innerHTML = `<div class="panel">No project is visible to this token yet.</div>`;
    return;
  }
  route();
}

async function signOut() {
  if (state.session) {
    await fetch("/auth/logout", { method: "POST", credentials: "same-origin", headers: credentials("POST") }).catch(() => null);
    state.session = null;
  }
  localStorage.removeItem("taskledger.token");
  state.token = null;
  state.role = null;
  state.shown = null;
  showLogin();
}
function cards(cost, burn) {
  const c = cost.currency;
  const wastePct = share(cost.waste, cost.total).toFixed(1);
  const burnCard = burn && burn.budget ? `
    <div class="card"><div class="label">Budget burn</div>
      <div class="value">${roundDecimal(burn.burn_pct, 1)}%</div>
      <div class="sub">${money(burn.spend, c)} of ${money(burn.budget, c)}${burn.forecast_pct ? ` · forecast ${roundDecimal(burn.forecast_pct, 0)}%` : ""}</div>
      <div class="meter ${Number(burn.burn_pct) >= 100 ? "over" : ""}"><div style="width:${Math.min(100, Number(burn.burn_pct))}%"></div></div>
    </div>` : `
    <div class="card"><div class="label">Budget burn</div><div class="value">—</div>
      <div class="sub">No budget set for this month</div></div>`;
  return `<div class="cards">
    <div class="card"><div class="label">Total cost</div><div class="value">${money(cost.total, c)}</div>
      <div class="sub">${(Number(cost.gpu_seconds_held) / 3600).toFixed(1)} GPU-hours held</div></div>
    <div class="card"><div class="label">Cost per completed task</div><div class="value">${money(cost.cost_per_completed_task, c)}</div>
      <div class="sub">${cost.tasks_completed} tasks completed, ${cost.tasks_failed} failed</div></div>
    <div class="card"><div class="label">Waste</div><div class="value">${money(cost.waste, c)}</div>
      <div class="sub">${wastePct}% of the total: idle, failed, unused commitment, idle capacity</div></div>
    ${burnCard}
  </div>`;
}

function breakdown(cost, currency = cost.currency, partsShown = PARTS) {
  const parts = partsShown.map(([key, label, color]) => ({ key, label, color, amount: cost.breakdown[key] ?? "0" }));
  const bar = parts.map((p) =>
    `<div title="${p.label}: ${money(p.amount, currency)}" style="width:${share(p.amount, cost.total)}%;background:var(${p.color})"></div>`).join("");
  const legend = parts.map((p) =>
    `<span style="--c:var(${p.color})">${p.label} <b>${money(p.amount, currency)}</b></span>`).join("");
  const described = parts.map((p) => `${p.label} ${money(p.amount, currency)}`).join(", ");
  return `<section><h2>Where the money went</h2><div class="panel">
    <div class="stack" role="img" aria-label="Cost breakdown: ${escapeHtml(described)}">${bar}</div><div class="legend">${legend}</div></div></section>`;
}


// ---- Charts (uPlot, vendored and served by this binary) -------------------------------------

// Every calendar day of a `YYYY-MM` month, as `YYYY-MM-DD` keys.
function daysOf(month) {
  const [year, mon] = month.split("-").map(Number);
  const count = new Date(Date.UTC(year, mon, 0)).getUTCDate();
  return Array.from({ length: count }, (_, i) => `${month}-${String(i + 1).padStart(2, "0")}`);
}

// Seconds since the epoch of a `YYYY-MM-DD` day's start; days are drawn as UTC calendar days.
function daySeconds(day) {
  return Date.UTC(Number(day.slice(0, 4)), Number(day.slice(5, 7)) - 1, Number(day.slice(8, 10))) / 1000;
}

function monthRange(month) {
  const [year, mon] = month.split("-").map(Number);
  return [Date.UTC(year, mon - 1, 1) / 1000, Date.UTC(year, mon, 1) / 1000];
}

function cssColour(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

const CHART_HEIGHT = 240;

// Charts waiting for their element to be in the page, and those drawn (to resize and destroy).
const pendingCharts = [];

function mountCharts() {
  while (pendingCharts.length) {
    const { id, build } = pendingCharts.shift();
    const element = $(id);
    if (!element) continue;
    const chart = build(element, Math.max(element.clientWidth, 280));
    state.charts.push({ chart, element });
  }
}

function destroyCharts() {
  pendingCharts.length = 0;
  for (const { chart } of state.charts) chart.destroy();
  state.charts = [];
}

window.addEventListener("resize", () => {
  for (const { chart, element } of state.charts) {
    chart.setSize({ width: Math.max(element.clientWidth, 280), height: CHART_HEIGHT });
  }
});

function axisDates(u, values) {
  return values.map((v) => {
    const d = new Date(v * 1000);
    return `${d.getUTCDate()} ${d.toLocaleString("en-GB", { month: "short", timeZone: "UTC" })}`;
  });
}

function axisMoney(currency) {
  return (u, values) => values.map((v) => COMPACT.format(v));
}

function baseOptions(width, currency) {
  return {
    width,
    height: CHART_HEIGHT,
    legend: { show: false },
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
    cursor: { drag: { x: false, y: false }, points: { size: 7 } },
    axes: [
      { values: axisDates, stroke: cssColour("--muted"), grid: { stroke: "#eef1f5" }, ticks: { stroke: "#e3e7ee" } },
      { values: axisMoney(currency), stroke: cssColour("--muted"), grid: { stroke: "#eef1f5" }, ticks: { stroke: "#e3e7ee" }, size: 56,
        label: currency, labelSize: 18, labelFont: "12px system-ui, sans-serif" },
    ],
  };
}

// The month's spend day by day against its budget: the API's running spend (`burn.days`), the
// budget and its alert thresholds, the moments they were crossed, and the linear forecast
// dashed from now to the month's end.
function burnChart(burn, month) {
  const c = burn.currency;
  const [monthStart, monthEnd] = monthRange(month);
  if (!burn.days || burn.days.length === 0) {
    return `<section id="burn"><h2>Budget burn</h2><div class="panel muted">The month has not begun.</div></section>`;
  }
  const asOf = Math.min(Date.parse(burn.as_of) / 1000, monthEnd);
  const points = burn.days.map((d, i) => ({
    x: i === burn.days.length - 1 ? Math.min(daySeconds(d.day) + 86400, asOf) : daySeconds(d.day) + 86400,
    spend: d.spend,
  }));
  const xs = [monthStart, ...points.map((p) => p.x)];
  const spends = [0, ...points.map((p) => Number(p.spend))];
  const hasForecast = burn.forecast !== null && asOf < monthEnd;
  if (xs[xs.length - 1] < monthEnd) { xs.push(monthEnd); spends.push(null); }
  const last = points.length;
  const forecastLine = xs.map((x, i) => (hasForecast && i === last ? spends[i] : hasForecast && x === monthEnd ? Number(burn.forecast) : null));
  const budget = burn.budget === null ? null : Number(burn.budget);
  const budgetLine = xs.map(() => budget);
  const thresholds = burn.thresholds.filter((t) => t.kind === "actual");
  const crossings = burn.thresholds.filter((t) => t.crossed_at);
  const top = Math.max(budget || 0, Number(burn.forecast || 0), Number(burn.spend)) * 1.08 || 1;

  pendingCharts.push({ id: "burn-chart", build: (element, width) => {
    const options = baseOptions(width, c);
    options.scales = { x: { time: true, range: [monthStart, monthEnd] }, y: { range: [0, top] } };
    options.series = [
      {},
      { label: "Spend", stroke: cssColour("--productive"), width: 2.5, fill: "rgba(0,114,178,.08)", points: { show: false } },
      { label: "Forecast", stroke: cssColour("--forecast"), width: 2, dash: [7, 5], spanGaps: true, points: { show: false } },
      { label: "Budget", stroke: cssColour("--budget"), width: 1.5, points: { show: false }, show: budget !== null },
    ];
    options.hooks = {
      draw: [(u) => drawThresholds(u, budget, thresholds, crossings)],
      setCursor: [(u) => {
        const i = u.cursor.idx;
        const readout = $("burn-readout");
        if (!readout) return;
        if (i === null || i === undefined || i === 0 || i > points.length) { readout.textContent = burnSummary(burn); return; }
        const p = points[i - 1];
        readout.textContent = `${burn.days[i - 1].day}: ${money(p.spend, c)} spent by ${i === points.length && p.x === asOf && asOf < monthEnd ? when(burn.as_of) + " UTC" : "the day's end"}${budget !== null ? ` · ${roundDecimal(String(Number(p.spend) / budget * 100), 1)}% of the budget` : ""}`;
      }],
    };
    return new uPlot(options, [xs, spends, forecastLine, budgetLine], element);
  } });

  const legend = [
    `<span class="plain"><i class="line-swatch" style="--c:var(--productive)"></i>Spend to date</span>`,
    hasForecast ? `<span class="plain"><i class="line-swatch dashed" style="--c:var(--forecast)"></i>Forecast to month end: ${money(burn.forecast, c)}</span>` : "",
    budget !== null ? `<span class="plain"><i class="line-swatch" style="--c:var(--budget)"></i>Budget ${money(burn.budget, c)}</span>` : "",
    thresholds.length && budget !== null ? `<span class="plain"><i class="line-swatch dotted" style="--c:var(--threshold)"></i>Alert thresholds ${thresholds.map((t) => `${t.percent}%`).join(", ")}</span>` : "",
  ].join("");
  const crossed = crossings.map((t) => `<li>${t.kind === "forecast" ? `Forecast reached ${t.percent}% of the budget` : `${t.percent}% of the budget spent`}: ${when(t.crossed_at)} UTC</li>`).join("");
  const rows = burn.days.map((d) => `<tr><th scope="row">${d.day}</th><td class="num">${money(d.spend, c)}</td></tr>`).join("");
  return `<section id="burn"><h2>Budget burn</h2><div class="panel">
    ${budget === null ? `<p class="muted small">No budget is set for this month: spend is shown without one.</p>` : ""}
    <div class="chart" id="burn-chart" role="img" aria-label="${escapeHtml(burnSummary(burn))}"></div>
    <div class="chart-readout" id="burn-readout" aria-hidden="true">${escapeHtml(burnSummary(burn))}</div>
    <div class="legend">${legend}</div>
    ${crossed ? `<ul class="small crossings" id="burn-crossings">${crossed}</ul>` : ""}
    <details class="figures"><summary>Spend by day as a table</summary>
      <table><caption class="sr-only">Spend of the month up to the end of each day</caption>
      <thead><tr><th scope="col">Day</th><th scope="col" class="num">Spend to date</th></tr></thead>
      <tbody id="burn-rows">${rows}</tbody></table></details>
  </div></section>`;
}

function burnSummary(burn) {
  const c = burn.currency;
  const budget = burn.budget === null ? "no budget" : `${roundDecimal(burn.burn_pct, 1)}% of the ${money(burn.budget, c)} budget`;
  const forecast = burn.forecast === null ? "" : `; forecast ${money(burn.forecast, c)}${burn.forecast_pct === null ? "" : ` (${roundDecimal(burn.forecast_pct, 0)}%)`}`;
  return `Spend ${money(burn.spend, c)} as of ${when(burn.as_of)} UTC, ${budget}${forecast}`;
}

// Threshold lines across the plot, and a mark where each alert fired.
function drawThresholds(u, budget, thresholds, crossings) {
  const ctx = u.ctx;
  const ratio = devicePixelRatio || 1;
  ctx.save();
  ctx.font = `${11 * ratio}px system-ui, sans-serif`;
  ctx.fillStyle = cssColour("--muted");
  if (budget !== null) {
    for (const t of thresholds) {
      const y = u.valToPos(budget * t.percent / 100, "y", true);
      ctx.strokeStyle = cssColour("--threshold");
      ctx.setLineDash([2 * ratio, 3 * ratio]);
      ctx.lineWidth = ratio;
      ctx.beginPath();
      ctx.moveTo(u.bbox.left, y);
      ctx.lineTo(u.bbox.left + u.bbox.width, y);
      ctx.stroke();
      ctx.textAlign = "left";
      ctx.fillText(`${t.percent}%`, u.bbox.left + 4 * ratio, y - 3 * ratio);
    }
  }
  ctx.setLineDash([]);
  for (const t of crossings) {
    // An alert that fired after the month (a late record) is marked at its end.
    const x = Math.min(u.valToPos(Date.parse(t.crossed_at) / 1000, "x", true), u.bbox.left + u.bbox.width);
    const y = t.kind === "actual" && budget !== null ? u.valToPos(budget * t.percent / 100, "y", true) : u.bbox.top + 8 * ratio;
    ctx.fillStyle = t.kind === "actual" ? cssColour("--failed") : cssColour("--forecast");
    ctx.beginPath();
    ctx.moveTo(x, y - 6 * ratio);
    ctx.lineTo(x + 6 * ratio, y);
    ctx.lineTo(x, y + 6 * ratio);
    ctx.lineTo(x - 6 * ratio, y);
    ctx.closePath();
    ctx.fill();
    ctx.fillStyle = cssColour("--ink");
    // Near the right edge the label goes to the left of its mark.
    const right = x + 60 * ratio > u.bbox.left + u.bbox.width;
    ctx.textAlign = right ? "right" : "left";
    ctx.fillText(t.kind === "actual" ? `${t.percent}% crossed` : "forecast over", right ? x - 8 * ratio : x + 8 * ratio, y + 4 * ratio);
  }
  ctx.restore();
}

// The cost of each day, stacked by where the money went. The heights are drawn from the API's
// parts; the figures read out are the API's own strings.
function dailyChart(days, month, currency) {
  if (!days.groups || days.groups.length === 0) {
    return `<section id="daily"><h2>Daily cost</h2><div class="panel muted">No rated GPU time in this month.</div></section>`;
  }
  const byDay = new Map(days.groups.map((g) => [g.key, g]));
  const keys = daysOf(month);
  const xs = keys.map((day) => daySeconds(day) + 43200);
  const stacked = [];
  let below = keys.map(() => 0);
  for (const [part] of PARTS) {
    below = keys.map((day, i) => below[i] + Number(byDay.has(day) ? byDay.get(day).breakdown[part] : 0));
    stacked.push(below);
  }
  const [monthStart, monthEnd] = monthRange(month);
  const describe = (i) => {
    const g = byDay.get(keys[i]);
    if (!g) return `${keys[i]}: no cost`;
    const parts = PARTS.filter(([part]) => Number(g.breakdown[part]) !== 0).map(([part, label]) => `${label} ${money(g.breakdown[part], currency)}`);
    return `${keys[i]}: ${money(g.total, currency)}${parts.length ? ` — ${parts.join(", ")}` : ""}`;
  };
  const costliest = days.groups.reduce((a, b) => (Number(b.total) > Number(a.total) ? b : a));
  const summary = `Daily cost of ${month}, ${days.groups.length} days with cost; the costliest, ${costliest.key}, ${money(costliest.total, currency)}`;
  pendingCharts.push({ id: "daily-chart", build: (element, width) => {
    const options = baseOptions(width, currency);
    const bars = uPlot.paths.bars({ size: [0.75, 40], align: 0 });
    options.scales = { x: { time: true, range: [monthStart, monthEnd] } };
    // The tallest stack first, so that each part is painted over the one above it.
    options.series = [{}, ...PARTS.map(([, label, colour]) => ({ label, fill: cssColour(colour), stroke: cssColour(colour), width: 0, paths: bars, points: { show: false } })).reverse()];
    options.hooks = {
      setCursor: [(u) => {
        const readout = $("daily-readout");
        if (readout) readout.textContent = u.cursor.idx === null || u.cursor.idx === undefined ? summary : describe(u.cursor.idx);
      }],
    };
    return new uPlot(options, [xs, ...stacked.slice().reverse()], element);
  } });
  const legend = PARTS.map(([, label, colour]) => `<span style="--c:var(${colour})">${label}</span>`).join("");
  const rows = keys.filter((day) => byDay.has(day)).map((day) => {
    const g = byDay.get(day);
    return `<tr><th scope="row">${day}</th><td class="num">${money(g.total, currency)}</td>${PARTS.map(([part]) => `<td class="num">${money(g.breakdown[part], currency)}</td>`).join("")}</tr>`;
  }).join("");
  return `<section id="daily"><h2>Daily cost</h2><div class="panel">
    <div class="chart" id="daily-chart" role="img" aria-label="${escapeHtml(summary)}"></div>
    <div class="chart-readout" id="daily-readout" aria-hidden="true">${escapeHtml(summary)}</div>
    <div class="legend">${legend}</div>
    <details class="figures"><summary>Daily cost as a table</summary><div class="scroll">
      <table><caption class="sr-only">Cost of each day with its parts</caption>
      <thead><tr><th scope="col">Day</th><th scope="col" class="num">Total</th>${PARTS.map(([, label]) => `<th scope="col" class="num">${label}</th>`).join("")}</tr></thead>
      <tbody id="daily-rows">${rows}</tbody></table></div></details>
  </div></section>`;
}
function outputs(cost) {
  if (!cost.output || cost.output.length === 0) return "";
  const rows = cost.output.map((o) => `<tr><td>${escapeHtml(o.unit)}</td>
    <td class="num">${roundDecimal(o.quantity, 0)}</td>
    <td class="num">${o.direct_cost_per_unit ? roundDecimal(shiftDecimal(o.direct_cost_per_unit, 6), 2) : "—"}</td>
    <td class="num">${o.loaded_cost_per_unit ? roundDecimal(shiftDecimal(o.loaded_cost_per_unit, 6), 2) : "—"}</td></tr>`).join("");
  return `<section><h2>Cost per unit of output (${escapeHtml(cost.currency)} per million units)</h2><div class="panel"><table>
    <tr><th>Unit</th><th class="num">Quantity</th><th class="num">Direct</th><th class="num">Loaded with overheads</th></tr>${rows}</table></div></section>`;
}

function unrated(cost) {
  if (!cost.unrated || cost.unrated.length === 0) return "";
  const rows = cost.unrated.map((u) => `<tr><td>${escapeHtml(u.gpu_model)}</td><td>${escapeHtml(u.reason.replace(/_/g, " "))}</td>
    <td class="num">${roundDecimal(u.gpu_seconds, 0)}</td></tr>`).join("");
  return `<section><h2>Unrated GPU time</h2><div class="panel">
    <p class="muted">No contract (or FX rate) covers this time yet, so it carries no cost. Add the missing contract and it is rated at once.</p>
    <table><tr><th>GPU model</th><th>Reason</th><th class="num">GPU-seconds</th></tr>${rows}</table></div></section>`;
}

function alertWhat(a) {
  if (a.kind === "idle_gpu") return `Idle GPU: task ${escapeHtml(a.idle_gpu.task_id)}`;
  if (a.kind === "retry_storm") return `Retry storm on ${escapeHtml(a.route.key)}=${escapeHtml(a.route.value)}: ${stormWhat(a.retry_storm)}`;
  if (a.kind === "zombie_capacity") return `Zombie node ${escapeHtml(a.zombie_capacity.node)} in ${escapeHtml(a.zombie_capacity.pool)}`;
  if (a.kind === "efficiency_regression") {
    const r = a.efficiency_regression;
    return `Cost per unit regressed: ${escapeHtml(r.workload)} per ${escapeHtml(singular(r.unit))} ${change(r.change === null ? null : String(Number(r.change) + 1))} since ${escapeHtml(r.window_from)}`;
  }
  const route = a.route ? ` on ${escapeHtml(a.route.key)}=${escapeHtml(a.route.value)}` : "";
  return `${a.kind === "forecast" ? "Forecast" : "Actual"} ${a.threshold}%${route}`;
}

function stormWhat(storm) {
  return storm.trigger === "max_attempts_per_task"
    ? `task ${escapeHtml(storm.task_id)} attempt ${storm.attempt} (cap ${storm.cap})`
    : `failed spend ${roundDecimal(storm.observed, 2)} in the hour from ${escapeHtml(storm.hour.replace("T", " ").slice(0, 16))} (cap ${roundDecimal(storm.cap, 2)})`;
}

// A project's routes (budgets and retry caps on a label value): each with its month's burn,
// caps, and the retry storms it fired.
function routesPanel(routes, burns, alertList, currency) {
  if (routes.length === 0) return "";
  const rows = routes.map((r, i) => {
    const b = burns[i];
    const storms = alertList.items.filter((a) => a.kind === "retry_storm" && a.route
      && a.route.key === r.label_key && a.route.value === r.label_value);
    const stormList = storms.length === 0 ? '<span class="muted">none</span>'
      : storms.map((a) => `<div class="small">${stormWhat(a.retry_storm)}</div>`).join("");
    return `<tr data-route="${escapeHtml(r.label_key)}=${escapeHtml(r.label_value)}">
      <th scope="row">${escapeHtml(r.label_key)}=${escapeHtml(r.label_value)}</th>
      <td class="num route-budget">${r.monthly_budget === null ? "—" : money(r.monthly_budget, currency)}</td>
      <td class="num route-spend">${b ? money(b.spend, currency) : "—"}</td>
      <td class="num route-burn">${b && b.burn_pct !== null ? `${roundDecimal(b.burn_pct, 1)}%` : "—"}</td>
      <td class="num route-attempts">${r.max_attempts_per_task === null ? "—" : r.max_attempts_per_task}</td>
      <td class="num route-failed-cap">${r.max_failed_spend_per_hour === null ? "—" : money(r.max_failed_spend_per_hour, currency)}</td>
      <td class="route-storms">${stormList}</td></tr>`;
  }).join("");
  return `<section id="routes"><h2>Routes</h2><div class="panel">
    <table><tr><th>Route</th><th class="num">Budget</th><th class="num">Spend</th><th class="num">Burn</th>
      <th class="num">Max attempts</th><th class="num">Max failed spend / hour</th><th>Retry storms</th></tr>
      <tbody id="route-rows">${rows}</tbody></table></div></section>`;
}

function alerts(list, currency) {
  const rows = list.items.map((a) => `<tr><td>${escapeHtml(a.fired_at.replace("T", " ").slice(0, 16))}</td>
    <td>${alertWhat(a)}</td>
    <td class="num">${money(a.kind === "idle_gpu" ? a.idle_gpu.cost : a.spend, currency)}</td>
    <td><span class="pill ${escapeHtml(a.delivery_state || "")}">${escapeHtml((a.delivery_state || "no webhook").replace("_", " "))}</span></td></tr>`).join("");
  return `<section><h2>Alerts</h2><div class="panel">${list.items.length === 0
    ? '<span class="muted">No alert fired this month.</span>'
    : `<table><tr><th>Fired</th><th>Alert</th><th class="num">Spend then / idle cost</th><th>Webhook</th></tr>${rows}</table>`}</div></section>`;
}

// ---- Real utilisation and right-sizing ----------------------------------------------------

// A share from 0 to 1 as a whole percentage; "—" where nothing reported it.
function pct(value) {
  return value === null || value === undefined ? "—" : `${(Number(value) * 100).toFixed(0)}%`;
}

const UTIL_METRICS = [
  ["gpu_util", "GPU-Util", "Any kernel running, as nvidia-smi shows it"],
  ["sm_active", "SM active", "Share of time the SMs had work"],
  ["tensor_active", "Tensor", "Share of cycles the tensor cores worked"],
  ["dram_active", "Memory bandwidth", "Share of cycles memory bandwidth was in use"],
];

// Model FLOPs utilisation and what a GPU-hour at the card's peak cost; null without MFU.
function mfuCards(cost) {
  const m = cost.mfu;
  if (!m) return "";
  return `<div title="Σ model FLOPs ÷ Σ (dense peak FLOPS × GPU-seconds held), over the records that report model_flops"><div class="label">MFU</div>
      <div class="value" id="mfu-value">${pct(m.value)}</div>
      <div class="small muted">model FLOPs over the cards' peak · reported for ${pct(m.coverage)} of GPU time</div></div>
    <div title="Cost per GPU-hour ÷ MFU: what an hour of the cards working at their peak cost"><div class="label">Per effective GPU-hour</div>
      <div class="value" id="effective-gpu-hour">${money(cost.cost_per_effective_gpu_hour, cost.currency)}</div>
      <div class="small muted">${money(cost.cost_per_gpu_hour, cost.currency)} per GPU-hour held</div></div>`;
}

function utilisationPanel(cost) {
  const u = cost.utilisation;
  const c = cost.currency;
  if (!u && !cost.mfu) {
    return `<section id="utilisation"><h2>Real utilisation</h2><div class="panel muted" id="utilisation-empty">
      No record this month reported GPU telemetry, so what the GPUs really did is unknown.
      Post DCGM figures (<code>gpu_util</code>, <code>sm_active</code>, <code>tensor_active</code>, <code>memory_peak_gib</code>) with the job records to see it here,
      and <code>model_flops</code> with <code>precision</code> to see MFU.</div></section>`;
  }
  if (!u) {
    return `<section id="utilisation"><h2>Real utilisation</h2><div class="panel">
      <p class="util-head" id="utilisation-headline">MFU ${pct(cost.mfu.value)}</p>
      <p class="small muted">No record reported DCGM telemetry; MFU comes from the model FLOPs the records reported.</p>
      <div class="util-grid">${mfuCards(cost)}</div></div></section>`;
  }
  const headline = [...UTIL_METRICS.slice(0, 3).filter(([key]) => u[key] !== null)
    .map(([key, label]) => `${label === "Tensor" ? "tensor" : label} ${pct(u[key])}`),
  ...(cost.mfu ? [`MFU ${pct(cost.mfu.value)}`] : [])].join(" · ");
  const metric = ([key, label, title]) => `<div title="${escapeHtml(title)}"><div class="label">${label}</div>
      <div class="value">${pct(u[key])}</div>
      <div class="small muted">${u[key] === null ? "not reported" : `reported for ${pct(u.coverage[key])} of GPU time`}</div></div>`;
  const unusedShare = u.memory_used_share === null ? null : String(1 - Number(u.memory_used_share));
  const memory = `<div title="Σ held × (1 − memory peak ÷ memory of the GPU or slice)"><div class="label">Memory paid for, unused</div>
      <div class="value">${pct(unusedShare)}</div>
      <div class="small muted">${u.memory_used_share === null ? "no record reported its memory peak"
        : `${money(cost.unused_memory_cost, c)} · ${gpuHours(cost.unused_memory_gpu_seconds)} GPU-h · reported for ${pct(u.coverage.memory_used_share)} of GPU time`}</div></div>`;
  const looksBusy = cost.looks_busy_cost === null
    ? `<div><div class="label">Looks busy, isn't</div><div class="value">—</div><div class="small muted">needs GPU-Util and SM active on the same records</div></div>`
    : `<div title="Records with GPU-Util ≥ 80% while their SMs were active under 40% of the time; part of the total, not added to it"><div class="label">Looks busy, isn't</div>
      <div class="value${Number(cost.looks_busy_cost) > 0 ? " flag" : ""}">${money(cost.looks_busy_cost, c)}</div>
      <div class="small muted">GPU-Util ≥ 80% with SM active &lt; 40%</div></div>`;
  return `<section id="utilisation"><h2>Real utilisation</h2><div class="panel">
    <p class="util-head" id="utilisation-headline">${headline || "Only memory was reported"}</p>
    <p class="small muted">Averages weighted by GPU time held, over the records that report each figure.</p>
    <div class="util-grid">${UTIL_METRICS.map(metric).join("")}${memory}${looksBusy}${mfuCards(cost)}</div></div></section>`;
}

// kWh to a readable number of digits: two decimals from 10 kWh on, three below.
function kwhText(kwh) {
  if (kwh === null || kwh === undefined) return "—";
  return `${roundDecimal(kwh, Number(kwh) >= 10 ? 2 : 3)} kWh`;
}

function energyPanel(cost) {
  const e = cost.energy;
  const em = cost.emissions;
  if (!e) {
    return `<section id="energy"><h2>Energy and emissions</h2><div class="panel muted" id="energy-empty">
      No record this month measured its energy. Post <code>energy_joules</code> with the job records (the
      Slurm importer and the Kubernetes collector read it from Slurm and DCGM) to see kWh and emissions here.</div></section>`;
  }
  const perUnit = e.kwh_per_unit.filter((u) => u.kwh !== null).map((u) => `<div><div class="label">Per ${escapeHtml(u.unit.replace(/([^s])s$/, "$1"))}</div>
      <div class="value">${escapeHtml(roundDecimal(u.kwh, 9).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, ""))} kWh</div>
      <div class="small muted">measured for ${pct(u.coverage)} of that work's GPU time</div></div>`).join("");
  const emissions = em.kg_co2e === null
    ? `<div><div class="label">Emissions</div><div class="value">—</div>
        <div class="small muted">no grid intensity for the regions and month of the measured energy</div></div>`
    : `<div title="kWh × PUE × the grid's gCO2e per kWh of each record's region and month"><div class="label">Emissions</div>
        <div class="value">${escapeHtml(roundDecimal(em.kg_co2e, 2))} kg CO2e</div>
        <div class="small muted">for ${pct(em.coverage)} of GPU time; nothing estimated for the rest</div></div>`;
  return `<section id="energy"><h2>Energy and emissions</h2><div class="panel">
    <div class="util-grid"><div title="What the GPUs drew, from the records that measured it"><div class="label">Energy</div>
      <div class="value" id="energy-kwh">${kwhText(e.kwh)}</div>
      <div class="small muted">measured for ${pct(e.coverage)} of GPU time</div></div>${emissions}${perUnit}</div></div></section>`;
}

// What an idle minute of each card costs: the price per GPU-minute of each contract in force
// now, an owned card's with the parts of its price.
function idleMinutePanel(prices, projectCurrency) {
  const rows = prices.items.map((p) => {
    const minute = projectCurrency && p.project_price_per_gpu_minute !== null
      ? `${roundDecimal(p.project_price_per_gpu_minute, 4)} ${escapeHtml(projectCurrency)}`
      : `${roundDecimal(p.price_per_gpu_minute, 4)} ${escapeHtml(p.currency)}`;
    const parts = p.price_parts
      ? `depreciation ${roundDecimal(p.price_parts.depreciation, 4)} · other ${roundDecimal(p.price_parts.other, 4)} · power ${roundDecimal(p.price_parts.power, 4)} per hour`
        + (p.depreciated_from ? `<div class="small muted">depreciated ${Date.parse(p.depreciated_from) <= Date.now() ? "since" : "from"} ${escapeHtml(when(p.depreciated_from).slice(0, 10))}</div>` : "")
      : '<span class="muted">price list</span>';
    return `<tr data-model="${escapeHtml(p.gpu_model)}"><th scope="row">${escapeHtml(p.gpu_model)}</th>
      <td>${escapeHtml(p.billing_mode.replace("_", " "))}</td><td>${escapeHtml(p.name)}</td>
      <td class="num"><b>${minute}</b></td><td class="num">${money(p.price_per_gpu_hour, p.currency)}</td><td>${parts}</td></tr>`;
  }).join("");
  return `<section id="idle-minute"><h2>What an idle minute costs</h2><div class="panel">${rows === ""
    ? '<span class="muted">No contract is in force now.</span>'
    : `<div class="scroll"><table><caption class="sr-only">The price of one GPU-minute of each card now, paid whether it works or not</caption>
      <thead><tr><th scope="col">GPU</th><th scope="col">Bought</th><th scope="col">Contract</th>
        <th scope="col" class="num">Per GPU-minute</th><th scope="col" class="num">Per GPU-hour</th><th scope="col">Made of</th></tr></thead>
      <tbody id="idle-minute-rows">${rows}</tbody></table></div>`}</div></section>`;
}

function recommendationCell(r) {
  if (r.kind === "mig") {
    const slices = r.profile.split("g.")[0];
    return `MIG <b>${escapeHtml(r.profile)}</b><div class="small muted">${slices}/7 of the card · ${r.memory_gib} GiB</div>`;
  }
  return `<b>${escapeHtml(r.gpu_model)}</b><div class="small muted">${r.memory_gib} GiB · ${pct(r.share)} of the price</div>`;
}

function recommendationsPanel(recs) {
  const head = `<section id="recommendations"><h2>Right-sizing</h2><div class="panel">`;
  if (!recs) return `${head}<span class="muted">Recommendations could not be loaded.</span></div></section>`;
  const c = recs.currency;
  const rows = recs.items.map((i) => `<tr>
    <th scope="row" class="task-id">${escapeHtml(i.workload)}</th>
    <td>${i.records} × ${escapeHtml(i.gpu_model)}<div class="small muted">up to ${escapeHtml(i.gpus)} GPU${i.gpus === "1" ? "" : "s"}</div></td>
    <td class="num">${roundDecimal(i.memory_peak_p95_gib, 1)} GiB</td>
    <td class="num">${pct(i.sm_active_p95)}</td>
    <td>${recommendationCell(i.recommendation)}</td>
    <td class="num">${money(i.period_cost, c)}</td>
    <td class="num saving" title="${escapeHtml(i.assumption)}">${money(i.estimated_saving, c)}</td></tr>`).join("");
  const table = recs.items.length === 0 ? "" : `<div class="scroll"><table class="recs">
    <caption class="sr-only">Workloads that fit a MIG slice or a cheaper GPU, largest saving first</caption>
    <thead><tr><th scope="col">Workload</th><th scope="col">Ran on</th><th scope="col" class="num">p95 memory</th>
      <th scope="col" class="num">p95 SM active</th><th scope="col">Would fit</th><th scope="col" class="num">Cost this month</th>
      <th scope="col" class="num">Estimated saving</th></tr></thead>
    <tbody id="recommendation-rows">${rows}</tbody></table></div>
    <p class="small muted">Each fits the workload's 95th-percentile memory peak and SM activity with 20% headroom. Savings assume the same run time; hover one for its assumption.</p>`;
  const skipped = recs.skipped.length === 0 ? "" : `<details class="skipped"${recs.items.length === 0 ? " open" : ""}><summary>${recs.skipped.length} workload${recs.skipped.length === 1 ? "" : "s"} without a recommendation</summary>
    <table><thead><tr><th scope="col">Workload</th><th scope="col">Ran on</th><th scope="col" class="num">Cost this month</th><th scope="col">Why</th></tr></thead>
    <tbody id="skipped-rows">${recs.skipped.map((s) => `<tr><th scope="row" class="task-id">${escapeHtml(s.workload)}</th>
      <td>${s.records} × ${escapeHtml(s.gpu_model)}</td><td class="num">${money(s.period_cost, c)}</td><td>${escapeHtml(s.reason)}</td></tr>`).join("")}</tbody></table></details>`;
  const untold = recs.workloads_without_telemetry > 0
    ? `<p class="small muted">${recs.workloads_without_telemetry} workload${recs.workloads_without_telemetry === 1 ? "" : "s"} on whole GPUs reported no memory peak or SM activity and could not be judged.</p>` : "";
  const empty = recs.items.length > 0 ? ""
    : recs.skipped.length > 0 ? `<p class="muted" id="recommendations-empty">No workload fits a smaller slice or a cheaper GPU this month.</p>`
    : `<p class="muted" id="recommendations-empty">No workload on whole GPUs reported its memory peak this month, so none can be right-sized.</p>`;
  return `${head}${empty}${table}${skipped}${untold}</div></section>`;
}

// ---- Tasks -------------------------------------------------------------------------------

const STATUSES = ["completed", "failed", "preempted", "cancelled"];
const OUTCOME_LABELS = { completed: "Completed", preempted: "Preempted", failed: "Failed", cancelled: "Cancelled" };
const TASK_PARTS = PARTS.filter(([key]) => !CHARGED_PARTS.includes(key));
const TASK_SORTS = ["cost", "waste", "gpu_hours", "queue_wait", "started_at"];
const TASKS_PER_PAGE = 50;
const TASK_COLUMNS = [
  { label: "Task" },
  { label: "Status" },
  { label: "Started", sort: "started_at", title: "First start of the task (UTC)" },
  { label: "Attempts", num: true, title: "Attempts in this month (failed ones in brackets)" },
  { label: "GPU-hours", num: true, sort: "gpu_hours", title: "GPU time held in this month" },
  { label: "Busy", num: true, title: "GPU-seconds busy ÷ held; — when no busy time was reported" },
  { label: "MFU", num: true, title: "Model FLOPs ÷ the cards' dense peak over the time held, of the attempts that reported model_flops" },
  { label: "Queue wait", num: true, sort: "queue_wait", title: "Time from queued to started, over the attempts that reported it" },
  { label: "Output", num: true },
  { label: "Cost", num: true, sort: "cost", title: "What the task cost in this month" },
  { label: "Waste", num: true, sort: "waste", title: "Idle GPUs and failed runs" },
  { label: "Final cost", num: true, title: "Lifetime total of a completed task, failed attempts included" },
  { label: "Cost per unit", num: true, title: "Final cost ÷ lifetime output" },
  { label: "Energy", num: true, title: "kWh the task's GPUs drew in this month, where its attempts measured it" },
];

// GPU-hours (GPU-seconds ÷ 3600) to one decimal: a figure for reading, never for adding up money.
function gpuHours(seconds) {
  const hours = Number(seconds) / 3600;
  if (hours > 0 && hours < 0.1) return "&lt;0.1";
  return hours.toLocaleString("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const total = Math.round(Number(seconds));
  if (total < 60) return `${total} s`;
  const minutes = Math.round(total / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours} h${minutes % 60 ? ` ${String(minutes % 60).padStart(2, "0")} min` : ""}`;
  return `${Math.floor(hours / 24)} d${hours % 24 ? ` ${hours % 24} h` : ""}`;
}

// `YYYY-MM-DD HH:MM` in UTC.
function when(iso) {
  return iso ? new Date(iso).toISOString().slice(0, 16).replace("T", " ") : "—";
}

// The end of a span: only the time when it ends on the day it began.
function until(iso, since) {
  const end = when(iso);
  return end.slice(0, 10) === when(since).slice(0, 10) ? end.slice(11) : end;
}

function quantity(text) {
  const [whole, fraction = ""] = text.split(".");
  const kept = fraction.replace(/0+$/, "");
  return roundDecimal(whole, 0) + (kept ? `.${kept}` : "");
}

function outputText(output, compact = false) {
  if (!output || output.length === 0) return "—";
  return output.map((o) => compact && Number(o.quantity) >= 10000
    ? `<span title="${quantity(o.quantity)} ${escapeHtml(o.unit)}">${COMPACT.format(Number(o.quantity))} ${escapeHtml(o.unit)}</span>`
    : `${quantity(o.quantity)} ${escapeHtml(o.unit)}`).join("<br>");
}

const COMPACT = new Intl.NumberFormat("en-US", { notation: "compact", maximumFractionDigits: 2 });

// A price as given, with at least two decimals.
function price(text) {
  const [, fraction = ""] = text.split(".");
  return roundDecimal(text, Math.max(2, fraction.replace(/0+$/, "").length));
}

// Busy share of GPU time held. The list reports busy seconds without saying how many of the
// held ones were measured, so "—" stands where nothing was, and "≥" where part was not.
function busyShare(figures) {
  const held = Number(figures.gpu_seconds_held);
  const busy = Number(figures.gpu_seconds_busy);
  const measured = busy > 0 || Number(figures.breakdown.productive) > 0 || Number(figures.breakdown.idle) > 0;
  if (!(held > 0) || !measured) return { text: "—", title: "No busy time reported" };
  const partly = Number(figures.breakdown.unmeasured) > 0;
  const pct = `${(busy / held * 100).toFixed(0)}%`;
  return partly
    ? { text: `≥ ${pct}`, title: "At least: some attempts reported no busy time" }
    : { text: pct, title: `${roundDecimal(figures.gpu_seconds_busy, 0)} of ${roundDecimal(figures.gpu_seconds_held, 0)} GPU-seconds busy` };
}

function attemptBusyShare(attempt) {
  if (attempt.gpu_seconds_busy === null) return "—";
  const held = Number(attempt.gpu_seconds_held);
  return held > 0 ? `${(Number(attempt.gpu_seconds_busy) / held * 100).toFixed(0)}%` : "—";
}

const SCALES = [[0, ""], [3, "1k "], [6, "1M "], [9, "1B "], [12, "1T "]];

// The smallest of SCALES at which a cost per unit reads 1 or more.
function unitScale(costPerUnit) {
  return SCALES.find(([p]) => Number(shiftDecimal(costPerUnit, p)) >= 1) || SCALES[SCALES.length - 1];
}

// Cost per unit scaled to a readable amount: 0.0000336 USD per token reads "33.60 USD / 1M tokens".
function perUnit(costPerUnit, currency, unit, scale) {
  if (costPerUnit === null || costPerUnit === undefined) return null;
  const [places, prefix] = scale || unitScale(costPerUnit);
  const scaled = shiftDecimal(costPerUnit, places);
  const amount = roundDecimal(scaled, 2) === "0.00" ? scaled : roundDecimal(scaled, 2);
  const named = unit || "units";
  const per = places === 0 ? named.replace(/([^s])s$/, "$1") : `${prefix}${named}`;
  return {
    amount: `${amount} ${escapeHtml(currency)}`,
    per: escapeHtml(per),
    exact: `${costPerUnit} ${currency} per ${unit ? unit.replace(/([^s])s$/, "$1") : "unit"}`,
  };
}

function statusPill(status) {
  return `<span class="pill ${escapeHtml(status)}">${escapeHtml(status)}</span>`;
}

function unratedNote(seconds) {
  return Number(seconds) > 0
    ? `<div class="small warn" title="${roundDecimal(seconds, 0)} GPU-seconds no contract or FX rate priced: they carry no cost yet">+ ${gpuHours(seconds)} GPU-h unrated</div>`
    : "";
}

function tasksPath(view) {
  const query = new URLSearchParams({ month: view.month, sort: view.sort, order: view.order, limit: TASKS_PER_PAGE });
  if (view.status) query.set("status", view.status);
  return `/v1/projects/${encodeURIComponent(view.project)}/tasks?${query}`;
}

function taskRow(view, task) {
  const c = task.currency;
  const busy = busyShare(task);
  const unit = task.output.length === 1 ? task.output[0].unit : null;
  const unitCost = perUnit(task.cost_per_unit, c, unit);
  return `<tr data-task="${escapeHtml(task.task_id)}">
    <th scope="row" class="task-id"><a href="${escapeHtml(hashOf({ ...view, task: task.task_id }))}">${escapeHtml(task.task_id)}</a></th>
    <td>${statusPill(task.status)}</td>
    <td title="${when(task.first_started_at)} UTC">${when(task.first_started_at).slice(5)}</td>
    <td class="num">${task.attempts}${task.failed_attempts ? ` <span class="muted">(${task.failed_attempts} failed)</span>` : ""}</td>
    <td class="num">${gpuHours(task.gpu_seconds_held)}</td>
    <td class="num" title="${escapeHtml(busy.title)}">${busy.text}</td>
    <td class="num"${task.mfu ? ` title="reported for ${pct(task.mfu.coverage)} of its GPU time"` : ""}>${task.mfu ? pct(task.mfu.value) : "—"}</td>
    <td class="num">${duration(task.queue_wait_seconds)}</td>
    <td class="num">${outputText(task.output, true)}</td>
    <td class="num"><b>${money(task.total, c)}</b>${unratedNote(task.unrated_gpu_seconds)}</td>
    <td class="num">${money(task.waste, c)}</td>
    <td class="num"${task.final_cost === null ? ' title="Not completed"' : ""}>${money(task.final_cost, c)}</td>
    <td class="num"${unitCost ? ` title="${escapeHtml(unitCost.exact)}"` : ""}>${unitCost ? `${unitCost.amount}<div class="small muted">per ${unitCost.per}</div>` : "—"}</td>
    <td class="num">${task.energy ? `${kwhText(task.energy.kwh)}${task.emissions && task.emissions.kg_co2e !== null
      ? `<div class="small muted">${escapeHtml(roundDecimal(task.emissions.kg_co2e, 2))} kg CO2e</div>` : ""}` : "—"}</td>
  </tr>`;
}

function taskHeader(view) {
  return TASK_COLUMNS.map((column) => {
    const title = column.title ? ` title="${escapeHtml(column.title)}"` : "";
    const cls = column.num ? ' class="num"' : "";
    if (!column.sort) return `<th scope="col"${cls}${title}>${column.label}</th>`;
    const sorted = view.sort === column.sort;
    const ariaSort = sorted ? ` aria-sort="${view.order === "asc" ? "ascending" : "descending"}"` : "";
    const arrow = sorted ? (view.order === "asc" ? "▲" : "▼") : "▼";
    const next = sorted && view.order === "desc" ? "ascending" : "descending";
    return `<th scope="col"${cls}${title}${ariaSort}><button type="button" class="sort" data-sort="${column.sort}"
      aria-label="${column.label}: sort ${next}">${column.label}<span class="arrow" aria-hidden="true">${arrow}</span></button></th>`;
  }).join("");
}

function tasksPanel(view) {
  const options = [["", "All statuses"], ...STATUSES.map((s) => [s, s[0].toUpperCase() + s.slice(1)])]
    .map(([value, label]) => `<option value="${value}"${value === view.status ? " selected" : ""}>${label}</option>`).join("");
  return `<section id="tasks" aria-labelledby="tasks-title">
    <div class="section-head"><h2 id="tasks-title">Tasks</h2>
      <label>Status <select id="task-status" aria-label="Only tasks with this status">${options}</select></label>
      <span class="muted count" id="tasks-count" aria-live="polite"></span></div>
    <div class="panel"><div class="scroll"><table class="tasks" id="task-table">
      <caption class="sr-only">Tasks of the month, sorted by the column marked as sorted; open a task for its attempts</caption>
      <thead><tr>${taskHeader(view)}</tr></thead>
      <tbody id="task-rows"><tr><td colspan="${TASK_COLUMNS.length}" class="muted">Loading tasks…</td></tr></tbody>
    </table></div><div class="more" id="tasks-more"></div></div></section>`;
}

function showTaskPage(page, append) {
  const { view } = state.tasks;
  const rows = page.items.map((task) => taskRow(view, task)).join("");
  if (append) {
    $("task-rows").insertAdjacentHTML("beforeend", rows);
  } else {
    const filter = view.status ? ` with status ${view.status}` : "";
    $("task-rows").innerHTML = rows
      || `<tr><td colspan="${TASK_COLUMNS.length}" class="muted">No task${escapeHtml(filter)} ran in this month.</td></tr>`;
  }
  state.tasks.shown += page.items.length;
  state.tasks.cursor = page.next_cursor;
  const shown = state.tasks.shown;
  $("tasks-count").textContent = `${shown} task${shown === 1 ? "" : "s"}${page.next_cursor ? " shown, more to come" : ""}`;
  $("tasks-more").innerHTML = page.next_cursor
    ? `<button type="button" id="tasks-more-button">Show ${TASKS_PER_PAGE} more</button>` : "";
}

// Fills the Tasks panel for `view`; the rest of the project page stays as it is.
async function loadTasks(view, generation, firstPage) {
  state.tasks = { view, cursor: null, shown: 0 };
  $("task-table").querySelector("thead tr").innerHTML = taskHeader(view);
  if (state.focusSort) {
    document.querySelector(`button[data-sort="${state.focusSort}"]`).focus();
    state.focusSort = null;
  }
  $("task-status").value = view.status;
  $("task-table").setAttribute("aria-busy", "true");
  try {
    const page = await (firstPage || api(tasksPath(view)));
    if (generation !== state.generation) return;
    showTaskPage(page, false);
    $("task-table").removeAttribute("aria-busy");
  } catch (error) {
    if (generation !== state.generation) return;
    $("task-rows").innerHTML = `<tr><td colspan="${TASK_COLUMNS.length}"><div class="error">${escapeHtml(error.message)}</div></td></tr>`;
    $("tasks-more").innerHTML = "";
    $("task-table").removeAttribute("aria-busy");
  }
}

async function moreTasks() {
  const generation = state.generation;
  const button = $("tasks-more-button");
  button.disabled = true;
  button.textContent = "Loading…";
  try {
    const page = await api(`${tasksPath(state.tasks.view)}&cursor=${encodeURIComponent(state.tasks.cursor)}`);
    if (generation !== state.generation) return;
    showTaskPage(page, true);
  } catch (error) {
    if (generation !== state.generation) return;
    $("tasks-more").innerHTML = `<div class="error">${escapeHtml(error.message)}</div>`;
  }
}

// ---- One task ----------------------------------------------------------------------------

const TICKS = [1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080, 20160, 40320].map((m) => m * 60000);

// The attempts on a time axis: a bar from start to end coloured by outcome, preceded by a
// lighter one for the time it waited in the queue.
function timeline(task) {
  const attempts = task.attempts;
  if (attempts.length === 0) return "";
  const c = task.currency;
  const ms = (iso) => Date.parse(iso);
  const earliest = Math.min(...attempts.map((a) => ms(a.queued_at || a.started_at)));
  const latest = Math.max(...attempts.map((a) => ms(a.ended_at)));
  const tick = TICKS.find((t) => (latest - earliest) / t <= 8) || TICKS[TICKS.length - 1];
  const t0 = Math.floor(earliest / tick) * tick;
  const t1 = Math.max(Math.ceil(latest / tick) * tick, t0 + tick);
  const width = 1100, gutter = 150, right = 100, rowHeight = 34, top = 6, barHeight = 18;
  const plot = width - gutter - right;
  const x = (t) => gutter + (t - t0) / (t1 - t0) * plot;
  const axisY = top + attempts.length * rowHeight + 4;
  const height = axisY + 34;
  const ticks = [];
  for (let t = t0; t <= t1 + 1; t += tick) {
    const stamp = when(new Date(t).toISOString());
    const daily = tick >= 86400000;
    const dated = daily || t === t0 || stamp.endsWith("00:00");
    ticks.push(`<line class="grid" x1="${x(t)}" x2="${x(t)}" y1="${top - 4}" y2="${axisY}"/>
      <text x="${x(t)}" y="${axisY + 15}" text-anchor="middle">${daily ? stamp.slice(5, 10) : stamp.slice(11)}</text>
      ${dated && !daily ? `<text x="${x(t)}" y="${axisY + 29}" text-anchor="middle">${stamp.slice(0, 10)}</text>` : ""}`);
  }
  const rows = attempts.map((a, i) => {
    const y = top + i * rowHeight + (rowHeight - barHeight) / 2;
    const start = x(ms(a.started_at));
    const end = Math.max(x(ms(a.ended_at)), start + 2);
    const outcome = escapeHtml(a.outcome);
    const ran = `${when(a.started_at)} → ${until(a.ended_at, a.started_at)} UTC (${duration((ms(a.ended_at) - ms(a.started_at)) / 1000)})`;
    const queue = a.queued_at ? `<rect class="queue ${outcome}" x="${x(ms(a.queued_at))}" y="${y}" width="${Math.max(start - x(ms(a.queued_at)), 1)}" height="${barHeight}" rx="3">
        <title>Attempt ${a.attempt} waited ${duration(a.queue_wait_seconds)} in the queue: ${when(a.queued_at)} → ${until(a.started_at, a.queued_at)} UTC</title></rect>` : "";
    return `<g data-attempt="${a.attempt}">
      <text class="row-label" x="0" y="${y + 13}">#${a.attempt}</text>
      <text x="28" y="${y + 13}">${escapeHtml(a.gpu_count)} × ${escapeHtml(a.gpu_model)}</text>
      ${queue}
      <rect class="run ${outcome}" x="${start}" y="${y}" width="${end - start}" height="${barHeight}" rx="3">
        <title>Attempt ${a.attempt}: ${outcome}, ${ran}, ${escapeHtml(a.gpu_count)} × ${escapeHtml(a.gpu_model)} ${escapeHtml(a.billing_mode.replace(/_/g, " "))}, ${money(a.total, c)}</title></rect>
      <text class="cost-label" x="${end + 6}" y="${y + 13}">${money(a.total, c)}</text></g>`;
  }).join("");
  const outcomes = [...new Set(attempts.map((a) => a.outcome))];
  const legend = outcomes.map((o) => `<span style="--c:var(--${escapeHtml(o)})">${escapeHtml(OUTCOME_LABELS[o] || o)}</span>`).join("")
    + (attempts.some((a) => a.queued_at) ? `<span class="queue-swatch" style="--c:var(--cancelled)">Queue wait (lighter, before its bar)</span>` : "");
  const summary = attempts.map((a) => `attempt ${a.attempt} ${a.outcome}${a.queued_at ? ` after ${duration(a.queue_wait_seconds)} in the queue` : ""}, ${when(a.started_at)} to ${when(a.ended_at)} UTC, ${money(a.total, c)}`).join("; ");
  return `<section><h2>Attempts over time</h2><div class="panel">
    <svg class="timeline" viewBox="0 0 ${width} ${height}" width="100%" role="img" aria-labelledby="timeline-title timeline-desc">
      <title id="timeline-title">Timeline of the task's ${attempts.length} attempt${attempts.length === 1 ? "" : "s"} (UTC)</title>
      <desc id="timeline-desc">${escapeHtml(summary)}</desc>
      ${ticks.join("")}<line class="axis" x1="${gutter}" x2="${gutter + plot}" y1="${axisY}" y2="${axisY}"/>${rows}
    </svg><div class="legend">${legend}</div></div></section>`;
}

function attemptRow(task, a) {
  const c = task.currency;
  const labels = Object.entries(a.labels || {}).map(([k, v]) => `${escapeHtml(k)}=${escapeHtml(v)}`).join(" ");
  const where = [a.billing_mode.replace(/_/g, " "), a.provider, a.region].filter(Boolean).map(escapeHtml).join(" · ");
  const parts = TASK_PARTS.filter(([key]) => Number(a.breakdown[key]) !== 0)
    .map(([key, label]) => `<li>${label}<div class="small">${money(a.breakdown[key], c)}</div></li>`).join("");
  const contracts = a.contracts.map((k) => `<li>${escapeHtml(k.name)}: ${money(k.cost, c)}<div class="small muted">${gpuHours(k.gpu_seconds_held)} GPU-h at ${price(k.price_per_gpu_hour)} ${escapeHtml(k.contract_currency)}/GPU-h</div></li>`).join("");
  const unrated = a.unrated.map((u) => `<li class="warn">${roundDecimal(u.gpu_seconds, 0)} GPU-s: ${escapeHtml(u.reason.replace(/_/g, " "))}</li>`).join("");
  const settles = a.completes_task ? "completed the task" : a.fails_task ? "failed the task" : "";
  const ranFor = duration((Date.parse(a.ended_at) - Date.parse(a.started_at)) / 1000);
  const counts = [a.retries ? `${a.retries} retr${a.retries === 1 ? "y" : "ies"}` : "", a.failures ? `${a.failures} failure${a.failures === 1 ? "" : "s"}` : ""].filter(Boolean).join(", ");
  return `<tr data-attempt="${a.attempt}">
    <th scope="row">#${a.attempt}${labels ? `<div class="small muted labels">${labels}</div>` : ""}</th>
    <td>${statusPill(a.outcome)}${settles ? `<div class="small muted">${settles}</div>` : ""}${counts ? `<div class="small muted">${counts}</div>` : ""}</td>
    <td>${when(a.started_at).slice(0, 10)}<div>${when(a.started_at).slice(11)} → ${until(a.ended_at, a.started_at)}</div><div class="small muted">${ranFor}</div></td>
    <td class="num">${duration(a.queue_wait_seconds)}${a.queued_at ? `<div class="small muted">queued ${until(a.queued_at, a.started_at)}</div>` : ""}</td>
    <td>${escapeHtml(a.gpu_count)} × ${escapeHtml(a.gpu_model)}<div class="small muted">${where}</div></td>
    <td class="num">${gpuHours(a.gpu_seconds_held)}<div class="small muted">busy ${attemptBusyShare(a)}</div>${a.mfu !== null && a.mfu !== undefined
      ? `<div class="small muted" title="${escapeHtml(a.model_flops)} FLOPs in ${escapeHtml(a.precision)}">MFU ${pct(a.mfu)}</div>` : ""}</td>
    <td class="num"><b>${money(a.total, c)}</b></td>
    <td class="wrap">${parts ? `<ul class="plain">${parts}</ul>` : '<span class="muted">—</span>'}</td>
    <td class="wrap">${contracts ? `<ul class="plain">${contracts}</ul>` : '<span class="muted">none</span>'}</td>
    <td${unrated ? ' class="wrap"' : ""}>${unrated ? `<ul class="plain">${unrated}</ul>` : '<span class="muted">—</span>'}</td>
    <td class="num">${a.output ? outputText([a.output], true) : "—"}</td>
  </tr>`;
}

function attemptTable(task) {
  return `<section><h2>Attempts</h2><div class="panel"><div class="scroll"><table class="attempts" id="attempt-table">
    <caption class="sr-only">Every attempt of the task with what it cost and the contracts that priced it</caption>
    <thead><tr><th scope="col">Attempt</th><th scope="col">Outcome</th><th scope="col">Ran (UTC)</th>
      <th scope="col" class="num">Queue wait</th><th scope="col">GPUs</th><th scope="col" class="num">GPU-hours</th>
      <th scope="col" class="num">Cost</th><th scope="col">Parts</th><th scope="col">Contracts</th>
      <th scope="col">Unrated</th><th scope="col" class="num">Output</th></tr></thead>
    <tbody id="attempt-rows">${task.attempts.map((a) => attemptRow(task, a)).join("")}</tbody></table></div></div></section>`;
}

function monthsTable(view, task) {
  const c = task.currency;
  const rows = task.months.map((m) => `<tr><th scope="row"><a href="${escapeHtml(hashOf({ ...view, month: m.month, task: null }))}">${escapeHtml(m.month)}</a></th>
    <td class="num">${m.attempts}</td><td class="num">${gpuHours(m.gpu_seconds_held)}</td>
    <td class="num"><b>${money(m.total, c)}</b>${unratedNote(m.unrated_gpu_seconds)}</td><td class="num">${money(m.waste, c)}</td>
    <td class="num">${outputText(m.output)}</td></tr>`).join("");
  return `<section><h2>Cost per month</h2><div class="panel"><table>
    <caption class="sr-only">The task's cost in each ledger month</caption>
    <thead><tr><th scope="col">Month</th><th scope="col" class="num">Attempts ended</th><th scope="col" class="num">GPU-hours</th>
      <th scope="col" class="num">Cost</th><th scope="col" class="num">Waste</th><th scope="col" class="num">Output</th></tr></thead>
    <tbody id="month-rows">${rows}</tbody></table></div></section>`;
}

function backLink(view) {
  const project = state.projects.find((p) => p.id === view.project);
  return `<p class="crumbs"><a href="${escapeHtml(hashOf({ ...view, task: null }))}">← Tasks of ${escapeHtml(project ? project.name : view.project)}, ${escapeHtml(view.month)}</a></p>`;
}

function taskPage(view, task) {
  const c = task.currency;
  const life = task.lifetime;
  const unit = life.output.length === 1 ? life.output[0].unit : null;
  const unitCost = perUnit(task.cost_per_unit, c, unit);
  const busy = busyShare(life);
  const finalCard = task.final_cost !== null
    ? `<div class="value">${money(task.final_cost, c)}</div><div class="sub">Lifetime total, failed attempts included</div>`
    : `<div class="value">—</div><div class="sub">Not completed; ${money(life.total, c)} so far</div>`;
  const unitCard = unitCost
    ? `<div class="value" title="${escapeHtml(unitCost.exact)}">${unitCost.amount}</div><div class="sub">per ${unitCost.per} · ${outputText(life.output)} in all</div>`
    : `<div class="value">—</div><div class="sub">${life.output.length ? `Output: ${outputText(life.output)}` : "No output reported"}</div>`;
  const counts = [
    `${life.failed_attempts} failed`,
    `${life.retries} retr${life.retries === 1 ? "y" : "ies"}`,
    `${life.failures} failure${life.failures === 1 ? "" : "s"}`,
    life.queue_wait_seconds !== null ? `${duration(life.queue_wait_seconds)} queued` : "",
  ].filter(Boolean).join(" · ");
  return `${backLink(view)}
    <h2 class="task-title">Task <span class="name">${escapeHtml(task.task_id)}</span> ${statusPill(task.status)}</h2>
    <p class="task-meta">Ran ${when(task.first_started_at)} → ${until(task.last_ended_at, task.first_started_at)} UTC on ${task.gpu_models.map(escapeHtml).join(", ")}${task.completed_at ? ` · completed ${when(task.completed_at)}` : ""}</p>
    <div class="cards">
      <div class="card" id="final-cost"><div class="label">Final cost</div>${finalCard}</div>
      <div class="card"><div class="label">Cost per unit</div>${unitCard}</div>
      <div class="card"><div class="label">GPU time</div><div class="value">${gpuHours(life.gpu_seconds_held)} GPU-h</div>
        <div class="sub" title="${escapeHtml(busy.title)}">${busy.text === "—" ? "No busy time reported" : `${busy.text} of it busy`}</div>${unratedNote(life.unrated_gpu_seconds)}</div>
      <div class="card"><div class="label">Attempts</div><div class="value">${life.attempts}</div><div class="sub">${counts}</div></div>
    </div>
    ${breakdown(life, c, TASK_PARTS)}${timeline(task)}${attemptTable(task)}${monthsTable(view, task)}`;
}

async function renderTask(view, generation) {
  state.shown = null;
  $("main").innerHTML = `${backLink(view)}<p class="muted">Loading task ${escapeHtml(view.task)}…</p>`;
  try {
    const task = await api(`/v1/projects/${encodeURIComponent(view.project)}/tasks/${encodeURIComponent(view.task)}`);
    if (generation !== state.generation) return;
    if (task.task_id !== view.task) throw new Error(`This task id cannot be opened here: ${view.task}`);
    $("main").innerHTML = taskPage(view, task);
    document.title = `${view.task} · taskledger`;
    document.body.dataset.loaded = "true";
  } catch (error) {
    if (generation !== state.generation) return;
    $("main").innerHTML = `${backLink(view)}<div class="error">${escapeHtml(error.message)}</div>`;
  }
}


// ---- The project page ---------------------------------------------------------------------

// Waste as a share of the total, to one decimal: a ratio for reading, not an amount.
function wasteShare(figures) {
  return Number(figures.total) > 0 ? `${(Number(figures.waste) / Number(figures.total) * 100).toFixed(1)}%` : "—";
}

// Costs per unit of output, each unit on the scale `scales` gives it (rows compared in one
// table share one scale per unit, so that 0.89 per 1M is not read against 890 per 1B).
function unitCosts(figures, currency, scales = new Map()) {
  const costs = (figures.output || []).filter((o) => o.direct_cost_per_unit !== null).map((o) => {
    const unit = perUnit(o.direct_cost_per_unit, currency, o.unit, scales.get(o.unit));
    return `<span title="${escapeHtml(unit.exact)}">${unit.amount}<span class="small muted"> per ${unit.per}</span></span>`;
  });
  return costs.length ? costs.join("<br>") : "—";
}

function teamPanel(byTeam, currency) {
  const groups = byTeam.groups || [];
  if (groups.length === 0) {
    return `<section id="teams"><h2>By team</h2><div class="panel muted">No cost this month.</div></section>`;
  }
  const rows = groups.map((g) => `<tr>
    <th scope="row">${g.key === null ? '<span class="muted">no team label</span>' : escapeHtml(g.key)}</th>
    <td class="num"><b>${money(g.total, currency)}</b></td>
    <td class="num">${share(g.total, byTeam.total).toFixed(1)}%<div class="meter" aria-hidden="true"><div style="width:${share(g.total, byTeam.total)}%"></div></div></td>
    <td class="num">${money(g.waste, currency)}</td>
    <td class="num">${g.tasks_completed}</td>
    <td class="num">${money(g.cost_per_completed_task, currency)}</td></tr>`).join("");
  return `<section id="teams"><h2>By team</h2><div class="panel"><div class="scroll"><table>
    <caption class="sr-only">The month's cost by the records' team label</caption>
    <thead><tr><th scope="col">Team</th><th scope="col" class="num">Cost</th><th scope="col" class="num">Share</th>
      <th scope="col" class="num">Waste</th><th scope="col" class="num">Tasks completed</th><th scope="col" class="num">Cost per completed task</th></tr></thead>
    <tbody id="team-rows">${rows}</tbody></table></div>
    <p class="small muted">Unused commitment of the project's own reservations, and idle or down capacity charged to it, belong to no team.</p></div></section>`;
}

const BILLING_LABELS = { on_demand: "on demand", spot: "spot", reserved: "reserved" };

// What a finished task costs on each GPU model as bought, from `group_by=gpu_model,billing_mode`
// (keys `<model>/<mode>`; a billing mode holds no `/`).
function comparisonPanel(byModel, currency) {
  const groups = (byModel.groups || []).filter((g) => g.key !== null);
  if (groups.length === 0) {
    return `<section id="compare"><h2>Compare GPU models and billing modes</h2><div class="panel muted">No GPU time this month.</div></section>`;
  }
  const scales = new Map();
  for (const o of groups.flatMap((g) => g.output || []).filter((o) => o.direct_cost_per_unit !== null)) {
    const scale = unitScale(o.direct_cost_per_unit);
    if (!scales.has(o.unit) || scale[0] < scales.get(o.unit)[0]) scales.set(o.unit, scale);
  }
  const priced = groups.filter((g) => g.cost_per_completed_task !== null);
  const cheapest = priced.length > 1
    ? priced.reduce((a, b) => (Number(b.cost_per_completed_task) < Number(a.cost_per_completed_task) ? b : a)).key : null;
  const rows = groups.map((g) => {
    const cut = g.key.lastIndexOf("/");
    const model = g.key.slice(0, cut);
    const mode = g.key.slice(cut + 1);
    return `<tr data-key="${escapeHtml(g.key)}">
      <th scope="row">${escapeHtml(model)}</th><td>${escapeHtml(BILLING_LABELS[mode] || mode)}</td>
      <td class="num">${gpuHours(g.gpu_seconds_held)}${unratedNote(g.unrated_gpu_seconds)}</td>
      <td class="num">${money(g.total, currency)}</td>
      <td class="num">${g.tasks_completed}${g.tasks_failed ? ` <span class="muted">(${g.tasks_failed} failed)</span>` : ""}</td>
      <td class="num"><b>${money(g.cost_per_completed_task, currency)}</b>${g.key === cheapest ? '<span class="badge">lowest</span>' : ""}</td>
      <td class="num">${unitCosts(g, currency, scales)}</td>
      <td class="num">${wasteShare(g)}</td></tr>`;
  }).join("");
  return `<section id="compare"><h2>Compare GPU models and billing modes</h2><div class="panel"><div class="scroll"><table>
    <caption class="sr-only">Cost per completed task, per unit of output and waste on each GPU model and billing mode</caption>
    <thead><tr><th scope="col">GPU model</th><th scope="col">Billing</th><th scope="col" class="num">GPU-hours</th>
      <th scope="col" class="num">Cost</th><th scope="col" class="num">Tasks completed</th>
      <th scope="col" class="num" title="Cost ÷ tasks completed, failed attempts and idle time included">Cost per completed task</th>
      <th scope="col" class="num" title="Cost of completed records ÷ their output">Cost per unit of output</th>
      <th scope="col" class="num" title="Idle, failed and unused commitment ÷ cost">Waste share</th></tr></thead>
    <tbody id="compare-rows">${rows}</tbody></table></div>
    <p class="small muted">A card cheaper per hour but slower, or preempted more often, is not cheaper per task: failed attempts and idle time count in what a finished task cost.</p></div></section>`;
}

// ---- Why cost per unit moved ----------------------------------------------------------------

// The ledger month before `YYYY-MM`.
function monthBefore(month) {
  const [year, m] = month.split("-").map(Number);
  return m === 1 ? `${year - 1}-12` : `${year}-${String(m - 1).padStart(2, "0")}`;
}

// A factor (period ÷ baseline) as a signed change: "+100%", "−33%".
function change(factor) {
  if (factor === null || factor === undefined) return "—";
  const delta = (Number(factor) - 1) * 100;
  return `${delta >= 0 ? "+" : "−"}${Math.abs(delta).toFixed(0)}%`;
}

// The workloads of the month with output, each unit compared with the month before.
async function workloadChanges(base, month) {
  const groups = await api(`${base}/cost?month=${month}&group_by=label:workload`).catch(() => null);
  if (!groups) return [];
  const pairs = groups.groups.filter((g) => g.key !== null)
    .sort((a, b) => Number(b.total) - Number(a.total)).slice(0, 8)
    .flatMap((g) => g.output.map((o) => [g.key, o.unit]));
  const found = await Promise.all(pairs.map(([workload, unit]) =>
    api(`${base}/efficiency?workload=${encodeURIComponent(workload)}&unit=${encodeURIComponent(unit)}&month=${month}&baseline_month=${monthBefore(month)}`)
      .catch(() => null)));
  return found.filter(Boolean);
}

// A cost per unit with the digits it needs, at most eight decimals.
function unitPrice(text) {
  if (text === null || text === undefined) return "—";
  const [, fraction = ""] = text.split(".");
  return roundDecimal(text, Math.min(8, Math.max(2, fraction.replace(/0+$/, "").length)));
}

const FACTOR_LABELS = { price: "price per GPU-hour", throughput: "GPU-hours per unit", overhead: "failed and retried work" };

function singular(unit) {
  return unit.replace(/([^s])s$/, "$1");
}

// The workloads regressed now (a level shift of daily cost per unit that fired an alert and
// has not recovered), each with what its alert found.
function regressedList(regressions, alertList) {
  const now = regressions ? regressions.workloads.filter((w) => w.regressed) : [];
  if (!now.length) return "";
  const c = regressions.currency;
  const items = now.map((w) => {
    const found = alertList.items.map((a) => a.efficiency_regression)
      .find((r) => r && r.workload === w.workload && r.unit === w.unit && r.window_from === w.since);
    const ratio = Number(w.baseline_cost_per_unit) > 0
      ? String(Number(w.window_cost_per_unit) / Number(w.baseline_cost_per_unit)) : null;
    const extra = found ? ` · ${money(found.extra_cost_per_day, c)} a day more` : "";
    const why = found && found.largest ? ` · largest: <b>${escapeHtml(FACTOR_LABELS[found.largest])}</b>` : "";
    return `<li data-regressed="${escapeHtml(w.workload)}"><b>${escapeHtml(w.workload)}</b> per ${escapeHtml(singular(w.unit))}:
      ${unitPrice(w.baseline_cost_per_unit)} → <b>${unitPrice(w.window_cost_per_unit)}</b> ${escapeHtml(c)} (${change(ratio)})
      since ${escapeHtml(w.since)}${extra}${why}</li>`;
  }).join("");
  return `<div class="regressed" id="regressed" role="status"><b>Regressed now</b>
    <span class="small muted">(median daily cost per unit of the last ${regressions.rule.window_days} days against the ${regressions.rule.baseline_days} before, above ${roundDecimal(String(Number(regressions.rule.threshold) * 100), 0)}%)</span>
    <ul>${items}</ul></div>`;
}

function efficiencyPanel(changes, month, regressions, alertList) {
  const title = `<h2>Why cost per unit moved</h2>`;
  const regressed = regressedList(regressions, alertList);
  if (!changes.length) {
    return `<section id="efficiency">${title}${regressed}<div class="panel muted" id="efficiency-empty">
      No record this month carries a <code>workload</code> label with output. Label records by workload to see how each one's
      cost per unit moved against ${escapeHtml(monthBefore(month))}, and why.</div></section>`;
  }
  const c = changes[0].currency;
  const rows = changes.map((e) => {
    const models = (e.period.gpu_models || []).map((m) => escapeHtml(m.gpu_model)).join(", ");
    const before = (e.baseline.gpu_models || []).map((m) => escapeHtml(m.gpu_model)).join(", ");
    const why = e.largest ? `<b>${escapeHtml(FACTOR_LABELS[e.largest])}</b>` : "—";
    return `<tr data-workload="${escapeHtml(e.workload)}">
      <th scope="row">${escapeHtml(e.workload)}<div class="small muted">per ${escapeHtml(singular(e.unit))}</div></th>
      <td class="num">${unitPrice(e.cost_per_unit.baseline)}</td>
      <td class="num"><b>${unitPrice(e.cost_per_unit.period)}</b></td>
      <td class="num${e.ratio !== null && Number(e.ratio) > 1.25 ? " flag" : ""}">${change(e.ratio)}</td>
      <td class="num">${change(e.factors && e.factors.price)}</td>
      <td class="num">${change(e.factors && e.factors.throughput)}</td>
      <td class="num">${change(e.factors && e.factors.overhead)}</td>
      <td>${why}<div class="small muted">${before && before !== models ? `${before} → ${models}` : models}${e.period.failed_attempts ? ` · ${e.period.failed_attempts} failed attempt${e.period.failed_attempts === 1 ? "" : "s"}` : ""}</div></td></tr>`;
  }).join("");
  return `<section id="efficiency">${title}<div class="panel">${regressed}<div class="scroll"><table>
    <caption class="sr-only">Each workload's cost per unit this month against last month, split into price, throughput and overhead</caption>
    <thead><tr><th scope="col">Workload</th><th scope="col" class="num">${escapeHtml(monthBefore(month))} (${escapeHtml(c)})</th>
      <th scope="col" class="num">${escapeHtml(month)} (${escapeHtml(c)})</th><th scope="col" class="num">Change</th>
      <th scope="col" class="num" title="Cost per GPU-hour: contracts, billing modes, GPU models">Price</th>
      <th scope="col" class="num" title="GPU-hours per unit of completed work: a slower card, a less efficient run">Throughput</th>
      <th scope="col" class="num" title="All GPU-hours ÷ those of completed attempts: failures and retries">Overhead</th>
      <th scope="col">Largest</th></tr></thead>
    <tbody id="efficiency-rows">${rows}</tbody></table></div>
    <p class="small muted">Cost per unit = price per GPU-hour × GPU-hours per unit × overhead; the change is the product of the three.</p></div></section>`;
}

function pageHead(title, extra = "") {
  return `<div class="page-head"><h2 id="page-title">${title}</h2>${extra}</div>`;
}

function projectName(id) {
  const project = state.projects.find((p) => p.id === id);
  return project ? project.name : id;
}

async function renderProject(view, generation) {
  const { project, month } = view;
  destroyCharts();
  $("main").innerHTML = `<p class="muted" role="status">Loading ${escapeHtml(project)} ${escapeHtml(month)}…</p>`;
  $("main").setAttribute("aria-busy", "true");
  try {
    const base = `/v1/projects/${encodeURIComponent(project)}`;
    const firstTasks = api(tasksPath(view));
    firstTasks.catch(() => {});
    const [cost, days, burn, byTeam, byModel, alertList, recs, prices] = await Promise.all([
      api(`${base}/cost?month=${month}`),
      api(`${base}/cost?month=${month}&group_by=day`),
      api(`${base}/burn?month=${month}`),
      api(`${base}/cost?month=${month}&group_by=label:team`),
      api(`${base}/cost?month=${month}&group_by=gpu_model,billing_mode`),
      api(`/v1/alerts?project=${encodeURIComponent(project)}&month=${month}`).catch(() => ({ items: [] })),
      api(`${base}/recommendations?month=${month}`).catch(() => null),
      api(`${base}/prices`).catch(() => ({ items: [] })),
    ]);
    const changes = await workloadChanges(base, month);
    const routes = await api(`${base}/routes`).catch(() => []);
    const regressions = await api(`${base}/efficiency/regressions`).catch(() => null);
    const routeBurns = await Promise.all(routes.map((r) =>
      api(`${base}/routes/${encodeURIComponent(r.label_key)}/${encodeURIComponent(r.label_value)}/burn?month=${month}`).catch(() => null)));
    if (generation !== state.generation) return;
    $("main").innerHTML = pageHead(`${escapeHtml(projectName(project))} <span class="muted">· ${escapeHtml(month)}</span>`)
      + projectTabs(view) + cards(cost, burn) + burnChart(burn, month) + breakdown(cost)
      + teamPanel(byTeam, cost.currency) + dailyChart(days, month, cost.currency)
      + comparisonPanel(byModel, cost.currency)
      + utilisationPanel(cost) + efficiencyPanel(changes, month, regressions, alertList) + energyPanel(cost)
      + idleMinutePanel(prices, cost.currency)
      + recommendationsPanel(recs)
      + routesPanel(routes, routeBurns, alertList, cost.currency)
      + tasksPanel(view) + outputs(cost) + unrated(cost) + alerts(alertList, cost.currency);
    mountCharts();
    state.shown = `${project}|${month}`;
    await loadTasks(view, generation, firstTasks);
    if (generation !== state.generation) return;
    document.title = `${projectName(project)} ${month} · taskledger`;
    $("main").removeAttribute("aria-busy");
    document.body.dataset.loaded = "true";
  } catch (error) {
    if (generation !== state.generation) return;
    $("main").removeAttribute("aria-busy");
    $("main").innerHTML = `<div class="error" role="alert">${escapeHtml(error.message)}</div>`;
  }
}

// ---- The finance page: every project of a month ------------------------------------------

function monthName(month) {
  const [year, mon] = month.split("-").map(Number);
  return new Date(Date.UTC(year, mon - 1, 1)).toLocaleString("en-GB", { month: "long", year: "numeric", timeZone: "UTC" });
}

// The burn of a budget as a bar with a tick at each alert threshold and a dashed mark at the
// forecast; the text next to it says the same for those who do not see the bar.
function burnCell(line, thresholds) {
  if (line.budget === null || line.budget === undefined) return `<td class="burn-cell muted" data-label="Burn">no budget</td>`;
  const burn = Number(line.burn_pct);
  const forecast = line.forecast_pct === null || line.forecast_pct === undefined ? null : Number(line.forecast_pct);
  const scale = Math.min(Math.max(100, burn, forecast || 0, ...thresholds) * 1.1, 250);
  const at = (percent) => `${Math.min(percent, scale) / scale * 100}%`;
  const ticks = thresholds.map((t) => `<span class="tick" style="left:${at(t)}" title="${t}% threshold"></span>`).join("");
  const marker = forecast === null ? "" : `<span class="forecast" style="left:${at(forecast)}" title="Forecast ${roundDecimal(line.forecast_pct, 0)}%"></span>`;
  const text = `${roundDecimal(line.burn_pct, 1)}%${forecast === null ? "" : ` · forecast ${roundDecimal(line.forecast_pct, 0)}%`}`;
  return `<td class="burn-cell" data-label="Burn"><span class="burn-text">${text}</span>
    <div class="burn${burn >= 100 ? " over" : ""}" aria-hidden="true"><span class="fill" style="width:${at(burn)}"></span>${ticks}${marker}</div></td>`;
}

function alertsCell(projectAlerts) {
  if (projectAlerts.length === 0) return `<td class="muted" data-label="Alerts">none</td>`;
  const budget = projectAlerts.filter((a) => a.kind !== "idle_gpu")
    .map((a) => (a.kind === "forecast" ? "forecast" : `${a.threshold}%`));
  const idle = projectAlerts.filter((a) => a.kind === "idle_gpu").length;
  const parts = [...new Set(budget)].sort();
  if (idle) parts.push(`${idle} idle GPU`);
  return `<td data-label="Alerts">${parts.map(escapeHtml).join(" · ")}</td>`;
}

function projectRow(view, line, alertsByProject) {
  const c = line.currency;
  const project = state.projects.find((p) => p.id === line.project);
  const thresholds = project ? project.alert_thresholds : [50, 80, 100];
  const link = hashOf({ ...view, page: "project", project: line.project, task: null });
  return `<tr data-project="${escapeHtml(line.project)}">
    <th scope="row"><a href="${escapeHtml(link)}">${escapeHtml(line.name)}</a><div class="small muted">${escapeHtml(line.project)}${line.team ? ` · ${escapeHtml(line.team)}` : ""}</div></th>
    <td class="num" data-label="Spend"><b>${money(line.total, c)}</b>${unratedNote(line.unrated_gpu_seconds)}</td>
    <td class="num" data-label="Budget">${money(line.budget, c)}</td>
    ${burnCell(line, thresholds)}
    <td class="num" data-label="Waste">${money(line.waste, c)}<div class="small muted">${wasteShare(line)}</div></td>
    <td class="num" data-label="Cost per completed task">${money(line.cost_per_completed_task, c)}<div class="small muted">${line.tasks_completed} completed</div></td>
    ${alertsCell(alertsByProject.get(line.project) || [])}</tr>`;
}

function totalsTable(report) {
  const rows = report.totals.map((t) => `<tr><th scope="row">${escapeHtml(t.currency)}</th>
    <td class="num">${money(t.projects, t.currency)}</td><td class="num">${money(t.shared, t.currency)}</td>
    <td class="num">${money(t.pools ?? "0", t.currency)}</td>
    <td class="num">${money(t.adjustments, t.currency)}</td><td class="num"><b>${money(t.total, t.currency)}</b></td></tr>`).join("");
  return `<section id="totals"><h2>Totals per currency</h2><div class="panel"><div class="scroll"><table>
    <caption class="sr-only">Grand totals of the month in each currency</caption>
    <thead><tr><th scope="col">Currency</th><th scope="col" class="num">Projects</th><th scope="col" class="num">Shared unused commitment</th>
      <th scope="col" class="num">Kept on pools</th>
      <th scope="col" class="num">Prior-period adjustments</th><th scope="col" class="num">Total</th></tr></thead>
    <tbody id="total-rows">${rows || `<tr><td colspan="6" class="muted">Nothing was spent this month.</td></tr>`}</tbody></table></div></div></section>`;
}

function commitmentsPanel(report) {
  const lines = report.commitments || [];
  const shared = report.shared.map((s) => `${money(s.unused_commitment, s.currency)} (${roundDecimal(s.unused_gpu_hours, 1)} GPU-h)`).join(" + ");
  const rows = lines.map((l) => {
    const used = Number(l.committed_gpu_hours) > 0 ? Number(l.used_gpu_hours) / Number(l.committed_gpu_hours) * 100 : 0;
    return `<tr data-contract="${escapeHtml(l.name)}"><th scope="row">${escapeHtml(l.name)}</th>
      <td>${l.project === null ? '<span class="pill">shared</span>' : escapeHtml(l.project)}</td>
      <td>${escapeHtml(roundDecimal(l.committed_gpus, 0))} × ${escapeHtml(l.gpu_model)}</td>
      <td class="num">${roundDecimal(l.committed_gpu_hours, 1)}</td>
      <td class="num">${roundDecimal(l.used_gpu_hours, 1)}<div class="meter" aria-hidden="true"><div style="width:${used}%"></div></div></td>
      <td class="num">${used.toFixed(1)}%</td>
      <td class="num">${money(l.unused_commitment, l.currency)}</td></tr>`;
  }).join("");
  const none = report.commitments === undefined
    ? "This month was closed before its report listed each commitment."
    : "No reservation outside a capacity pool commits GPUs this month: a pool's reserved or owned cards show their idle time under Capacity pools.";
  const table = lines.length === 0 ? `<p class="muted">${none}</p>` : `<div class="scroll"><table>
    <caption class="sr-only">Each reserved contract's committed and used GPU-hours this month</caption>
    <thead><tr><th scope="col">Contract</th><th scope="col">Charged to</th><th scope="col">Commitment</th>
      <th scope="col" class="num">Committed GPU-h</th><th scope="col" class="num">Used GPU-h</th><th scope="col" class="num">Used</th>
      <th scope="col" class="num">Unused commitment</th></tr></thead>
    <tbody id="commitment-rows">${rows}</tbody></table></div>`;
  return `<section id="commitments"><h2>Reserved capacity</h2><div class="panel">
    <p id="shared-unused">Shared unused commitment (contracts scoped to no project): <b>${shared || "none"}</b></p>
    ${table}</div></section>`;
}

function adjustmentsPanel(report) {
  const rows = report.adjustments.map((a) => `<tr><th scope="row">${a.project === null ? '<span class="pill">shared</span>' : escapeHtml(a.project)}</th>
    <td>${escapeHtml(a.belongs_to)}</td><td class="num"><b>${money(a.total, a.currency)}</b></td>
    <td class="num">${money(a.failed, a.currency)}</td><td class="num">${money(a.unused_commitment, a.currency)}</td></tr>`).join("");
  return `<section id="adjustments"><h2>Prior-period adjustments</h2><div class="panel">${report.adjustments.length === 0
    ? '<span class="muted">No change to a closed month was booked into this one.</span>'
    : `<div class="scroll"><table><caption class="sr-only">Changes to closed months booked into this month</caption>
      <thead><tr><th scope="col">Project</th><th scope="col">Belongs to</th><th scope="col" class="num">Amount</th>
        <th scope="col" class="num">of it failed runs</th><th scope="col" class="num">of it unused commitment</th></tr></thead>
      <tbody id="adjustment-rows">${rows}</tbody></table></div>`}</div></section>`;
}

function closeControls(report) {
  if (report.closed) {
    return `<span class="pill closed" id="month-state">Closed${report.closed_at ? ` ${when(report.closed_at)} UTC` : ""}</span>`;
  }
  const ended = report.ends_at && Date.parse(report.as_of) >= Date.parse(report.ends_at);
  const status = `<span class="pill open" id="month-state">Open · as of ${when(report.as_of)} UTC</span>`;
  if (!mayReadReports()) return status;
  const why = ended ? "" : `<span class="small muted" id="close-why">Can be closed once it has ended${report.ends_at ? ` (${when(report.ends_at)} UTC)` : ""}</span>`;
  return `${status}<button type="button" class="danger" id="close-month"${ended ? "" : ' disabled aria-describedby="close-why"'}>Close month…</button>${why}`;
}

function closeDialog(month) {
  return `<dialog id="close-dialog" aria-labelledby="close-title" aria-describedby="close-text">
    <h2 id="close-title">Close ${escapeHtml(monthName(month))}?</h2>
    <p id="close-text">Its report is frozen as it stands and never changes again. Records and re-rating that
      touch it later are booked into the next open month as prior-period adjustments. This cannot be undone.</p>
    <div class="error" id="close-error" role="alert" hidden></div>
    <div class="buttons"><button type="button" id="close-cancel" autofocus>Cancel</button>
      <button type="button" class="danger" id="close-confirm">Close ${escapeHtml(month)}</button></div></dialog>`;
}

async function renderFinance(view, generation) {
  const { month } = view;
  destroyCharts();
  state.shown = null;
  if (!mayReadReports()) {
    $("main").innerHTML = `<div class="panel" role="alert"><h2>Finance needs a finance or admin token</h2>
      <p>This ${escapeHtml(ROLE_LABELS[state.role] || "")} token reads its own projects only.</p></div>`;
    document.body.dataset.loaded = "true";
    return;
  }
  $("main").innerHTML = `<p class="muted" role="status">Loading the report of ${escapeHtml(month)}…</p>`;
  $("main").setAttribute("aria-busy", "true");
  try {
    const [report, alertList, reconciliation] = await Promise.all([
      api(`/v1/reports/monthly/${month}`),
      api(`/v1/alerts?month=${month}&limit=1000`).catch(() => ({ items: [] })),
      api(`/v1/reports/monthly/${month}/reconciliation`).catch((error) => ({ providers: [], error: error.message })),
    ]);
    if (generation !== state.generation) return;
    const alertsByProject = new Map();
    for (const a of alertList.items) {
      if (!alertsByProject.has(a.project)) alertsByProject.set(a.project, []);
      alertsByProject.get(a.project).push(a);
    }
    const actions = `<div class="actions">
      <button type="button" id="download-csv">Download CSV</button>
      <button type="button" id="download-focus">Download FOCUS</button></div>`;
    const notice = state.notice ? `<div class="notice" role="status">${escapeHtml(state.notice)}</div>` : "";
    state.notice = null;
    const rows = report.projects.map((line) => projectRow(view, line, alertsByProject)).join("");
    $("main").innerHTML = notice + pageHead(`${escapeHtml(monthName(month))} <span class="muted">· all projects</span>`, closeControls(report) + actions)
      + `<div class="error" id="finance-error" role="alert" hidden></div>`
      + `<section id="projects-report"><h2>Projects</h2><div class="panel"><div class="scroll"><table class="finance">
        <caption class="sr-only">Every project's spend, budget burn, waste, cost per completed task and alerts this month</caption>
        <thead><tr><th scope="col">Project</th><th scope="col" class="num">Spend</th><th scope="col" class="num">Budget</th>
          <th scope="col" title="Spend ÷ budget; ticks mark the alert thresholds, the dashed mark the forecast">Burn</th>
          <th scope="col" class="num">Waste</th><th scope="col" class="num">Cost per completed task</th><th scope="col">Alerts</th></tr></thead>
        <tbody id="finance-rows">${rows || `<tr><td colspan="7" class="muted">No project yet.</td></tr>`}</tbody></table></div></div></section>`
      + totalsTable(report) + commitmentsPanel(report) + poolsPanel(report) + reconciliationPanel(reconciliation)
      + adjustmentsPanel(report)
      + (mayReadReports() && !report.closed ? closeDialog(month) : "");
    pageLoaded(`Finance ${month} · taskledger`);
  } catch (error) {
    pageFailed(error, generation);
  }
}

// A page has been put in place: its title is set and tests may read it.
function pageLoaded(title) {
  document.title = title;
  $("main").removeAttribute("aria-busy");
  document.body.dataset.loaded = "true";
}

// A page could not be read: the error takes its place, unless another page was asked for.
function pageFailed(error, generation) {
  if (generation !== state.generation) return;
  $("main").removeAttribute("aria-busy");
  $("main").innerHTML = `<div class="error" role="alert">${escapeHtml(error.message)}</div>`;
  document.body.dataset.loaded = "true";
}

function financeError(message) {
  const box = $("finance-error");
  box.textContent = message;
  box.hidden = false;
}

async function closeMonth() {
  const { month } = state.view;
  const button = $("close-confirm");
  button.disabled = true;
  button.textContent = "Closing…";
  try {
    await api(`/v1/reports/monthly/${month}/close`, { method: "POST" });
    $("close-dialog").close();
    state.notice = `${monthName(month)} is closed: its report is frozen.`;
    announce(state.notice);
    route();
  } catch (error) {
    $("close-error").textContent = error.message;
    $("close-error").hidden = false;
    button.disabled = false;
    button.textContent = `Close ${month}`;
  }
}


// ---- Fleet: every pool's paid GPU-hours, used, idle and down, and the nodes idle now -------

const CAPACITY_PARTS = [
  ["used", "Used by jobs", "--productive"],
  ["idle", "Idle", "--capacity-idle"],
  ["down", "Down", "--capacity-down"],
];

function gpuHoursText(text) {
  return `${roundDecimal(text, 1)} GPU-h`;
}

// The pool's days as stacked columns: used, idle and down GPU-hours, scaled to the day that
// paid the most. Each column has its figures as a title and the table below says the same.
function poolDays(pool, month) {
  const days = pool.days || [];
  if (days.length === 0) return `<p class="muted">No capacity known in this month.</p>`;
  const byDay = new Map(days.map((d) => [d.day, d]));
  const tallest = Math.max(...days.map((d) => Number(d.paid_gpu_hours)), 1);
  const columns = daysOf(month).map((day) => {
    const d = byDay.get(day);
    if (!d) return `<div class="day-column empty" title="${escapeHtml(day)}: no capacity known"></div>`;
    const parts = CAPACITY_PARTS.map(([key, label, colour]) => {
      const hours = Number(d[`${key}_gpu_hours`]);
      return `<div style="height:${hours / tallest * 100}%;background:var(${colour})" title="${label} ${roundDecimal(d[`${key}_gpu_hours`], 1)} GPU-h"></div>`;
    }).reverse().join("");
    return `<div class="day-column" title="${escapeHtml(day)}: ${gpuHoursText(d.paid_gpu_hours)} paid">${parts}</div>`;
  }).join("");
  const all = daysOf(month);
  const axis = `<div class="day-axis" aria-hidden="true"><span>${escapeHtml(all[0])}</span><span>${escapeHtml(all[all.length - 1])}</span></div>`;
  const rows = days.map((d) => `<tr><th scope="row">${escapeHtml(d.day)}</th>
    <td class="num">${roundDecimal(d.paid_gpu_hours, 1)}</td><td class="num">${roundDecimal(d.used_gpu_hours, 1)}</td>
    <td class="num">${roundDecimal(d.idle_gpu_hours, 1)}</td><td class="num">${roundDecimal(d.down_gpu_hours, 1)}</td></tr>`).join("");
  const idleShare = pool.idle.share === null ? "—" : `${(Number(pool.idle.share) * 100).toFixed(1)}%`;
  return `<div class="day-columns" role="img" aria-label="${escapeHtml(`${pool.pool}: ${gpuHoursText(pool.paid.gpu_hours)} paid over ${days.length} days, ${idleShare} of it idle`)}">${columns}</div>
    ${axis}<div class="legend">${CAPACITY_PARTS.map(([, label, colour]) => `<span style="--c:var(${colour})">${label}</span>`).join("")}</div>
    <details class="figures"><summary>Each day as a table (GPU-hours)</summary><div class="scroll"><table>
      <caption class="sr-only">Paid, used, idle and down GPU-hours of each day</caption>
      <thead><tr><th scope="col">Day</th><th scope="col" class="num">Paid</th><th scope="col" class="num">Used</th>
        <th scope="col" class="num">Idle</th><th scope="col" class="num">Down</th></tr></thead>
      <tbody>${rows}</tbody></table></div></details>`;
}

function idlestNodes(pool) {
  const nodes = (pool.nodes || []).slice().sort((a, b) => Number(b.idle.gpu_hours) - Number(a.idle.gpu_hours)).slice(0, 10);
  if (nodes.length === 0) return "";
  const c = pool.currency;
  const rows = nodes.map((n) => `<tr><th scope="row"><code>${escapeHtml(n.node)}</code></th>
    <td>${escapeHtml(n.gpus)} × ${escapeHtml(n.gpu_model)}</td>
    <td class="num">${roundDecimal(n.paid.gpu_hours, 1)}</td>
    <td class="num">${roundDecimal(n.idle.gpu_hours, 1)}</td>
    <td class="num">${n.idle.share === null ? "—" : `${(Number(n.idle.share) * 100).toFixed(1)}%`}</td>
    <td class="num">${c ? money(n.idle.cost, c) : "—"}</td></tr>`).join("");
  return `<h3>Nodes idle longest</h3><div class="scroll"><table class="idlest">
    <caption class="sr-only">The pool's nodes with the most idle GPU-hours this month</caption>
    <thead><tr><th scope="col">Node</th><th scope="col">GPUs</th><th scope="col" class="num">Paid GPU-h</th>
      <th scope="col" class="num">Idle GPU-h</th><th scope="col" class="num">Idle</th><th scope="col" class="num">Idle cost</th></tr></thead>
    <tbody>${rows}</tbody></table></div>`;
}

function poolPanel(info, pool, month) {
  const c = pool.currency;
  const cost = (part) => (c ? money(pool[part].cost, c) : "unpriced");
  const shareText = (part) => (pool[part].share === null ? "" : ` · ${(Number(pool[part].share) * 100).toFixed(1)}%`);
  const rule = { owner: "idle and down time charged to its owner", by_usage: "idle and down time split by usage", pool: "idle and down time kept on the pool's line" }[info.share_idle];
  const charged = pool.charged_to.map((t) => `${escapeHtml(t.project)} ${money(t.capacity_idle, c)} idle, ${money(t.capacity_down, c)} down`).join("; ");
  const kept = Number(pool.kept_on_pool.capacity_idle) + Number(pool.kept_on_pool.capacity_down) > 0
    ? ` Kept on the pool's line: ${money(pool.kept_on_pool.capacity_idle, c)} idle, ${money(pool.kept_on_pool.capacity_down, c)} down.` : "";
  const warnings = [
    Number(pool.overbooked.gpu_hours) > 0 ? `${gpuHoursText(pool.overbooked.gpu_hours)} of jobs beyond the nodes' up time (overbooked: check the capacity posted)` : "",
    Number(pool.unmatched_gpu_hours) > 0 ? `${gpuHoursText(pool.unmatched_gpu_hours)} of jobs on these nodes in hours no capacity covers` : "",
    Number(pool.unpriced_gpu_hours) > 0 ? `${gpuHoursText(pool.unpriced_gpu_hours)} paid that no contract prices` : "",
  ].filter(Boolean).map((w) => `<li>${escapeHtml(w)}</li>`).join("");
  return `<section class="pool" data-pool="${escapeHtml(info.id)}"><h2>${escapeHtml(info.name)} <span class="muted small">${escapeHtml(info.id)}${info.owner_project ? ` · owned by ${escapeHtml(info.owner_project)}` : ""} · ${escapeHtml(rule)}</span></h2>
    <div class="panel">
    <div class="cards">
      <div class="card"><div class="label">Paid</div><div class="value">${cost("paid")}</div><div class="sub">${gpuHoursText(pool.paid.gpu_hours)}</div></div>
      <div class="card"><div class="label">Used by jobs</div><div class="value">${cost("used")}</div><div class="sub">${gpuHoursText(pool.used.gpu_hours)}${shareText("used")}</div></div>
      <div class="card"><div class="label">Idle</div><div class="value">${cost("idle")}</div><div class="sub">${gpuHoursText(pool.idle.gpu_hours)}${shareText("idle")}</div></div>
      <div class="card"><div class="label">Down</div><div class="value">${cost("down")}</div><div class="sub">${gpuHoursText(pool.down.gpu_hours)}${shareText("down")}</div></div>
    </div>
    ${poolDays(pool, month)}
    <p class="small">${charged ? `Charged: ${charged}.` : "No project is charged with this pool's idle or down time."}${kept}</p>
    ${warnings ? `<ul class="warnings">${warnings}</ul>` : ""}
    ${idlestNodes(pool)}
    </div></section>`;
}

const ZOMBIES_SHOWN = 15;

function zombiesPanel(zombies) {
  const more = zombies.length > ZOMBIES_SHOWN
    ? `<p class="small muted">The ${ZOMBIES_SHOWN} idle longest of ${zombies.length}; <code>GET /v1/capacity/zombies</code> lists them all.</p>` : "";
  const rows = zombies.slice(0, ZOMBIES_SHOWN).map((z) => `<tr><th scope="row"><code>${escapeHtml(z.node)}</code></th><td>${escapeHtml(z.pool)}</td>
    <td>${escapeHtml(z.gpus)} × ${escapeHtml(z.gpu_model)}</td><td>${when(z.since)} UTC</td>
    <td class="num">${roundDecimal(z.idle_hours, 1)} h</td>
    <td class="num">${z.cost_per_hour === null ? "—" : money(z.cost_per_hour, z.currency)}</td>
    <td class="num">${z.cost_so_far === null ? "—" : money(z.cost_so_far, z.currency)}</td></tr>`).join("");
  return `<section id="zombies"><h2>Idle right now</h2><div class="panel">${zombies.length === 0
    ? `<p class="muted">No node is up and idle past its pool's limit right now.</p>`
    : `<div class="scroll"><table><caption class="sr-only">Nodes up with no job on them for longer than their pool allows</caption>
      <thead><tr><th scope="col">Node</th><th scope="col">Pool</th><th scope="col">GPUs</th><th scope="col">Idle since</th>
        <th scope="col" class="num">Idle for</th><th scope="col" class="num">Cost per hour</th><th scope="col" class="num">Cost so far</th></tr></thead>
      <tbody id="zombie-rows">${rows}</tbody></table></div>${more}`}</div></section>`;
}

async function renderFleet(view, generation) {
  const { month } = view;
  destroyCharts();
  state.shown = null;
  if (!mayReadReports()) {
    $("main").innerHTML = `<div class="panel" role="alert"><h2>The fleet needs a finance or admin token</h2></div>`;
    document.body.dataset.loaded = "true";
    return;
  }
  $("main").innerHTML = `<p class="muted" role="status">Loading the fleet of ${escapeHtml(month)}…</p>`;
  $("main").setAttribute("aria-busy", "true");
  try {
    const [pools, zombies, prices] = await Promise.all([api("/v1/pools"), api("/v1/capacity/zombies"), api("/v1/prices")]);
    const months = await Promise.all(pools.map((p) => api(`/v1/pools/${encodeURIComponent(p.id)}/utilisation?month=${month}`)));
    if (generation !== state.generation) return;
    const panels = pools.map((p, i) => poolPanel(p, months[i], month)).join("");
    $("main").innerHTML = pageHead(`${escapeHtml(monthName(month))} <span class="muted">· fleet</span>`)
      + zombiesPanel(zombies) + idleMinutePanel(prices, null)
      + (panels || `<div class="panel muted">No pool yet: create one with <code>PUT /v1/pools/{id}</code> and post its nodes' capacity.</div>`);
    pageLoaded(`Fleet ${month} · taskledger`);
  } catch (error) {
    pageFailed(error, generation);
  }
}

function poolsPanel(report) {
  const pools = report.pools || [];
  if (pools.length === 0) return "";
  const rows = pools.map((p) => {
    const c = p.currency;
    const kept = Number(p.kept_on_pool.capacity_idle) + Number(p.kept_on_pool.capacity_down);
    const charged = p.charged_to.map((t) => escapeHtml(t.project)).join(", ");
    return `<tr><th scope="row">${escapeHtml(p.pool)}</th><td class="num">${roundDecimal(p.paid.gpu_hours, 1)}</td>
      <td class="num">${p.used.share === null ? "—" : `${(Number(p.used.share) * 100).toFixed(1)}%`}</td>
      <td class="num">${c ? money(p.idle.cost, c) : "—"}</td><td class="num">${c ? money(p.down.cost, c) : "—"}</td>
      <td>${charged || (kept > 0 ? '<span class="pill">pool line</span>' : "—")}</td></tr>`;
  }).join("");
  return `<section id="pools"><h2>Capacity pools</h2><div class="panel"><div class="scroll"><table>
    <caption class="sr-only">Each pool's paid GPU-hours, the share used by jobs, and its idle and down cost</caption>
    <thead><tr><th scope="col">Pool</th><th scope="col" class="num">Paid GPU-h</th><th scope="col" class="num">Used</th>
      <th scope="col" class="num">Idle cost</th><th scope="col" class="num">Down cost</th><th scope="col">Charged to</th></tr></thead>
    <tbody id="pool-rows">${rows}</tbody></table></div></div></section>`;
}

function plural(count, noun) {
  return `${count} ${noun}${count === 1 ? "" : "s"}`;
}

// The month's cloud bills set against capacity: per provider and currency, what was billed,
// the part that priced nodes (used, idle, down), the rows on no node, and how far the jobs'
// contracts are from what the bill says their time cost.
function reconciliationPanel(reconciliation) {
  const providers = reconciliation.providers || [];
  if (providers.length === 0) {
    const why = reconciliation.error
      ? escapeHtml(reconciliation.error)
      : "No cloud bill of this billing period was posted (POST /v1/bills, or <code>taskledger import --format focus</code>).";
    return `<section id="reconciliation"><h2>Cloud bills</h2><div class="panel"><p class="muted">${why}</p></div></section>`;
  }
  const rows = providers.map((p) => {
    const c = p.currency;
    const variance = p.price_variance;
    const varianceNote = /^-?0(\.0*)?$/.test(variance) ? "" : variance.startsWith("-") ? "contracts below the bill" : "contracts above the bill";
    return `<tr data-provider="${escapeHtml(p.provider)}"><th scope="row">${escapeHtml(p.provider)}<div class="small muted">${p.rows} rows</div></th>
      <td class="num"><b>${money(p.billed_total, c)}</b></td>
      <td class="num">${money(p.capacity_billed, c)}<div class="small muted">${roundDecimal(p.capacity_gpu_hours, 1)} GPU-h</div></td>
      <td class="num">${money(p.used, c)}</td><td class="num">${money(p.idle, c)}</td><td class="num">${money(p.down, c)}</td>
      <td class="num">${money(p.unmatched_total, c)}<div class="small muted">${plural(p.unmatched.length, "service")}</div></td>
      <td class="num">${money(p.price_variance, c)}<div class="small muted">${varianceNote}</div></td></tr>`;
  }).join("");
  const details = providers.filter((p) => p.unmatched.length > 0).map((p) => {
    const top = p.unmatched.slice(0, 20);
    const lines = top.map((u) => `<tr><th scope="row">${escapeHtml(u.service)}</th><td>${escapeHtml(u.sku || "—")}</td>
      <td class="num">${u.rows}</td><td class="num">${money(u.cost, p.currency)}</td></tr>`).join("");
    const more = p.unmatched.length > top.length ? `<p class="small muted">and ${p.unmatched.length - top.length} more (the API lists all).</p>` : "";
    return `<details><summary>${escapeHtml(p.provider)} (${escapeHtml(p.currency)}): ${plural(p.unmatched.length, "service")} on no node</summary>
      <div class="scroll"><table><caption class="sr-only">Billed rows of ${escapeHtml(p.provider)} that priced no node, by service and SKU, costliest first</caption>
      <thead><tr><th scope="col">Service</th><th scope="col">SKU</th><th scope="col" class="num">Rows</th><th scope="col" class="num">Cost</th></tr></thead>
      <tbody>${lines}</tbody></table></div>${more}</details>`;
  }).join("");
  return `<section id="reconciliation"><h2>Cloud bills</h2><div class="panel">
    <p class="small muted">Billed = on nodes (used + idle + down) + on no node, to the last billed digit. Price variance = the jobs' cost under their contracts − their used share of the bill.</p>
    <div class="scroll"><table>
    <caption class="sr-only">Each provider's bill this billing period set against capacity</caption>
    <thead><tr><th scope="col">Provider</th><th scope="col" class="num">Billed</th><th scope="col" class="num">On nodes</th>
      <th scope="col" class="num">Used</th><th scope="col" class="num">Idle</th><th scope="col" class="num">Down</th>
      <th scope="col" class="num">On no node</th><th scope="col" class="num">Price variance</th></tr></thead>
    <tbody id="reconciliation-rows">${rows}</tbody></table></div>${details}</div></section>`;
}

// ---- Planning: how many GPUs to reserve ------------------------------------------------------

const PLAN_PRICES = [["reserved", "reserved_price", "Reserved"], ["on_demand", "on_demand_price", "On demand"], ["spot", "spot_price", "Spot"]];

function planningPath(view) {
  const params = new URLSearchParams({ gpu_model: view.model, month: view.month });
  for (const [key, name] of PLAN_PRICES) if (view.prices[key]) params.set(name, view.prices[key]);
  return `/v1/planning/reservations?${params}`;
}

// The month's report as if the model's prices were those given (each in a project's currency).
function whatIfReportPath(view) {
  const params = new URLSearchParams();
  for (const [key] of PLAN_PRICES) if (view.prices[key]) params.append("what_if", `${view.model}/${key}:${view.prices[key]}`);
  return `/v1/reports/monthly/${view.month}?${params}`;
}

// A share as a percentage, with a decimal below 10 % (a break-even of 0.4 %).
function planPct(value) {
  const percent = Number(value) * 100;
  return `${percent.toFixed(percent < 10 ? 1 : 0)}%`;
}

function planForm(view, models, plan) {
  const options = models.map((m) => `<option${m === view.model ? " selected" : ""}>${escapeHtml(m)}</option>`).join("");
  const inForce = (key) => plan && plan.prices && plan.prices[key] && plan.prices[key].contract ? plan.prices[key].price_per_gpu_hour
    : (key === "spot" && plan && plan.spot && plan.spot.price.contract ? plan.spot.price.price_per_gpu_hour : "");
  const inputs = PLAN_PRICES.map(([key, , label]) => `<label>${label} per GPU-hour
    <input name="${key}" inputmode="decimal" pattern="\\d+(\\.\\d+)?" value="${escapeHtml(view.prices[key] || "")}" placeholder="${escapeHtml(inForce(key) || "contract")}"></label>`).join("");
  return `<form id="plan-form" class="panel plan-form" aria-label="What to plan for">
    <label>GPU model <select name="model">${options}</select></label>${inputs}
    <button type="submit">Plan</button>
    ${PLAN_PRICES.some(([key]) => view.prices[key]) ? `<button type="button" id="plan-reset">Contract prices</button>` : ""}
  </form>`;
}

function planCards(plan) {
  const c = plan.currency;
  return `<div class="cards">
    <div class="card"><div class="label">Reserve</div><div class="value">${plan.recommended_gpus} GPUs</div>
      <div class="sub">${planPct(plan.utilisation_at_recommended)} of their hours in use; ${plural(plan.hours_above_recommended, "hour")} above on demand</div></div>
    <div class="card"><div class="label">Would have cost</div><div class="value">${money(plan.cost_at_recommended, c)}</div>
      <div class="sub">against ${money(plan.cost_today, c)} committing ${roundDecimal(plan.committed_gpus_today, 2)} GPUs as today</div></div>
    <div class="card"><div class="label">Saving</div><div class="value">${money(plan.saving, c)}</div>
      <div class="sub">over ${plural(plan.hours, "hour")} of ${escapeHtml(plan.gpu_model)}</div></div>
    <div class="card"><div class="label">Break-even utilisation</div><div class="value">${planPct(plan.break_even_utilisation)}</div>
      <div class="sub">reserved ${money(plan.prices.reserved.price_per_gpu_hour, c)} ÷ on demand ${money(plan.prices.on_demand.price_per_gpu_hour, c)} a GPU-hour</div></div>
  </div>`;
}

// GPUs in use hour by hour, with the recommended commitment and today's drawn across.
function planUseChart(plan) {
  const xs = plan.hourly.map((h) => Date.parse(h.hour) / 1000);
  const use = plan.hourly.map((h) => Number(h.gpu_hours));
  const recommended = xs.map(() => plan.recommended_gpus);
  const today = xs.map(() => Number(plan.committed_gpus_today));
  const summary = `${plan.gpu_model} GPUs in use each hour, at most ${roundDecimal(plan.peak_gpus, 2)}; the recommended commitment, ${plan.recommended_gpus} GPUs, drawn across`;
  pendingCharts.push({ id: "plan-use-chart", build: (element, width) => {
    const options = baseOptions(width, "GPUs");
    options.scales = { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max, plan.recommended_gpus, 1) * 1.1] } };
    options.series = [{},
      { label: "In use", stroke: cssColour("--productive"), fill: `${cssColour("--productive")}33`, width: 1, paths: uPlot.paths.stepped({ align: 1 }), points: { show: false } },
      { label: "Recommended", stroke: cssColour("--accent") || "#1f6feb", width: 2, points: { show: false } },
      { label: "Committed today", stroke: cssColour("--muted"), width: 1.5, dash: [6, 4], points: { show: false } }];
    return new uPlot(options, [xs, use, recommended, today], element);
  } });
  return `<section id="plan-use"><h2>GPUs in use, hour by hour</h2><div class="panel">
    <div class="chart" id="plan-use-chart" role="img" aria-label="${escapeHtml(summary)}"></div>
    <div class="legend"><span style="--c:var(--productive)">In use</span><span style="--c:var(--accent)">Recommended: ${plan.recommended_gpus} GPUs</span>
      <span style="--c:var(--muted)">Committed today: ${roundDecimal(plan.committed_gpus_today, 2)} GPUs</span></div>
  </div></section>`;
}

// What committing each number of GPUs would have cost over the window.
function planCurveChart(plan) {
  const c = plan.currency;
  const xs = plan.curve.map((p) => p.gpus);
  const costs = plan.curve.map((p) => Number(p.cost));
  const best = plan.curve.map((p) => (p.gpus === plan.recommended_gpus ? Number(p.cost) : null));
  const summary = `Cost of committing 0 to ${xs[xs.length - 1]} GPUs; the cheapest, ${plan.recommended_gpus} GPUs, ${money(plan.cost_at_recommended, c)}`;
  pendingCharts.push({ id: "plan-curve-chart", build: (element, width) => {
    const options = baseOptions(width, c);
    options.scales = { x: { time: false }, y: { range: (u, min, max) => [0, max * 1.05 || 1] } };
    options.axes[0].values = (u, values) => values.map((v) => (Number.isInteger(v) ? String(v) : ""));
    options.axes[0].label = "GPUs committed";
    options.axes[0].labelSize = 18;
    options.axes[0].labelFont = "12px system-ui, sans-serif";
    options.series = [{},
      { label: "Cost", stroke: cssColour("--idle"), width: 2, points: { show: xs.length <= 60, size: 4 } },
      { label: "Cheapest", stroke: cssColour("--accent") || "#1f6feb", width: 0, points: { show: true, size: 11, fill: cssColour("--accent") || "#1f6feb" } }];
    return new uPlot(options, [xs, costs, best], element);
  } });
  const rows = plan.curve.map((p) => `<tr${p.gpus === plan.recommended_gpus ? ' class="best"' : ""}><th scope="row" class="num">${p.gpus}</th><td class="num">${money(p.cost, c)}</td></tr>`).join("");
  return `<section id="plan-curve"><h2>Cost of committing N GPUs</h2><div class="panel">
    <div class="chart" id="plan-curve-chart" role="img" aria-label="${escapeHtml(summary)}"></div>
    <div class="chart-readout">${escapeHtml(summary)}</div>
    <details class="figures"><summary>The curve as a table</summary><div class="scroll"><table>
      <caption class="sr-only">Cost of the window for each number of GPUs committed</caption>
      <thead><tr><th scope="col" class="num">GPUs</th><th scope="col" class="num">Cost</th></tr></thead>
      <tbody id="plan-curve-rows">${rows}</tbody></table></div></details>
  </div></section>`;
}

function planContracts(plan) {
  const c = plan.currency;
  if (plan.contracts.length === 0) {
    return `<section id="plan-contracts"><h2>Reservations held</h2><div class="panel muted">No reservation of ${escapeHtml(plan.gpu_model)} commits GPUs in this window.</div></section>`;
  }
  const rows = plan.contracts.map((h) => `<tr${h.over_reserved ? ' class="over"' : ""}><th scope="row">${escapeHtml(h.name)}${h.project ? ` <span class="muted">· ${escapeHtml(h.project)}</span>` : ""}</th>
    <td class="num">${roundDecimal(h.committed_gpus, 2)}</td><td class="num">${planPct(h.utilisation)}</td><td class="num">${planPct(h.break_even_utilisation)}</td>
    <td>${h.over_reserved ? `<span class="pill gave_up">Over-reserved</span>` : `<span class="pill delivered">Pays off</span>`}</td>
    <td class="num">${money(h.wasted, c)}</td></tr>`).join("");
  return `<section id="plan-contracts"><h2>Reservations held</h2><div class="panel"><div class="scroll"><table>
    <caption class="sr-only">Each reservation's utilisation in the window against its break-even</caption>
    <thead><tr><th scope="col">Reservation</th><th scope="col" class="num">GPUs</th><th scope="col" class="num">Utilisation</th>
      <th scope="col" class="num">Break-even</th><th scope="col">Verdict</th><th scope="col" class="num">Unused commitment</th></tr></thead>
    <tbody id="plan-contract-rows">${rows}</tbody></table></div></div></section>`;
}

function planSpot(plan) {
  const spot = plan.spot;
  if (!spot) return `<section id="plan-spot"><h2>Spot</h2><div class="panel muted">No spot contract of ${escapeHtml(plan.gpu_model)} is in force: give a spot price to compare.</div></section>`;
  const c = plan.currency;
  const o = spot.observed;
  return `<section id="plan-spot"><h2>Spot</h2><div class="panel">
    <p>The ${roundDecimal(spot.on_demand_gpu_hours, 1)} GPU-hours run on demand would have cost <b>${money(spot.cost_at_spot, c)}</b> on spot at
      ${money(spot.price.price_per_gpu_hour, c)} a GPU-hour, against ${money(spot.cost_on_demand, c)}: ${money(spot.saving, c)} less.</p>
    <p class="muted">Observed on spot in this window, not promised: ${o.preempted_attempts} of ${plural(o.attempts, "attempt")} preempted${o.preemption_rate === null ? "" : ` (${planPct(o.preemption_rate)})`},
      ${roundDecimal(o.preempted_gpu_hours, 1)} of ${roundDecimal(o.spot_gpu_hours, 1)} spot GPU-hours lost to preemption.</p>
  </div></section>`;
}

function planWhatIf(view, actual, hypothetical) {
  if (!actual || !hypothetical) return "";
  const given = PLAN_PRICES.filter(([key]) => view.prices[key]).map(([key, , label]) => `${label.toLowerCase()} ${escapeHtml(view.prices[key])}`).join(", ");
  const currencies = [...new Set([...actual.totals, ...hypothetical.totals].map((t) => t.currency))];
  const rows = currencies.map((cur) => {
    const a = actual.totals.find((t) => t.currency === cur);
    const h = hypothetical.totals.find((t) => t.currency === cur);
    const delta = subtractDecimal(h ? h.total : "0", a ? a.total : "0");
    return `<tr><th scope="row">${escapeHtml(cur)}</th><td class="num">${money(a ? a.total : "0", cur)}</td><td class="num">${money(h ? h.total : "0", cur)}</td>
      <td class="num">${delta.startsWith("-") ? "" : "+"}${money(delta, cur)}</td></tr>`;
  }).join("");
  return `<section id="plan-what-if"><h2>The month at these prices</h2><div class="panel">
    <p class="muted">${escapeHtml(monthName(view.month))}'s report as if every ${escapeHtml(view.model)} GPU-hour were priced ${given} (in each project's currency): hypothetical, nothing is stored.</p>
    <div class="scroll"><table><caption class="sr-only">The month's totals as billed and at the prices given</caption>
    <thead><tr><th scope="col">Currency</th><th scope="col" class="num">As priced</th><th scope="col" class="num">At these prices</th><th scope="col" class="num">Difference</th></tr></thead>
    <tbody id="plan-what-if-rows">${rows || `<tr><td colspan="4" class="muted">Nothing was spent this month.</td></tr>`}</tbody></table></div>
  </div></section>`;
}

async function renderPlanning(view, generation) {
  destroyCharts();
  state.shown = null;
  if (!mayReadReports()) {
    $("main").innerHTML = `<div class="panel" role="alert"><h2>Planning needs a finance or admin token</h2></div>`;
    document.body.dataset.loaded = "true";
    return;
  }
  $("main").innerHTML = `<p class="muted" role="status">Loading the plan of ${escapeHtml(view.month)}…</p>`;
  $("main").setAttribute("aria-busy", "true");
  try {
    const contracts = await api("/v1/contracts?limit=1000");
    const models = [...new Set(contracts.items.map((c) => c.gpu_model))].sort();
    if (generation !== state.generation) return;
    if (!view.model || !models.includes(view.model)) {
      if (models.length === 0) {
        $("main").innerHTML = pageHead("Planning") + `<div class="panel muted">No contract yet: planning compares a model's reserved and on-demand prices.</div>`;
        pageLoaded(`Planning · taskledger`);
        return;
      }
      if (!view.model) return go({ ...view, model: models[0] });
      models.push(view.model);
    }
    const whatIf = PLAN_PRICES.some(([key]) => view.prices[key]);
    const [plan, actual, hypothetical] = await Promise.all([
      api(planningPath(view)).catch((error) => ({ error: error.message })),
      whatIf ? api(`/v1/reports/monthly/${view.month}`).catch(() => null) : null,
      whatIf ? api(whatIfReportPath(view)).catch(() => null) : null,
    ]);
    if (generation !== state.generation) return;
    const head = pageHead(`Planning <span class="muted">· ${escapeHtml(view.model)} · ${escapeHtml(monthName(view.month))}</span>`);
    if (plan.error) {
      $("main").innerHTML = head + planForm(view, models, null) + `<div class="error" role="alert" id="plan-error">${escapeHtml(plan.error)}</div>`;
    } else {
      $("main").innerHTML = head + planForm(view, models, plan) + planCards(plan) + planUseChart(plan) + planCurveChart(plan)
        + planContracts(plan) + planSpot(plan) + planWhatIf(view, actual, hypothetical);
      mountCharts();
    }
    pageLoaded(`Planning ${view.model} ${view.month} · taskledger`);
  } catch (error) {
    pageFailed(error, generation);
  }
}

// ---- Channels: where alerts and month closes are sent besides each project's webhook -------

const CHANNEL_KINDS = [
  ["slack", "Slack"],
  ["teams", "Microsoft Teams"],
  ["email", "Email"],
  ["pagerduty", "PagerDuty"],
  ["webhook", "Signed webhook"],
];
// What a kind's target is, and an example of one.
const CHANNEL_TARGETS = {
  slack: ["Incoming-webhook URL", "https://hooks.slack.com/services/…"],
  teams: ["Incoming-webhook URL", "https://…/workflows/…/triggers/manual/paths/invoke"],
  email: ["Email addresses (comma-separated)", "finance@example.com, ml-oncall@example.com"],
  pagerduty: ["Events API URL (optional)", "https://events.pagerduty.com/v2/enqueue"],
  webhook: ["Incoming-webhook URL", "https://hooks.example.com/taskledger"],
};
const CHANNEL_ALERT_KINDS = [
  ["actual", "Budget spent"],
  ["forecast", "Budget forecast"],
  ["idle_gpu", "Idle GPU"],
  ["zombie_capacity", "Zombie capacity"],
  ["retry_storm", "Retry storm"],
  ["efficiency_regression", "Efficiency regression"],
  ["month_closed", "Month closed"],
];
// The form's fields a problem's pointer names (`/projects/2` is the projects field).
const CHANNEL_FIELDS = ["name", "kind", "target", "routing_key", "projects", "alert_kinds"];

function labelOf(pairs, key) {
  const found = pairs.find(([k]) => k === key);
  return found ? found[1] : key;
}

function channelRow(c) {
  const projects = c.projects === null ? '<span class="muted">all</span>'
    : c.projects.map((p) => escapeHtml(p)).join(", ");
  const kinds = c.alert_kinds === null ? '<span class="muted">all</span>'
    : c.alert_kinds.map((k) => escapeHtml(labelOf(CHANNEL_ALERT_KINDS, k))).join(", ");
  const key = c.routing_key ? `<div class="small muted">Routing key <code>${escapeHtml(c.routing_key)}</code></div>` : "";
  const id = escapeHtml(c.id);
  return `<tr data-channel="${id}">
    <th scope="row" class="channel-name">${escapeHtml(c.name)}</th>
    <td data-label="Kind">${escapeHtml(labelOf(CHANNEL_KINDS, c.kind))}</td>
    <td class="target" data-label="Target"><code>${escapeHtml(c.target)}</code>${key}</td>
    <td data-label="Projects">${projects}</td>
    <td data-label="Alerts">${kinds}</td>
    <td class="nowrap" data-label="Created (UTC)">${when(c.created_at)}</td>
    <td class="channel-actions"><div class="buttons">
      <button type="button" data-channel-test="${id}">Send test</button>
      <button type="button" data-channel-deliveries="${id}" aria-expanded="false" aria-controls="deliveries-of-${id}">Recent deliveries</button>
      <button type="button" class="danger" data-channel-delete="${id}">Delete</button></div>
      <div class="test-result small" id="test-result-${id}" role="status"></div></td></tr>`;
}

function channelsTable(channels) {
  if (channels.length === 0) {
    return `<p class="muted" id="channels-empty">No channels yet: alerts go only to each project's webhook.</p>`;
  }
  return `<div class="scroll"><table class="channels">
    <caption class="sr-only">Every channel, where it sends, and which projects and alerts it receives</caption>
    <thead><tr><th scope="col">Name</th><th scope="col">Kind</th><th scope="col">Target</th><th scope="col">Projects</th>
      <th scope="col">Alerts</th><th scope="col">Created (UTC)</th><th scope="col"><span class="sr-only">Actions</span></th></tr></thead>
    <tbody id="channel-rows">${channels.map(channelRow).join("")}</tbody></table></div>`;
}

function fieldError(field) {
  return `<p class="field-error" id="channel-${field}-error" hidden></p>`;
}

function channelForm() {
  const kinds = CHANNEL_KINDS.map(([value, label]) => `<option value="${value}">${label}</option>`).join("");
  const [targetLabel, targetExample] = CHANNEL_TARGETS.slack;
  const projects = state.projects.length === 0
    ? `<p class="muted small">No project yet: the channel receives every project's alerts.</p>`
    : `<div class="checks">${state.projects.map((p) => `<label><input type="checkbox" name="projects" value="${escapeHtml(p.id)}">
        ${escapeHtml(p.name)} <span class="muted">(${escapeHtml(p.id)})</span></label>`).join("")}</div>`;
  const alertKinds = CHANNEL_ALERT_KINDS.map(([value, label]) =>
    `<label><input type="checkbox" name="alert_kinds" value="${value}"> ${label}</label>`).join("");
  return `<section id="channel-add"><h2>Add a channel</h2>
    <form id="channel-form" class="panel channel-form" novalidate aria-label="Add a channel">
      <div class="error" id="channel-form-error" role="alert" hidden></div>
      <div class="field"><label for="channel-name">Name</label>
        <input id="channel-name" name="name" autocomplete="off" placeholder="ML on-call" aria-describedby="channel-name-error">${fieldError("name")}</div>
      <div class="field"><label for="channel-kind">Kind</label>
        <select id="channel-kind" name="kind" aria-describedby="channel-kind-error">${kinds}</select>${fieldError("kind")}</div>
      <div class="field wide"><label for="channel-target" id="channel-target-label">${targetLabel}</label>
        <input id="channel-target" name="target" autocomplete="off" placeholder="${escapeHtml(targetExample)}" aria-describedby="channel-target-error">${fieldError("target")}</div>
      <div class="field" id="channel-routing-key-field" hidden><label for="channel-routing_key">Routing key</label>
        <input id="channel-routing_key" name="routing_key" autocomplete="off" placeholder="Integration key" aria-describedby="channel-routing_key-error">${fieldError("routing_key")}</div>
      <fieldset class="field wide" aria-describedby="channel-projects-error"><legend>Projects <span class="muted small">(none checked: every project)</span></legend>
        ${projects}${fieldError("projects")}</fieldset>
      <fieldset class="field wide" aria-describedby="channel-alert_kinds-error"><legend>Alerts <span class="muted small">(none checked: every kind)</span></legend>
        <div class="checks">${alertKinds}</div>${fieldError("alert_kinds")}</fieldset>
      <div class="field wide"><button class="primary" type="submit" id="channel-submit">Add channel</button></div>
    </form></section>`;
}

// The target's label, example and the routing key follow the kind chosen.
function channelKindChanged() {
  const kind = $("channel-kind").value;
  const [label, example] = CHANNEL_TARGETS[kind];
  $("channel-target-label").textContent = label;
  $("channel-target").placeholder = example;
  $("channel-routing-key-field").hidden = kind !== "pagerduty";
}

function clearChannelErrors() {
  $("channel-form-error").hidden = true;
  for (const field of CHANNEL_FIELDS) {
    const box = $(`channel-${field}-error`);
    box.hidden = true;
    box.textContent = "";
    const input = $(`channel-${field}`);
    if (input) input.removeAttribute("aria-invalid");
  }
}

// Shows each error of a 422 next to the field its pointer names; the others above the form.
function showChannelErrors(error) {
  const general = [];
  const errors = error.errors && error.errors.length ? error.errors : [{ pointer: "", message: error.message }];
  for (const e of errors) {
    const field = CHANNEL_FIELDS.find((f) => e.pointer === `/${f}` || e.pointer.startsWith(`/${f}/`));
    const box = field && $(`channel-${field}-error`);
    if (!box || (field === "routing_key" && $("channel-routing-key-field").hidden)) {
      general.push(e.pointer ? `${e.pointer}: ${e.message}` : e.message);
      continue;
    }
    box.textContent = box.textContent ? `${box.textContent}; ${e.message}` : e.message;
    box.hidden = false;
    const input = $(`channel-${field}`);
    if (input) input.setAttribute("aria-invalid", "true");
  }
  if (general.length) {
    $("channel-form-error").textContent = general.join(" ");
    $("channel-form-error").hidden = false;
  }
  const first = $("channel-form").querySelector('[aria-invalid="true"], fieldset:has(.field-error:not([hidden])) input');
  if (first) first.focus();
}

async function addChannel(form) {
  clearChannelErrors();
  const data = new FormData(form);
  const kind = String(data.get("kind"));
  const body = { name: String(data.get("name") || "").trim(), kind };
  const target = String(data.get("target") || "").trim();
  if (target) body.target = target;
  const key = String(data.get("routing_key") || "").trim();
  if (kind === "pagerduty") body.routing_key = key;
  const projects = data.getAll("projects").map(String);
  if (projects.length) body.projects = projects;
  const alertKinds = data.getAll("alert_kinds").map(String);
  if (alertKinds.length) body.alert_kinds = alertKinds;
  const button = $("channel-submit");
  button.disabled = true;
  try {
    const created = await api("/v1/channels", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    form.reset();
    channelKindChanged();
    await loadChannels(`Channel ${created.name} added.`);
  } catch (error) {
    showChannelErrors(error);
  } finally {
    button.disabled = false;
  }
}

// Reads the channels again and redraws their table; `notice` says what just changed.
async function loadChannels(notice) {
  const channels = await api("/v1/channels");
  state.channels = new Map(channels.map((c) => [c.id, c]));
  $("channels-list").innerHTML = channelsTable(channels);
  const box = $("channels-notice");
  box.textContent = notice || "";
  box.hidden = !notice;
  if (notice) announce(notice);
}

function channelsError(message) {
  $("channels-error").textContent = message;
  $("channels-error").hidden = false;
}

async function testChannel(id) {
  const result = $(`test-result-${id}`);
  const button = document.querySelector(`button[data-channel-test="${CSS.escape(id)}"]`);
  button.disabled = true;
  result.className = "test-result small";
  result.textContent = "Sending…";
  try {
    const r = await api(`/v1/channels/${encodeURIComponent(id)}/test`, { method: "POST" });
    const answered = [r.status_code, r.answer].filter((x) => x !== null && x !== undefined && x !== "").join(" ");
    const took = ` · ${r.duration_ms} ms`;
    if (r.delivered) {
      result.className = "test-result small delivered";
      result.textContent = `Delivered${answered ? ` (${answered.length > 80 ? `${answered.slice(0, 80)}…` : answered})` : ""}${took}`;
    } else {
      result.className = "test-result small gave_up";
      result.textContent = `Not delivered: ${r.error || `status ${r.status_code}`}${took}`;
    }
  } catch (error) {
    result.className = "test-result small gave_up";
    result.textContent = `Not sent: ${error.message}`;
  } finally {
    button.disabled = false;
  }
}

function deliveryRow(d) {
  const last = d.attempts.length ? d.attempts[d.attempts.length - 1] : null;
  const lastText = last === null ? (d.next_attempt_at ? `First try at ${when(d.next_attempt_at)}` : "—")
    : [last.status_code, last.error].filter((x) => x !== null && x !== undefined).join(" · ") || "—";
  const next = d.state === "pending" && d.next_attempt_at && last !== null ? `<div class="small muted">next try ${when(d.next_attempt_at)}</div>` : "";
  return `<tr><td class="nowrap" data-label="When (UTC)">${when(d.created_at)}</td><td data-label="Project">${d.project === null ? "—" : escapeHtml(d.project)}</td>
    <td data-label="State"><span class="pill ${escapeHtml(d.state)}">${escapeHtml(d.state.replace("_", " "))}</span></td>
    <td class="num" data-label="Attempts">${d.attempts.length}</td><td class="wrap" data-label="Last status or error">${escapeHtml(lastText)}${next}</td></tr>`;
}

async function toggleDeliveries(id) {
  const button = document.querySelector(`button[data-channel-deliveries="${CSS.escape(id)}"]`);
  const open = $(`deliveries-of-${id}`);
  if (open) {
    open.remove();
    button.setAttribute("aria-expanded", "false");
    return;
  }
  const row = button.closest("tr");
  const extra = document.createElement("tr");
  extra.id = `deliveries-of-${id}`;
  extra.className = "deliveries";
  extra.innerHTML = `<td colspan="7"><p class="muted small" role="status">Loading the latest deliveries…</p></td>`;
  row.after(extra);
  button.setAttribute("aria-expanded", "true");
  try {
    const deliveries = await api(`/v1/channels/${encodeURIComponent(id)}/deliveries`);
    const name = state.channels.has(id) ? state.channels.get(id).name : id;
    extra.firstElementChild.innerHTML = deliveries.length === 0
      ? `<p class="muted small">Nothing has been sent to ${escapeHtml(name)} yet (test messages are not kept).</p>`
      : `<div class="scroll"><table class="deliveries"><caption class="sr-only">The latest deliveries to ${escapeHtml(name)}</caption>
        <thead><tr><th scope="col">When (UTC)</th><th scope="col">Project</th><th scope="col">State</th>
          <th scope="col" class="num">Attempts</th><th scope="col">Last status or error</th></tr></thead>
        <tbody id="delivery-rows-${escapeHtml(id)}">${deliveries.map(deliveryRow).join("")}</tbody></table></div>`;
  } catch (error) {
    extra.firstElementChild.innerHTML = `<div class="error" role="alert">${escapeHtml(error.message)}</div>`;
  }
}

async function deleteChannel(id) {
  const channel = state.channels.get(id);
  const name = channel ? channel.name : id;
  if (!confirm(`Delete the channel “${name}”? Nothing more is sent to it, and what it still had to deliver is cancelled.`)) return;
  try {
    await api(`/v1/channels/${encodeURIComponent(id)}`, { method: "DELETE" });
    await loadChannels(`Channel ${name} deleted.`);
  } catch (error) {
    channelsError(error.message);
  }
}

async function renderChannels(view, generation) {
  destroyCharts();
  state.shown = null;
  if (!mayReadReports()) {
    $("main").innerHTML = `<div class="panel" role="alert"><h2>Channels need a finance or admin token</h2></div>`;
    document.body.dataset.loaded = "true";
    return;
  }
  $("main").innerHTML = `<p class="muted" role="status">Loading the channels…</p>`;
  $("main").setAttribute("aria-busy", "true");
  try {
    const channels = await api("/v1/channels");
    if (generation !== state.generation) return;
    state.channels = new Map(channels.map((c) => [c.id, c]));
    const masked = state.role === "admin" ? "" : " Targets are shown masked: only an admin token sees them whole.";
    $("main").innerHTML = pageHead("Channels")
      + `<p class="muted intro">Slack, Teams, email, PagerDuty and signed webhooks that alerts and month closes are sent to, besides each project's own webhook.${masked}</p>`
      + `<div class="notice" id="channels-notice" role="status" hidden></div><div class="error" id="channels-error" role="alert" hidden></div>`
      + `<section id="channels" aria-labelledby="page-title"><div class="panel" id="channels-list">${channelsTable(channels)}</div></section>`
      + channelForm();
    pageLoaded("Channels · taskledger");
  } catch (error) {
    pageFailed(error, generation);
  }
}

// ---- History: what the audit log holds of one project or contract ------------------------

// Fields every change moves, which say nothing about what was changed.
const UNTOLD_FIELDS = ["updated_at"];
const ACTIONS = { create: "Created", update: "Changed", delete: "Deleted", revoke: "Revoked", replace: "Replaced", close: "Closed", correct: "Corrected", import: "Imported" };

// Every entry of one entity, newest first.
async function auditOf(entity, id) {
  const entries = [];
  let cursor = null;
  do {
    const query = new URLSearchParams({ entity, entity_id: id, limit: "1000" });
    if (cursor) query.set("cursor", cursor);
    const page = await api(`/v1/audit?${query}`);
    entries.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor);
  return entries.reverse();
}

function fieldLabel(key) {
  return key.replace(/_/g, " ").replace(/\bgpus?\b/g, (g) => g.toUpperCase()).replace("GPU hour", "GPU-hour");
}

// `YYYY-MM-DD HH:MM:SS` in UTC: changes made within a minute of each other stay apart.
function whenExact(iso) {
  return new Date(iso).toISOString().slice(0, 19).replace("T", " ");
}

function auditValue(value) {
  if (value === null || value === undefined) return '<span class="muted">none</span>';
  if (typeof value === "object") return `<code>${escapeHtml(JSON.stringify(value))}</code>`;
  if (typeof value === "string" && /^\d{4}-\d{2}-\d{2}T[\d:.]+Z$/.test(value)) return `${when(value)} <span class="muted small">UTC</span>`;
  return escapeHtml(String(value));
}

// What an entry changed: each field whose value moved, before → after; a created entity's
// fields as it was created.
function auditChange(entry) {
  const before = entry.before || {};
  const after = entry.after || {};
  if (entry.after === null) return '<span class="muted">The whole entity, as it was, is kept in the log.</span>';
  const created = entry.before === null;
  const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])]
    .filter((k) => !UNTOLD_FIELDS.includes(k) && !["id", "created_at"].includes(k))
    .filter((k) => (created ? after[k] !== null : JSON.stringify(before[k]) !== JSON.stringify(after[k])));
  if (keys.length === 0) return '<span class="muted">No field changed.</span>';
  const items = keys.map((k) => created
    ? `<li data-field="${escapeHtml(k)}"><span class="field">${escapeHtml(fieldLabel(k))}</span> ${auditValue(after[k])}</li>`
    : `<li data-field="${escapeHtml(k)}"><span class="field">${escapeHtml(fieldLabel(k))}</span> <del>${auditValue(before[k])}</del> <span aria-hidden="true">→</span><span class="sr-only">to</span> <ins>${auditValue(after[k])}</ins></li>`);
  return `<ul class="changes">${items.join("")}</ul>`;
}

function historyPanel(entries, what) {
  const intro = `<p class="muted small">Every change to this ${what} through the service, newest first, from the audit log: who made it and what moved. Each entry is chained to the one before by its hash, so a change made behind the service's back is found by <code>GET /v1/audit/verify</code>.</p>`;
  if (entries.length === 0) return `<section id="history" aria-labelledby="history-title"><h2 id="history-title">History</h2><div class="panel">${intro}<p class="muted" id="history-empty">No change to this ${what} is recorded.</p></div></section>`;
  const rows = entries.map((e) => `<tr data-seq="${e.seq}">
      <td data-label="When" class="nowrap"><time datetime="${escapeHtml(e.at)}">${whenExact(e.at)}</time> <span class="muted small">UTC</span></td>
      <td data-label="Who">${escapeHtml(e.actor.name)}<div class="muted small">${escapeHtml(e.actor.kind)}</div></td>
      <td data-label="Action">${escapeHtml(ACTIONS[e.action] || e.action)}</td>
      <td data-label="What changed" class="wrap">${auditChange(e)}</td></tr>`).join("");
  return `<section id="history" aria-labelledby="history-title"><h2 id="history-title">History</h2><div class="panel">${intro}
    <div class="scroll"><table class="history"><caption class="sr-only">Changes to this ${what}, newest first</caption>
    <thead><tr><th scope="col">When</th><th scope="col">Who</th><th scope="col">Action</th><th scope="col">What changed</th></tr></thead>
    <tbody id="history-rows">${rows}</tbody></table></div></div></section>`;
}

// The tabs of a page with a history: `views` are [tab, label, href].
function tabs(label, views, current) {
  return `<nav class="tabs" aria-label="${escapeHtml(label)}">${views.map(([tab, text, href]) =>
    `<a href="${escapeHtml(href)}" id="tab-${tab || "main"}"${tab === current ? ' aria-current="page"' : ""}>${text}</a>`).join("")}</nav>`;
}

function projectTabs(view) {
  if (!mayReadReports()) return "";
  return tabs("Project views", [
    ["", "Overview", hashOf({ ...view, tab: "", task: null })],
    ["history", "History", hashOf({ ...view, tab: "history", task: null })],
  ], view.tab);
}

async function renderProjectHistory(view, generation) {
  const { project } = view;
  destroyCharts();
  state.shown = null;
  $("main").innerHTML = `<p class="muted" role="status">Loading the history of ${escapeHtml(project)}…</p>`;
  $("main").setAttribute("aria-busy", "true");
  try {
    const entries = await auditOf("project", project);
    if (generation !== state.generation) return;
    $("main").innerHTML = pageHead(escapeHtml(projectName(project))) + projectTabs(view) + historyPanel(entries, "project");
    pageLoaded(`${projectName(project)} history · taskledger`);
  } catch (error) {
    pageFailed(error, generation);
  }
}

// ---- Contracts: their terms and history (finance and admin) -------------------------------

function contractRow(view, c) {
  const href = hashOf({ ...view, page: "contracts", contract: c.id, tab: "" });
  return `<tr><th scope="row"><a href="${escapeHtml(href)}">${escapeHtml(c.name)}</a></th>
    <td data-label="GPU model">${escapeHtml(c.gpu_model)}</td>
    <td data-label="Billing mode">${escapeHtml(c.billing_mode.replace("_", "-"))}</td>
    <td data-label="Price" class="num">${price(c.price_per_gpu_hour)} ${escapeHtml(c.currency)}/GPU-h</td>
    <td data-label="Valid">${when(c.valid_from)} – ${c.valid_until ? when(c.valid_until) : "open"}</td>
    <td data-label="Project">${c.project ? escapeHtml(c.project) : '<span class="muted">all</span>'}</td></tr>`;
}

function contractTerms(c) {
  const terms = [
    ["GPU model", escapeHtml(c.gpu_model)],
    ["Billing mode", escapeHtml(c.billing_mode.replace("_", "-"))],
    ["Price", `${price(c.price_per_gpu_hour)} ${escapeHtml(c.currency)} per GPU-hour`],
    ["Valid", `${when(c.valid_from)} – ${c.valid_until ? when(c.valid_until) : "open-ended"} UTC`],
    ["Project", c.project ? escapeHtml(c.project) : "every project"],
    ["Provider", c.provider ? escapeHtml(c.provider) : "any"],
    ["Region", c.region ? escapeHtml(c.region) : "any"],
    ["Committed GPUs", c.committed_gpus ? escapeHtml(c.committed_gpus) : "none"],
  ];
  return `<section id="terms"><h2>Terms</h2><div class="panel"><dl class="terms">${terms.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("")}</dl></div></section>`;
}

async function renderContracts(view, generation) {
  destroyCharts();
  state.shown = null;
  if (!mayReadReports()) {
    $("main").innerHTML = `<div class="panel" role="alert"><h2>Contracts need a finance or admin token</h2></div>`;
    document.body.dataset.loaded = "true";
    return;
  }
  $("main").innerHTML = `<p class="muted" role="status">Loading the contracts…</p>`;
  $("main").setAttribute("aria-busy", "true");
  try {
    if (view.contract) {
      const id = view.contract;
      const [contract, entries] = await Promise.all([
        api(`/v1/contracts/${encodeURIComponent(id)}`),
        view.tab === "history" ? auditOf("contract", id) : null,
      ]);
      if (generation !== state.generation) return;
      const views = [
        ["", "Terms", hashOf({ ...view, tab: "" })],
        ["history", "History", hashOf({ ...view, tab: "history" })],
      ];
      const back = `<a href="${escapeHtml(hashOf({ ...view, contract: null, tab: "" }))}" class="back">← All contracts</a>`;
      $("main").innerHTML = back + pageHead(escapeHtml(contract.name))
        + tabs("Contract views", views, view.tab)
        + (view.tab === "history" ? historyPanel(entries, "contract") : contractTerms(contract));
      pageLoaded(`${contract.name}${view.tab === "history" ? " history" : ""} · taskledger`);
      return;
    }
    const page = await api("/v1/contracts?limit=1000");
    if (generation !== state.generation) return;
    const rows = page.items.map((c) => contractRow(view, c)).join("");
    $("main").innerHTML = pageHead("Contracts")
      + `<p class="muted intro">What each GPU-hour is priced at. Open a contract to see its terms and every change made to it.</p>`
      + `<section id="contracts" aria-labelledby="page-title"><div class="panel">${rows ? `<div class="scroll"><table class="contracts">
        <caption class="sr-only">Every contract</caption>
        <thead><tr><th scope="col">Name</th><th scope="col">GPU model</th><th scope="col">Billing mode</th><th scope="col" class="num">Price</th><th scope="col">Valid (UTC)</th><th scope="col">Project</th></tr></thead>
        <tbody id="contract-rows">${rows}</tbody></table></div>` : '<p class="muted" id="contracts-empty">No contract yet.</p>'}</div></section>`;
    pageLoaded("Contracts · taskledger");
  } catch (error) {
    pageFailed(error, generation);
  }
}

// ---- What is shown, read from the URL hash ---------------------------------------------------

const PAGES = ["finance", "fleet", "planning", "channels", "contracts", "project"];

// `#page=finance&month=…`, `#project=…&month=…&sort=…&order=…&status=…` or, for one task,
// `…&task=…`. Without a page or a project, finance opens on its page and others on a project.
function hashView() {
  const params = new URLSearchParams(location.hash.slice(1));
  const project = params.get("project");
  const month = params.get("month");
  const known = state.projects.some((p) => p.id === project);
  const requested = PAGES.includes(params.get("page")) ? params.get("page") : null;
  const page = requested || (project === null && mayReadReports() ? "finance" : "project");
  return {
    page: page === "project" && state.projects.length === 0 ? "finance" : page,
    project: known ? project : (state.projects[0] || { id: null }).id,
    month: /^\d{4}-\d{2}$/.test(month || "") ? month : currentMonth(),
    sort: TASK_SORTS.includes(params.get("sort")) ? params.get("sort") : "cost",
    order: params.get("order") === "asc" ? "asc" : "desc",
    status: STATUSES.includes(params.get("status")) ? params.get("status") : "",
    task: page === "project" && params.get("tab") !== "history" ? params.get("task") : null,
    contract: page === "contracts" ? params.get("contract") : null,
    tab: ["project", "contracts"].includes(page) && params.get("tab") === "history" ? "history" : "",
    model: params.get("model") || "",
    prices: Object.fromEntries(PLAN_PRICES.map(([key]) => [key, /^\d+(\.\d+)?$/.test(params.get(key) || "") ? params.get(key) : ""])),
  };
}

function hashOf(view) {
  if (view.page === "finance" || view.page === "fleet") return `#${new URLSearchParams({ page: view.page, month: view.month })}`;
  if (view.page === "channels") return "#page=channels";
  if (view.page === "contracts") {
    const params = new URLSearchParams({ page: "contracts" });
    if (view.contract) params.set("contract", view.contract);
    if (view.contract && view.tab) params.set("tab", view.tab);
    return `#${params}`;
  }
  if (view.page === "planning") {
    const params = new URLSearchParams({ page: "planning", month: view.month });
    if (view.model) params.set("model", view.model);
    for (const [key] of PLAN_PRICES) if (view.prices && view.prices[key]) params.set(key, view.prices[key]);
    return `#${params}`;
  }
  const params = new URLSearchParams({ project: view.project, month: view.month });
  if (view.sort !== "cost") params.set("sort", view.sort);
  if (view.order !== "desc") params.set("order", view.order);
  if (view.status) params.set("status", view.status);
  if (view.task !== null && view.task !== undefined) params.set("task", view.task);
  if (view.tab) params.set("tab", view.tab);
  return `#${params}`;
}

function go(view) {
  const next = hashOf(view);
  if (location.hash === next) route(); else location.hash = next;
}

function showNav(view) {
  const links = [];
  if (mayReadReports()) links.push(["finance", "Finance", hashOf({ ...view, page: "finance" })]);
  if (mayReadReports()) links.push(["fleet", "Fleet", hashOf({ ...view, page: "fleet" })]);
  if (mayReadReports()) links.push(["planning", "Planning", hashOf({ ...view, page: "planning" })]);
  if (mayReadReports()) links.push(["channels", "Channels", hashOf({ ...view, page: "channels" })]);
  if (mayReadReports()) links.push(["contracts", "Contracts", hashOf({ ...view, page: "contracts", contract: null, tab: "" })]);
  if (state.projects.length) links.push(["project", "Project", hashOf({ ...view, page: "project", task: null, tab: "" })]);
  $("nav").innerHTML = links.map(([page, label, href]) =>
    `<a href="${escapeHtml(href)}"${view.page === page ? ' aria-current="page"' : ""}>${label}</a>`).join("");
  $("project-picker").hidden = view.page !== "project" || state.projects.length === 0;
  $("month").closest("label").hidden = view.page === "channels" || view.page === "contracts" || view.tab === "history";
}

async function route() {
  const view = hashView();
  const canonical = hashOf(view);
  if (location.hash !== canonical) history.replaceState(null, "", canonical);
  const pageChanged = state.view !== null && (state.view.page !== view.page || state.view.task !== view.task
    || state.view.tab !== view.tab || state.view.contract !== view.contract);
  if (view.project) $("project").value = view.project;
  $("month").value = view.month;
  state.view = view;
  state.generation += 1;
  document.body.dataset.loaded = "false";
  showNav(view);
  if (view.page === "finance") {
    await renderFinance(view, state.generation);
  } else if (view.page === "fleet") {
    await renderFleet(view, state.generation);
  } else if (view.page === "planning") {
    await renderPlanning(view, state.generation);
  } else if (view.page === "channels") {
    await renderChannels(view, state.generation);
  } else if (view.page === "contracts") {
    await renderContracts(view, state.generation);
  } else if (view.tab === "history") {
    await renderProjectHistory(view, state.generation);
  } else if (view.task !== null) {
    destroyCharts();
    await renderTask(view, state.generation);
  } else if (state.shown === `${view.project}|${view.month}` && $("tasks")) {
    await loadTasks(view, state.generation);
    document.body.dataset.loaded = "true";
  } else {
    await renderProject(view, state.generation);
  }
  if (pageChanged && !$("main").contains(document.activeElement) && document.activeElement !== $("month") && document.activeElement !== $("project")) $("main").focus({ preventScroll: true });
}

$("project").addEventListener("change", () => go({ ...state.view, page: "project", project: $("project").value, task: null }));
$("month").addEventListener("change", () => {
  if (/^\d{4}-\d{2}$/.test($("month").value)) go({ ...state.view, month: $("month").value, task: null });
});
$("logout").addEventListener("click", () => signOut());
window.addEventListener("hashchange", () => { if (state.token && state.role && state.role !== "ingest") route(); });
document.addEventListener("click", (event) => {
  const sort = event.target.closest("button[data-sort]");
  if (sort) {
    const column = sort.dataset.sort;
    const order = state.view.sort === column && state.view.order === "desc" ? "asc" : "desc";
    state.focusSort = column;
    go({ ...state.view, sort: column, order });
  } else if (event.target.closest("#tasks-more-button")) {
    moreTasks();
  } else if (event.target.closest("#close-month")) {
    $("close-error").hidden = true;
    $("close-dialog").showModal();
  } else if (event.target.closest("#close-cancel")) {
    $("close-dialog").close();
    $("close-month").focus();
  } else if (event.target.closest("#close-confirm")) {
    closeMonth();
  } else if (event.target.closest("button[data-channel-test]")) {
    testChannel(event.target.closest("button[data-channel-test]").dataset.channelTest);
  } else if (event.target.closest("button[data-channel-deliveries]")) {
    toggleDeliveries(event.target.closest("button[data-channel-deliveries]").dataset.channelDeliveries);
  } else if (event.target.closest("button[data-channel-delete]")) {
    deleteChannel(event.target.closest("button[data-channel-delete]").dataset.channelDelete);
  } else if (event.target.closest("#plan-reset")) {
    go({ ...state.view, prices: {} });
  } else if (event.target.closest("#download-csv")) {
    download(`/v1/reports/monthly/${state.view.month}?format=csv`, `taskledger-${state.view.month}.csv`).catch((error) => financeError(error.message));
  } else if (event.target.closest("#download-focus")) {
    download(`/v1/exports/focus/${state.view.month}`, `taskledger-focus-${state.view.month}.csv`).catch((error) => financeError(error.message));
  }
});
document.addEventListener("submit", (event) => {
  if (event.target.id === "channel-form") {
    event.preventDefault();
    addChannel(event.target);
    return;
  }
  if (event.target.id !== "plan-form") return;
  event.preventDefault();
  const form = new FormData(event.target);
  const prices = Object.fromEntries(PLAN_PRICES.map(([key]) => [key, String(form.get(key) || "").trim()]));
  go({ ...state.view, model: String(form.get("model")), prices });
});
document.addEventListener("change", (event) => {
  if (event.target.id === "task-status") go({ ...state.view, status: event.target.value });
  if (event.target.id === "channel-kind") channelKindChanged();
});

const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.get("token")) {
  localStorage.setItem("taskledger.token", fragment.get("token"));
  fragment.delete("token");
  history.replaceState(null, "", `#${fragment.toString()}`);
}
const signInError = fragment.get("signin_error");
if (signInError) {
  fragment.delete("signin_error");
  history.replaceState(null, "", fragment.toString() ? `#${fragment.toString()}` : location.pathname);
}

// A session made through the identity provider wins over a stored token, which is then
// forgotten: a signed-in browser keeps no secret where scripts can read it.
async function boot() {
  const answer = await fetch("/auth/session", { credentials: "same-origin" })
    .then((response) => (response.ok ? response.json() : null))
    .catch(() => null);
  state.signInAvailable = Boolean(answer && answer.sign_in_available);
  if (answer && answer.session) {
    state.session = answer.session;
    localStorage.removeItem("taskledger.token");
    start();
    return;
  }
  state.token = localStorage.getItem("taskledger.token");
  if (state.token && !signInError) start(); else showLogin(signInError);
}
boot();
