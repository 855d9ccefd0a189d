// The live page's script (served as a file: the page's CSP runs no inline script). It reads the
// sessions fragment and the status every 2 s, follows the narration stream, keeps 15 minutes of
// fresh share and device share for the plot, and says at once when the service stops answering.
// Every failure is caught here: nothing uncaught reaches the console.
(() => {
  "use strict";
  const base = document.body.dataset.base;
  const EVERY_MS = 2000;
  const SPAN_MS = 15 * 60 * 1000;
  const PROXY_STATUS = "/v1/conductor/proxy/status";
  const form = document.getElementById("token");
  const banner = document.getElementById("banner");
  const shown = new Set();  // session/request/thought: a line the stream and the status both give shows once
  const samples = [];  // {t, fresh, device}: the plot's points, the last 15 minutes
  let lostAt = null;
  let last = null;  // the previous status' time and device milliseconds spent
  let events = null;
  let proxyHere = true;  // false once the proxy's status answered 404 (this is `shadow serve`)

  const clock = (d) => d.toISOString().slice(11, 19) + " UTC";

  function lost(why) {
    if (lostAt === null) lostAt = new Date();
    banner.textContent = "disconnected since " + clock(lostAt) + " (" + why + "); what is below is as it was then";
    banner.hidden = false;
    document.body.classList.add("stale");
  }

  function back() {
    lostAt = null;
    banner.hidden = true;
    document.body.classList.remove("stale");
  }

  async function get(path) {  // the response, or null when nothing answered
    try {
      return await fetch(path, {credentials: "same-origin", cache: "no-store"});
    } catch (e) {
      return null;
    }
  }

  function add(n) {
    const key = n.session + "/" + n.request_id + "/" + n.thought;
    if (shown.has(key)) return;
    shown.add(key);
    const li = document.createElement("li");
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = n.session + " #" + n.thought;
    li.append(who, document.createTextNode(n.text));
    document.getElementById("narration").prepend(li);
  }

  function draw() {
    const now = Date.now();
    while (samples.length && samples[0].t < now - SPAN_MS) samples.shift();
    const x = (t) => (30 + 560 * (t - (now - SPAN_MS)) / SPAN_MS).toFixed(1);
    const y = (v) => (110 - 100 * Math.max(0, Math.min(1, v))).toFixed(1);
    for (const [id, field] of [["plot-fresh", "fresh"], ["plot-device", "device"]]) {
      const points = samples.filter((s) => s[field] !== null).map((s) => x(s.t) + "," + y(s[field]));
      document.getElementById(id).setAttribute("points", points.join(" "));
    }
  }

  function sample(st) {
    const names = Object.values(st.sessions || {});
    const grid = st.slot.grid;
    const fresh = names.length ? names.filter((s) => s.backlog < grid).length / names.length : null;
    const spent = st.windows.idle.spent_ms + st.windows.ration.spent_ms + (st.narrator ? st.narrator.spent_ms : 0);
    const t = Date.now();
    const device = last && t > last.t ? Math.max(0, spent - last.spent) / (t - last.t) : null;
    last = {t, spent};
    samples.push({t, fresh, device});
    draw();
  }

  function showProxy(p) {
    const c = p.counts || {};
    const nf = Object.entries(c.not_followed || {}).map(([k, v]) => k + " " + v).join(", ") || "none";
    const body = document.getElementById("proxy-body");
    body.replaceChildren();
    for (const [label, value] of [["upstream", p.upstream], ["engine", p.engine], ["shadow", p.shadow],
                                  ["in flight", p.in_flight], ["turns", c.turns], ["retries", c.retries],
                                  ["render mismatches", c.render_mismatch], ["engine refused", c.refused],
                                  ["engine unreachable", c.unreachable], ["not followed", nf]]) {
      const span = document.createElement("span");
      const b = document.createElement("b");
      b.textContent = String(value);
      span.append(label + ": ", b);
      body.append(span);
    }
    document.getElementById("proxy").hidden = false;
  }

  async function refresh() {
    const r = await get(base + "/live");
    if (r === null) return lost("the service does not answer");
    if (r.status === 401) {
      form.hidden = false;
      return;
    }
    if (!r.ok) return lost("the service answered " + r.status);
    document.getElementById("sessions").innerHTML = await r.text();
    form.hidden = true;
    const s = await get(base + "/status");
    if (s === null || !s.ok) return lost(s === null ? "the status does not answer" : "the status answered " + s.status);
    const st = await s.json();
    (st.narrator && st.narrator.last || []).forEach(add);  // the summaries written before the stream opened
    sample(st);
    if (proxyHere) {
      const p = await get(PROXY_STATUS);
      if (p !== null && p.status === 404) proxyHere = false;
      else if (p !== null && p.ok) showProxy(await p.json());
    }
    back();
    listen();
  }

  function listen() {
    if (events !== null) return;
    events = new EventSource(base + "/narration");
    events.addEventListener("narration", (e) => {
      try {
        add(JSON.parse(e.data));
      } catch (err) {
        document.getElementById("narration-note").textContent = "a narration event could not be read";
      }
    });
    events.onerror = () => {
      document.getElementById("narration-note").textContent =
        "the narration stream is closed (narrator off, or the service stopped); retrying";
      tick();  // the status says which: a service that stopped shows the banner now, not in 2 s
    };
    events.onopen = () => { document.getElementById("narration-note").textContent = ""; };
  }

  let busy = false;
  async function tick() {
    if (busy) return;
    busy = true;
    try {
      await refresh();
    } catch (e) {
      lost(String(e && e.message || e));
    } finally {
      busy = false;
    }
  }

  tick();
  setInterval(tick, EVERY_MS);
})();
