// hako's page: a chat with each group's agent, and a watch page. Everything an agent or a
// person wrote is put on the page as text (textContent), never as markup: nothing in a
// message can run script or load a resource. The server's policy (CSP) forbids inline
// script and foreign resources as a second wall.
"use strict";

const $ = (id) => document.getElementById(id);
let session = null;

/// A call to routd's API with the session's cookie (and its CSRF token on a change).
async function api(method, path, body) {
  const headers = {};
  if (body !== undefined) headers["content-type"] = "application/json";
  if (method !== "GET" && session && session.csrf) headers["x-hako-csrf"] = session.csrf;
  const r = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (r.status === 401) {
    location.replace("/web/signin");
    throw new Error("signed out");
  }
  const text = await r.text();
  let v = null;
  try {
    v = text ? JSON.parse(text) : null;
  } catch (_) {
    v = null;
  }
  if (!r.ok) {
    const e = new Error((v && v.message) || "HTTP " + r.status);
    e.status = r.status;
    e.code = v && v.error;
    throw e;
  }
  return v;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function when(ms) {
  return ms ? new Date(ms).toLocaleString() : "";
}

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 120) return s + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  return Math.round(s / 3600) + " h";
}

async function start() {
  try {
    session = await api("GET", "/web/session");
  } catch (_) {
    return;
  }
  $("who").textContent = session.subject + (session.folder ? " · " + session.folder : "");
  $("signout").addEventListener("click", signOut);
  if (document.body.dataset.page === "watch") watch();
  else chat();
}

async function signOut() {
  try {
    await api("POST", "/web/signout");
  } catch (_) {
    // Signed out either way.
  }
  location.replace("/web/signin");
}

// ---- chat ----

const st = {
  chat: null,
  byId: new Map(),
  lastSeq: 0,
  nextBefore: null,
  es: null,
  timer: null,
};

async function chat() {
  let groups = [];
  try {
    groups = (await api("GET", "/v1/groups")).groups.map((g) => ({ folder: g.folder, name: g.name }));
  } catch (e) {
    if (session.folder) groups = [{ folder: session.folder, name: session.folder }];
    else $("groups-note").textContent = "Cannot list groups: " + e.message;
  }
  const list = $("groups");
  for (const g of groups) {
    const li = el("li");
    const b = el("button", "group", g.name === g.folder ? g.folder : g.name + " (" + g.folder + ")");
    b.type = "button";
    b.dataset.folder = g.folder;
    b.addEventListener("click", () => select(g.folder));
    li.append(b);
    list.append(li);
  }
  if (!groups.length && !$("groups-note").textContent) $("groups-note").textContent = "No group yet: make one with `hako groups set`.";
  $("older").addEventListener("click", older);
  $("compose").addEventListener("submit", send);
  $("text").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) {
      ev.preventDefault();
      $("compose").requestSubmit();
    }
  });
  const want = new URLSearchParams(location.hash.slice(1)).get("chat");
  const pick = groups.find((g) => "web:" + g.folder === want) || (groups.length === 1 ? groups[0] : null);
  if (pick) select(pick.folder);
}

function chatPath(suffix) {
  return "/v1/chats/" + encodeURIComponent(st.chat) + suffix;
}

async function select(folder) {
  if (st.es) st.es.close();
  if (st.timer) clearInterval(st.timer);
  st.chat = "web:" + folder;
  st.byId = new Map();
  st.lastSeq = 0;
  $("messages").replaceChildren();
  $("approvals").replaceChildren();
  $("turn").hidden = true;
  history.replaceState(null, "", "#chat=" + encodeURIComponent(st.chat));
  for (const b of document.querySelectorAll("button.group")) b.classList.toggle("current", b.dataset.folder === folder);
  $("chat-title").textContent = st.chat;
  $("compose").hidden = false;
  const page = await api("GET", chatPath("/messages?limit=100"));
  for (const m of page.messages) show(m);
  st.nextBefore = page.next_before;
  $("older").hidden = st.nextBefore == null;
  openStream();
  refreshTurn();
  st.timer = setInterval(refreshTurn, 1500);
  $("text").focus();
}

async function older() {
  if (st.nextBefore == null) return;
  const page = await api("GET", chatPath("/messages?limit=100&before=" + st.nextBefore));
  for (const m of page.messages) show(m);
  st.nextBefore = page.next_before;
  $("older").hidden = st.nextBefore == null;
}

/// Puts a message in its place by seq; a newer version of a message (a status note edited
/// in place) replaces the older one, and a message seen twice is shown once.
function show(m) {
  if (m.chat_jid !== st.chat) return;
  const prev = st.byId.get(m.id);
  if (prev) {
    if (prev.version >= (m.version || 0)) return;
    prev.node.remove();
  }
  const li = el("li", "msg " + m.direction + " " + m.kind);
  li.dataset.seq = m.seq;
  li.dataset.id = m.id;
  const who = m.direction === "in" ? m.sender_name || m.sender : "agent";
  const tags = [who, when(m.timestamp)];
  if (m.kind !== "message") tags.push(m.kind);
  if (m.version) tags.push("edited");
  if (m.direction === "in" && m.state === "failed") tags.push("not answered");
  li.append(el("div", "meta", tags.join(" · ")), el("div", "text", m.content));
  const list = $("messages");
  let before = null;
  for (const n of list.children) {
    if (Number(n.dataset.seq) > m.seq) {
      before = n;
      break;
    }
  }
  list.insertBefore(li, before);
  st.byId.set(m.id, { version: m.version || 0, node: li });
  if (m.seq > st.lastSeq) st.lastSeq = m.seq;
  if (!before) li.scrollIntoView({ block: "end" });
  if (m.kind === "approval") refreshTurn();
}

function openStream() {
  const chat = st.chat;
  const es = new EventSource(chatPath("/events?after=" + st.lastSeq));
  st.es = es;
  const state = $("stream-state");
  es.addEventListener("message", (ev) => {
    try {
      show(JSON.parse(ev.data));
    } catch (_) {
      // A line that is not a message is not shown.
    }
  });
  es.onopen = () => {
    state.textContent = "live";
    state.className = "hint live";
  };
  es.onerror = () => {
    if (st.es !== es || st.chat !== chat) return;
    state.className = "hint";
    if (es.readyState === EventSource.CLOSED) {
      // Refused (a session that ended, a full server): look at the session, then open anew
      // from the last message shown.
      state.textContent = "disconnected; retrying";
      setTimeout(async () => {
        if (st.es !== es) return;
        try {
          await api("GET", "/web/session");
          openStream();
        } catch (_) {
          // api() sends an ended session to sign in.
        }
      }, 2000);
    } else {
      state.textContent = "reconnecting…";
    }
  };
}

async function send(ev) {
  ev.preventDefault();
  const text = $("text");
  const content = text.value;
  if (!content.trim()) return;
  const err = $("compose-error");
  err.hidden = true;
  $("send").disabled = true;
  try {
    await api("POST", "/v1/messages", { chat_jid: st.chat, sender: session.subject, content });
    text.value = "";
  } catch (e) {
    err.textContent = "Not sent: " + e.message;
    err.hidden = false;
  } finally {
    $("send").disabled = false;
    text.focus();
  }
}

const LIVE = { starting: "starting", running: "running", waiting: "waiting for a retry" };

async function refreshTurn() {
  const chat = st.chat;
  const folder = chat.slice(4);
  try {
    const turns = (await api("GET", "/v1/turns?limit=20&folder=" + encodeURIComponent(folder))).turns;
    if (st.chat !== chat) return;
    const t = turns.find((t) => t.chat_jid === chat);
    const box = $("turn");
    if (!t) {
      box.hidden = true;
    } else {
      box.hidden = false;
      box.className = "turn " + t.state;
      const parts = ["turn " + t.turn_id, LIVE[t.state] || t.state];
      if (t.attempt > 1) parts.push("try " + t.attempt);
      if (t.error) parts.push(t.error);
      box.textContent = parts.join(" · ");
    }
  } catch (_) {
    // The next poll tries again.
  }
  try {
    const approvals = (await api("GET", "/v1/approvals?limit=100")).approvals;
    if (st.chat !== chat) return;
    renderApprovals(approvals.filter((a) => a.chat_jid === chat && a.state === "pending"));
  } catch (_) {
    // No approvals scope, or routd is away: nothing to show.
  }
}

function renderApprovals(pending) {
  const box = $("approvals");
  const keep = new Set(pending.map((a) => a.id));
  // A card this page decided stays a while with its verdict; others go once not pending.
  for (const n of [...box.children]) if (!keep.has(n.dataset.id) && !n.dataset.decided) n.remove();
  for (const a of pending) {
    if (box.querySelector('[data-id="' + CSS.escape(a.id) + '"]')) continue;
    const card = el("div", "approval");
    card.dataset.id = a.id;
    card.append(
      el("div", "meta", "approval " + a.id + " · " + a.folder + " · expires " + when(a.expires_at)),
      el("div", "text", a.tool + (a.target ? " → " + a.target : "")),
      el("pre", "args", JSON.stringify(a.arguments, null, 2)),
    );
    const note = el("div", "hint");
    for (const [label, approve] of [["Approve", true], ["Deny", false]]) {
      const b = el("button", approve ? "approve" : "deny", label);
      b.type = "button";
      b.addEventListener("click", async () => {
        for (const x of card.querySelectorAll("button")) x.disabled = true;
        card.dataset.decided = "1";
        try {
          const v = await api("POST", "/v1/approvals/" + encodeURIComponent(a.id), { approve });
          note.textContent = v.state + " by " + (v.decided_by || "you");
        } catch (e) {
          note.textContent = e.code === "already_decided" ? "Someone else decided first: " + e.message : "Refused: " + e.message;
        }
        setTimeout(() => card.remove(), 15000);
      });
      card.append(b);
    }
    card.append(note);
    box.append(card);
  }
}

// ---- watch ----

async function watch() {
  await refreshWatch();
  setInterval(refreshWatch, 5000);
}

function rows(table, data, cells) {
  const body = $(table).tBodies[0];
  body.replaceChildren(
    ...data.map((d) => {
      const tr = el("tr");
      for (const c of cells(d)) tr.append(el("td", null, c));
      return tr;
    }),
  );
}

async function refreshWatch() {
  const err = $("watch-error");
  try {
    const o = await api("GET", "/v1/overview");
    rows("daemons", o.daemons, (d) => [d.name, d.ready ? "ready" : "NOT READY", d.error || ""]);
    for (const [i, d] of o.daemons.entries()) $("daemons").tBodies[0].rows[i].className = d.ready ? "ok" : "bad";
    if (o.runs) {
      $("runs-count").textContent = o.runs.live + " live, " + o.runs.queued + " queued";
      rows("runs", o.runs.runs, (r) => [r.run_id, r.folder, r.state, r.created_at]);
    } else {
      $("runs-count").textContent = "runed does not answer: " + (o.runs_error || "");
      rows("runs", [], () => []);
    }
    rows("backlog", o.folders, (f) => [f.folder, f.waiting, ago(f.oldest_at)]);
    err.hidden = true;
  } catch (e) {
    err.textContent = "Cannot read the overview: " + e.message;
    err.hidden = false;
  }
  try {
    const u = await api("GET", "/v1/usage?limit=1000");
    chart(u.rows);
  } catch (e) {
    $("usage").replaceChildren(el("p", "hint", "No usage to show: " + e.message));
  }
  $("updated").textContent = "Last: " + new Date().toLocaleTimeString();
}

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#3b6ea5", "#c0603a", "#4f9a62", "#8a5fb0", "#b59a2a", "#3a9aa5", "#a53a6e", "#6b6b6b"];

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = String(text);
  return e;
}

/// Tokens (input and output) per group per UTC day, the last 14 days with usage, as bars.
function chart(usage) {
  const box = $("usage");
  const sum = new Map();
  for (const r of usage) {
    const k = r.day + "\u0000" + r.folder;
    sum.set(k, (sum.get(k) || 0) + r.input_tokens + r.output_tokens);
  }
  const days = [...new Set(usage.map((r) => r.day))].sort().slice(-14);
  const folders = [...new Set(usage.map((r) => r.folder))].sort();
  if (!days.length) {
    box.replaceChildren(el("p", "hint", "No LLM calls through the gateway yet."));
    return;
  }
  const max = Math.max(1, ...[...sum.values()]);
  const W = 640, H = 200, pad = 30;
  // At least a week's slots, so one day is a bar, not a wall.
  const slot = (W - pad) / Math.max(days.length, 7);
  const bw = Math.min(28, Math.max(2, (slot - 6) / folders.length));
  const g = svg("svg", { viewBox: "0 0 " + W + " " + (H + 40), class: "chart", role: "img", "aria-label": "LLM tokens per group per day" });
  g.append(svg("text", { x: 0, y: 12, class: "axis" }, max.toLocaleString()));
  g.append(svg("line", { x1: pad, y1: H, x2: W, y2: H, class: "axis" }));
  days.forEach((day, i) => {
    const x0 = pad + i * slot + 3;
    folders.forEach((f, j) => {
      const v = sum.get(day + "\u0000" + f) || 0;
      if (!v) return;
      const h = Math.max(1, (v / max) * (H - 20));
      const bar = svg("rect", { x: x0 + j * bw, y: H - h, width: bw - 1, height: h, fill: COLORS[j % COLORS.length] });
      bar.append(svg("title", {}, f + " " + day + ": " + v.toLocaleString() + " tokens"));
      g.append(bar);
    });
    g.append(svg("text", { x: x0, y: H + 14, class: "axis" }, day.slice(5)));
  });
  const legend = el("ul", "legend");
  folders.forEach((f, j) => {
    const li = el("li");
    const sw = svg("svg", { width: 10, height: 10 });
    sw.append(svg("rect", { width: 10, height: 10, fill: COLORS[j % COLORS.length] }));
    li.append(sw, document.createTextNode(" " + f));
    legend.append(li);
  });
  box.replaceChildren(g, legend);
}

start();
