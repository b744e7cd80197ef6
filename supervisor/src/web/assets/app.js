// The Flock dashboard: one page, no build step. The swarm's state arrives by Server-Sent Events
// (`/api/events`, a new state only when something changed); a channel's messages and an agent's
// turns are fetched when the state says they changed or when picked.
"use strict";

const $ = (sel) => document.querySelector(sel);
let state = { ps: [], chains: [], channels: [], approvals: [] };
let picked = { channel: null, agent: null };
let shownSeq = 0;          // the last seq of the picked channel that is on the page
const lastRestarts = {};   // name -> restarts, to flash a row when it restarts

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("data-")) e.setAttribute(k, v); else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return e;
}

function duration(secs) {
  if (secs < 60) return secs + "s";
  if (secs < 3600) return Math.floor(secs / 60) + "m" + String(secs % 60).padStart(2, "0") + "s";
  const h = Math.floor(secs / 3600);
  return h < 48 ? h + "h" + String(Math.floor((secs % 3600) / 60)).padStart(2, "0") + "m" : Math.floor(h / 24) + "d";
}

function bytes(b) {
  if (b == null) return "-";
  if (b >= 1 << 30) return (b / (1 << 30)).toFixed(1) + "G";
  if (b >= 1 << 20) return (b / (1 << 20)).toFixed(1) + "M";
  return (b >> 10) + "K";
}

function stateClass(s) { return "state state-" + String(s).split(/[^a-z-]/)[0]; }

async function api(path, body) {
  const opts = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  const r = await fetch(path, opts);
  const data = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) throw new Error(data.error || r.statusText);
  return data;
}

// ---- processes -------------------------------------------------------------------------------

function renderPs() {
  const tbody = $("#ps tbody");
  const rows = state.ps.filter((r) => r.kind !== "chains");
  // Across hosts the first host row is this one; agents of other hosts are driven from here
  // only where the swarm file lets this host's operator (`cluster.operators`).
  const here = (rows.find((r) => r.kind === "host") || {}).name;
  const isLocal = (r) => !r.host || r.host === here;
  const drivable = (r) => isLocal(r) || state.drives_other_hosts === true;
  // Rows are updated in place (a click must not land on a row replaced under the pointer).
  // Keyed by kind and name: across hosts, a host's row and an agent may share a name.
  const existing = new Map([...tbody.children].map((tr) => [`${tr.dataset.kind}/${tr.dataset.name}`, tr]));
  const order = rows.map((r) => {
    let tr = existing.get(`${r.kind}/${r.name}`);
    if (!tr) {
      tr = el("tr", { "data-name": r.name, "data-kind": r.kind, class: r.kind === "actor" ? "dim" : "" });
      for (let i = 0; i < 14; i++) tr.append(el("td"));
      if (r.kind === "agent" && drivable(r)) {
        tr.classList.add("agent");
        if (isLocal(r)) tr.onclick = () => pickAgent(r.name);
        // Stop (or start) and restart, as `flockctl stop|start|restart` would.
        const actions = tr.children[13];
        actions.className = "actions";
        for (const act of ["stop", "start", "restart"]) {
          const b = el("button", { type: "button", class: "act", "data-act": act }, act);
          b.onclick = (ev) => { ev.stopPropagation(); agentAction(r.name, act); };
          actions.append(b);
        }
      }
    }
    tr.classList.toggle("selected", picked.agent === r.name);
    const restarted = lastRestarts[r.name] !== undefined && r.restarts > lastRestarts[r.name];
    lastRestarts[r.name] = r.restarts;
    if (restarted) {
      tr.classList.remove("flash");
      void tr.offsetWidth; // restart the animation
      tr.classList.add("flash");
    }
    const tokens = r.kind === "agent" ? `${r.tokens_in}/${r.tokens_out}` : "";
    const cells = [
      ["name", r.name], ["", r.host ? `${r.kind} on ${r.host}` : r.kind], ["", r.role],
      [stateClass(r.state) + " state-cell", r.state],
      ["num pid", r.pid ?? "-"], ["num", duration(r.uptime_secs)],
      ["num restarts", String(r.restarts)], ["num mailbox", String(r.mailbox_depth)],
      ["num", String(r.turns_total)], ["num", tokens], ["num", bytes(r.rss_bytes)],
      null, // activity: drawn by drawSpark
      ["last-exit", r.last_exit || ""],
    ];
    cells.forEach((cell, i) => {
      if (!cell) return;
      const [cls, text] = cell;
      const td = tr.children[i];
      if (td.className !== cls) td.className = cls;
      if (td.textContent !== String(text)) td.textContent = text;
    });
    tr.children[12].title = r.last_exit || "";
    // A process that runs can be stopped; one that does not, started.
    const down = /^(stopped|failed|exited)/.test(r.state);
    for (const b of tr.children[13].children) {
      if (b.dataset.act === "stop") b.hidden = down;
      if (b.dataset.act === "start") b.hidden = !down;
    }
    return tr;
  });
  order.forEach((tr, i) => { if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null); });
  while (tbody.children.length > order.length) tbody.lastChild.remove();
  const agents = rows.filter((r) => r.kind === "agent");
  const local = agents.filter(isLocal);
  const ready = agents.filter((r) => r.state === "ready" || r.state === "busy").length;
  const live = state.chains.filter((c) => c.live).length;
  $("#summary").textContent = `${ready}/${agents.length} agents up · ${live} chain(s) in flight`;
  // The send box lists the agents.
  const sel = $("#send-agent");
  const names = local.map((a) => a.name);
  if (sel.dataset.names !== names.join(",")) {
    const keep = sel.value;
    sel.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes(keep)) sel.value = keep;
    sel.dataset.names = names.join(",");
  }
}

// ---- activity: small charts from the samples the page sees ------------------------------------

const history = {};            // agent -> [{t, rss, turns, tokens}], one every SAMPLE_MS
const SAMPLE_MS = 2000;
const HISTORY_MAX = 150;       // 5 minutes
const SVG = "http://www.w3.org/2000/svg";

function sampleActivity() {
  const now = Date.now();
  for (const r of state.ps) {
    if (r.kind !== "agent") continue;
    const h = history[r.name] || (history[r.name] = []);
    h.push({ t: now, rss: r.rss_bytes || 0, turns: r.turns_total || 0, tokens: (r.tokens_in || 0) + (r.tokens_out || 0) });
    if (h.length > HISTORY_MAX) h.shift();
    drawSpark(r.name);
  }
}

// Per minute of `key` over the samples of the last `ms`.
function perMinute(h, key, ms) {
  const last = h[h.length - 1];
  const first = h.find((p) => last.t - p.t <= ms) || h[0];
  const minutes = (last.t - first.t) / 60000;
  return minutes > 0 ? Math.max(0, last[key] - first[key]) / minutes : 0;
}

function drawSpark(name) {
  const tr = [...$("#ps tbody").children].find((t) => t.dataset.kind === "agent" && t.dataset.name === name);
  const h = history[name] || [];
  if (!tr || h.length === 0) return;
  const W = 72, H = 18;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  svg.setAttribute("class", "spark");
  const x = (i) => (h.length < 2 ? W : (i * W) / (HISTORY_MAX - 1));
  // Turns in each interval, as bars.
  const steps = h.map((p, i) => (i === 0 ? 0 : Math.max(0, p.turns - h[i - 1].turns)));
  const top = Math.max(1, ...steps);
  steps.forEach((n, i) => {
    if (!n) return;
    const bar = document.createElementNS(SVG, "rect");
    const height = Math.max(2, (n / top) * (H - 2));
    bar.setAttribute("x", x(i) - 1);
    bar.setAttribute("y", H - height);
    bar.setAttribute("width", 2);
    bar.setAttribute("height", height);
    bar.setAttribute("class", "turns");
    svg.append(bar);
  });
  // Memory, as a line between its lowest and highest sample.
  const rss = h.map((p) => p.rss);
  const lo = Math.min(...rss), hi = Math.max(...rss);
  const y = (v) => (hi === lo ? H / 2 : H - 1 - ((v - lo) / (hi - lo)) * (H - 2));
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", rss.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" "));
  line.setAttribute("class", "rss");
  svg.append(line);
  const td = tr.children[11];
  td.className = "activity";
  td.replaceChildren(svg);
  const last = h[h.length - 1];
  td.title = `last ${Math.round((last.t - h[0].t) / 60000)} min: memory ${bytes(lo)}–${bytes(hi)}, ` +
    `${perMinute(h, "turns", 300000).toFixed(1)} turns/min, ${Math.round(perMinute(h, "tokens", 300000))} tokens/min`;
}

async function agentAction(name, act) {
  const status = $("#ps-status");
  status.textContent = `${act} ${name}…`;
  status.className = "muted";
  try {
    const r = await api(`/api/agents/${encodeURIComponent(name)}/${act}`, {});
    status.textContent = r.message;
  } catch (e) {
    status.textContent = `${act} ${name}: ${e.message}`;
    status.className = "error";
  }
}

// ---- approvals and dead letters --------------------------------------------------------------

let approvalsShown = "";
function renderApprovals() {
  const rows = state.approvals;
  $("#approvals-box").hidden = rows.length === 0;
  const key = JSON.stringify(rows.map((r) => [r.id, r.state]));
  if (key === approvalsShown) return; // a click must not land on a replaced button
  approvalsShown = key;
  $("#approvals tbody").replaceChildren(...rows.map((r) => {
    const decide = (approve) => {
      const b = el("button", { type: "button", class: approve ? "approve" : "deny" }, approve ? "approve" : "deny");
      b.onclick = () => decideRequest(r.id, approve);
      return b;
    };
    return el("tr", { "data-id": r.id },
      el("td", { class: "num" }, String(r.id)), el("td", {}, r.agent), el("td", {}, r.capability),
      el("td", { title: r.target }, clip(r.target, 60)), el("td", { title: r.reason }, clip(r.reason, 80)),
      el("td", { class: stateClass(r.state) }, r.state), el("td", { class: "actions" }, decide(true), decide(false)));
  }));
}

async function decideRequest(id, approve) {
  const status = $("#approval-status");
  status.textContent = `${approve ? "approving" : "denying"} #${id}…`;
  status.className = "muted";
  try {
    const r = await api(`/api/approvals/${id}`, { approve, reason: $("#approval-reason").value.trim() });
    status.textContent = typeof r.message === "string" ? r.message : `#${id} decided`;
    $("#approval-reason").value = "";
  } catch (e) {
    status.textContent = `#${id}: ${e.message}`;
    status.className = "error";
  }
}

async function loadDeadLetters() {
  try {
    const rows = await api("/api/dead-letters");
    $("#no-dead").hidden = rows.length > 0;
    $("#dead-letters tbody").replaceChildren(...rows.map((d) => el("tr", { "data-id": d.id },
      el("td", {}, d.id.slice(-8)), el("td", {}, d.sender), el("td", {}, d.target),
      el("td", { class: "num" }, String(d.attempts)), el("td", { title: d.reason }, clip(d.reason, 80)),
      el("td", { title: d.text }, clip(d.text, 80)))));
  } catch (e) {
    $("#no-dead").hidden = false;
    $("#no-dead").textContent = "cannot read: " + e.message;
  }
}

function renderChains() {
  const rows = state.chains.filter((c) => c.live);
  $("#no-chains").hidden = rows.length > 0;
  $("#chains tbody").replaceChildren(...rows.map((c) => el("tr", { "data-chain": c.chain },
    el("td", {}, c.chain), el("td", {}, c.origin), el("td", {}, c.entry),
    el("td", { class: stateClass(c.state) }, c.state),
    el("td", { class: "num" }, `${c.hops}/${c.max_hops}`),
    el("td", { class: "num" }, `${c.tokens}/${c.max_tokens}`),
    el("td", { class: "num" }, duration(Math.floor(c.age_ms / 1000))),
    el("td", { title: c.text }, c.text.length > 80 ? c.text.slice(0, 80) + "…" : c.text))));
}

// ---- channels --------------------------------------------------------------------------------

let channelsShown = "";
function renderChannels() {
  // Rebuilt only when something in it changed: a click must not land on a replaced element.
  const key = JSON.stringify([state.channels, picked.channel]);
  if (key !== channelsShown) {
    channelsShown = key;
    $("#channels").replaceChildren(...channelItems());
  }
  const cur = state.channels.find((c) => c.channel === picked.channel);
  if (cur && cur.last_seq > shownSeq) loadMessages();
}

function channelItems() {
  return state.channels.map((c) => {
    const li = el("li", { "data-channel": c.channel, class: picked.channel === c.channel ? "selected" : "" },
      el("span", {}, "#" + c.channel), el("span", { class: stateClass(c.state) }, `${c.state} · ${c.last_seq}`));
    li.onclick = () => pickChannel(c.channel);
    return li;
  });
}

async function pickChannel(id) {
  picked.channel = id;
  shownSeq = 0;
  $("#messages").replaceChildren();
  $("#post-channel").value = id;
  $("#channel-title").textContent = "#" + id;
  renderChannels();
  await loadMessages();
}

let loading = false;
async function loadMessages() {
  if (loading || !picked.channel) return;
  loading = true;
  try {
    for (;;) {
      const id = picked.channel;
      const r = await api(`/api/channels/${encodeURIComponent(id)}?after=${shownSeq}`);
      if (id !== picked.channel) break;
      $("#channel-topic").textContent = `${r.state} — ${r.topic || ""}`;
      const list = $("#messages");
      for (const m of r.messages) {
        const human = m.author.startsWith("human:");
        list.append(el("li", { "data-seq": m.seq },
          el("span", { class: "seq" }, m.seq), el("span", { class: "author" + (human ? " human" : "") }, m.author),
          ": ", m.text));
        shownSeq = Math.max(shownSeq, m.seq);
      }
      list.scrollTop = list.scrollHeight;
      if (r.more_after == null) break;
    }
  } catch (e) {
    $("#channel-topic").textContent = "cannot read: " + e.message;
  } finally {
    loading = false;
  }
  // Posts that arrived while this read ran.
  const cur = state.channels.find((c) => c.channel === picked.channel);
  if (cur && cur.last_seq > shownSeq) setTimeout(loadMessages, 50);
}

$("#post-form").onsubmit = async (ev) => {
  ev.preventDefault();
  const status = $("#post-status");
  const channel = $("#post-channel").value;
  const text = $("#post-text").value.trim();
  if (!channel) { status.textContent = "pick a channel first"; return; }
  if (!text) return;
  status.textContent = "posting…";
  try {
    const r = await api("/api/post", { channel, text, as: $("#post-as").value.trim() });
    $("#post-text").value = "";
    status.textContent = `posted as seq ${r.seq}`;
    await loadMessages();
  } catch (e) {
    status.textContent = e.message;
    status.className = "error";
  }
};

$("#post-text").onkeydown = (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("#post-button").click(); }
};

$("#send-form").onsubmit = async (ev) => {
  ev.preventDefault();
  const status = $("#send-status");
  const agent = $("#send-agent").value;
  const text = $("#send-text").value.trim();
  if (!agent || !text) return;
  status.textContent = "sending…";
  try {
    const r = await api("/api/send", { agent, text });
    $("#send-text").value = "";
    status.textContent = `accepted (chain ${r.chain}); the answer comes to #${r.dm}`;
    status.className = "muted";
    if (state.channels.some((c) => c.channel === r.dm)) pickChannel(r.dm);
  } catch (e) {
    status.textContent = e.message;
    status.className = "error";
  }
};

// ---- an agent's recent work ------------------------------------------------------------------

async function pickAgent(name) {
  picked.agent = name;
  renderPs();
  await loadAgent();
}

async function loadAgent() {
  const name = picked.agent;
  if (!name) return;
  try {
    const r = await api(`/api/agents/${encodeURIComponent(name)}`);
    if (name !== picked.agent) return;
    const msgs = (r.session && r.session.messages) || [];
    const where = r.session ? ` — session #${r.session.channel}` : "";
    $("#agent-title").textContent = `${name}: recent turns${where}`;
    $("#turns").replaceChildren(...msgs.slice(-40).map((m) => {
      const li = el("li", {}, el("span", { class: "role" }, m.role));
      if (m.role === "tool") li.append(el("span", { class: "tool" }, m.name + " → "), clip(m.content));
      else if (m.role === "assistant") {
        if (m.text) li.append(clip(m.text));
        for (const c of m.tool_calls || []) li.append(el("div", { class: "tool" }, `${c.name}(${clip(c.arguments, 200)})`));
      } else li.append(clip(m.text));
      return li;
    }));
    if (!msgs.length) {
      $("#agent-title").textContent = `${name}: recent turns (from the journal)`;
      $("#turns").replaceChildren(...(r.journal || []).map((e) => el("li", {},
        el("span", { class: "role" }, (e.action && e.action.type) || ""),
        el("span", { class: "seq" }, (e.timestamp || "").slice(11, 19)), clip(e.result && e.result.message))));
    }
    $("#agent-logs").textContent = (r.logs || []).join("\n");
  } catch (e) {
    $("#agent-title").textContent = `${name}: ${e.message}`;
  }
}

function clip(s, n = 600) { s = String(s ?? ""); return s.length > n ? s.slice(0, n) + "…" : s; }

// ---- journal ---------------------------------------------------------------------------------

async function loadJournal() {
  const q = $("#journal-q").value.trim();
  const status = $("#journal-status");
  try {
    const events = await api("/api/journal?last=100" + (q ? "&q=" + encodeURIComponent(q) : ""));
    status.textContent = `${events.length} event(s), newest first`;
    status.className = "muted";
    $("#journal tbody").replaceChildren(...events.map((e) => el("tr", {},
      el("td", {}, (e.timestamp || "").replace("T", " ").replace("Z", "")), el("td", {}, e.agent),
      el("td", {}, e.action && e.action.type), el("td", {}, clip(e.result && e.result.message, 200)))));
  } catch (e) {
    status.textContent = e.message;
    status.className = "error";
  }
}
$("#journal-form").onsubmit = (ev) => { ev.preventDefault(); loadJournal(); };

// ---- memory ----------------------------------------------------------------------------------

async function loadMemory() {
  const params = new URLSearchParams();
  for (const [key, id] of [["q", "#memory-q"], ["kind", "#memory-kind"], ["priority", "#memory-priority"]]) {
    const v = $(id).value.trim();
    if (v) params.set(key, v);
  }
  const status = $("#memory-status");
  try {
    const found = await api("/api/memory?" + params);
    const hits = found.hits || [];
    status.textContent = params.get("q") ? `${hits.length} found, best first` : `${hits.length} newest`;
    status.className = "muted";
    $("#memory tbody").replaceChildren(...hits.map((h) => el("tr", { "data-id": h.id },
      el("td", {}, `${h.date} ${h.time || ""}`.trim()), el("td", {}, h.kind),
      el("td", { class: "priority-" + h.priority }, h.priority), el("td", {}, h.tier),
      el("td", {}, h.agent || ""), el("td", { title: h.text }, clip(h.text, 200)))));
    const stats = await api("/api/memory/stats");
    const tiers = Object.entries(stats.tiers || {}).map(([t, n]) => `${t} ${n}`).join(", ");
    // The swarm embeds a backlog in the background: how far it has come.
    const meaning = !stats.by_meaning ? "; search by words only"
      : stats.embedded < stats.texts
        ? `; by meaning: ${stats.embedded} of ${stats.texts} texts embedded, the rest on the way`
        : "";
    $("#memory-tiers").textContent = `(${stats.files} files; ${tiers}${meaning})`;
  } catch (e) {
    status.textContent = e.message;
    status.className = "error";
  }
}
$("#memory-form").onsubmit = (ev) => { ev.preventDefault(); loadMemory(); };

// ---- live updates ----------------------------------------------------------------------------

let journalTimer = null;
function apply(next) {
  const before = state;
  state = next;
  state.ps = state.ps || [];
  state.chains = state.chains || [];
  state.channels = state.channels || [];
  state.approvals = Array.isArray(state.approvals) ? state.approvals : [];
  renderPs();
  renderChains();
  renderChannels();
  renderApprovals();
  // Something happened: the picked agent's turns and the journal may have moved too.
  const turns = (s) => (s.ps || []).reduce((n, r) => n + r.turns_total, 0);
  if (turns(before) !== turns(state)) {
    if (picked.agent) loadAgent();
    clearTimeout(journalTimer);
    journalTimer = setTimeout(() => { loadJournal(); loadDeadLetters(); }, 300);
  }
}

function connect() {
  const live = $("#live");
  const source = new EventSource("/api/events");
  source.addEventListener("state", (ev) => {
    live.textContent = "live";
    live.className = "live on";
    apply(JSON.parse(ev.data));
  });
  source.onerror = () => {
    live.textContent = "reconnecting…";
    live.className = "live off";
  };
}

connect();
loadJournal();
loadDeadLetters();
loadMemory();
setInterval(sampleActivity, SAMPLE_MS);
