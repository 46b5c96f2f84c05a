// mcpipe console: the little JavaScript there is. Every page works without it; with it, a page follows its
// event stream (server-sent events: the browser's EventSource, no polling) and updates what it shows. What it
// adds is built with DOM calls and textContent, never as HTML text, so nothing a caller wrote can run.
"use strict";
(function () {
  const main = document.getElementById("main");
  if (!main || !main.dataset.stream || typeof EventSource === "undefined") return;
  const kind = main.dataset.kind;
  const live = document.getElementById("live");
  const source = new EventSource(main.dataset.stream);
  source.onopen = function () { if (live) live.hidden = false; };
  source.onerror = function () { if (live) live.hidden = true; };

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function iso(t) { return new Date(t * 1000).toISOString().replace(/\.\d+Z$/, "Z"); }

  if (kind === "runs") {
    const body = document.getElementById("runs-body");
    const prefix = main.dataset.prefix;
    source.addEventListener("runs", function (ev) {
      const data = JSON.parse(ev.data);
      const sig = data.runs.map(function (r) { return r.run_id + ":" + r.status + ":" + (r.cancel_requested ? "True" : "False") + ";"; }).join("");
      if (sig === body.dataset.sig) return;  // what the page shows already
      body.dataset.sig = sig;
      const rows = [];
      for (const r of data.runs) {
        const tr = el("tr");
        const a = el("a"); a.href = prefix + "/runs/" + encodeURIComponent(r.run_id);
        a.appendChild(el("code", r.run_id.slice(0, 12)));
        const c0 = el("td"); c0.appendChild(a); tr.appendChild(c0);
        tr.appendChild(el("td", r.target));
        const st = el("td"); st.appendChild(el("span", r.status, "status status-" + r.status)); tr.appendChild(st);
        tr.appendChild(r.principal === null ? (function () { const t = el("td"); t.appendChild(el("span", "anonymous", "muted")); return t; })() : el("td", r.principal));
        tr.appendChild(el("td", r.created));
        tr.appendChild(el("td", r.duration_s === null ? "" : (r.duration_s < 1 ? (r.duration_s * 1000).toFixed(1) + " ms" : r.duration_s.toFixed(2) + " s")));
        tr.appendChild(el("td", r.attempts));
        rows.push(tr);
      }
      if (!rows.length) { const tr = el("tr", null, "empty"); const td = el("td", "No runs match."); td.colSpan = 7; tr.appendChild(td); rows.push(tr); }
      body.replaceChildren.apply(body, rows);
    });
  }

  if (kind === "run") {
    const events = document.getElementById("events");
    const status = document.getElementById("run-status");
    const graph = document.getElementById("graph");
    const each = graph ? JSON.parse(graph.dataset.each || "[]") : [];
    function keyOf(path) {
      path = path.split("/")[0].split("#")[0];
      if (!each.length) return path;
      const out = []; let below = false;
      for (const part of path.split(".")) {
        if (below && /^\d+$/.test(part)) { out.push("*"); below = false; continue; }
        out.push(part); below = each.indexOf(out.join(".")) >= 0;
      }
      return out.join(".");
    }
    function mark(path, state) {
      if (!graph || path.indexOf("/") >= 0) return;
      const key = keyOf(path);
      for (const g of graph.querySelectorAll("g.shape")) {
        if (g.getAttribute("data-key") === key) {
          const was = (g.getAttribute("class") || "").match(/state-(\w+)/);
          if (was && was[1] === "failed" && state !== "failed") continue;  // a failed element stays marked
          g.setAttribute("class", "shape state-" + state);
        }
      }
    }
    let ended = false;
    source.addEventListener("run-event", function (ev) {
      const e = JSON.parse(ev.data);
      const li = el("li");
      li.appendChild(el("time", iso(e.at))); li.appendChild(document.createTextNode(" "));
      li.appendChild(el("span", e.type, "etype"));
      if (e.path) { li.appendChild(document.createTextNode(" ")); li.appendChild(el("code", e.path)); }
      if (e.error_code) { li.appendChild(document.createTextNode(" ")); li.appendChild(el("span", e.error_code, "code")); }
      if (e.worker) { li.appendChild(document.createTextNode(" ")); li.appendChild(el("span", e.worker, "muted")); }
      events.appendChild(li);
      if (e.type === "step_started" && e.path) mark(e.path, "running");
      if (e.type === "step_finished" && e.path) mark(e.path, e.ok ? "ok" : (e.error_code === "CANCELLED" ? "cancelled" : "failed"));
      if (e.type === "leased" && status) { status.textContent = "running"; status.className = "status status-running"; }
      if (e.type === "input_required" && status) { status.textContent = "input_required"; status.className = "status status-input_required"; }
      if ((e.type === "completed" || e.type === "failed" || e.type === "cancelled") && status) {
        status.textContent = e.type; status.className = "status status-" + e.type;
      }
    });
    source.addEventListener("end", function () {
      source.close();
      if (live) live.hidden = true;
      if (!ended) { ended = true; window.location.reload(); }  // once: the server draws the finished run
    });
  }

  if (kind === "metrics") {
    const NS = "http://www.w3.org/2000/svg";
    function fmt(ms) { return ms === null ? "" : (ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : ms.toFixed(1) + " ms"); }
    source.addEventListener("metrics", function (ev) {
      const m = JSON.parse(ev.data);
      const set = function (id, v) { const e = document.getElementById(id); if (e) e.textContent = v; };
      set("m-calls_per_s", m.calls_per_s); set("m-p50_ms", fmt(m.p50_ms)); set("m-p99_ms", fmt(m.p99_ms));
      set("m-in_flight", m.in_flight); set("m-window", m.window);
      for (const k of ["queued", "running", "input_required"]) set("m-queue-" + k, m.queue[k] || 0);
      const box = document.getElementById("rate");
      if (!box || m.series.length < 2) return;
      const w = 620, h = 160, pad = 30;
      const t0 = m.series[0][0], span = Math.max(m.series[m.series.length - 1][0] - t0, 1e-6);
      const top = Math.max.apply(null, m.series.map(function (p) { return p[1]; })) || 1;
      const svg = document.createElementNS(NS, "svg");
      svg.setAttribute("viewBox", "0 0 " + w + " " + h); svg.setAttribute("width", w); svg.setAttribute("height", h);
      svg.setAttribute("class", "line"); svg.setAttribute("role", "img");
      svg.setAttribute("aria-label", "calls per second");
      const axis = document.createElementNS(NS, "line");
      axis.setAttribute("x1", pad); axis.setAttribute("y1", h - pad); axis.setAttribute("x2", w - pad); axis.setAttribute("y2", h - pad);
      axis.setAttribute("stroke", "#9aa5b1"); svg.appendChild(axis);
      const line = document.createElementNS(NS, "polyline");
      line.setAttribute("points", m.series.map(function (p) {
        return (pad + (p[0] - t0) / span * (w - 2 * pad)).toFixed(1) + "," + (h - pad - p[1] / top * (h - 2 * pad)).toFixed(1);
      }).join(" "));
      line.setAttribute("fill", "none"); line.setAttribute("stroke", "#3f6fb5"); line.setAttribute("stroke-width", "2");
      svg.appendChild(line);
      const label = document.createElementNS(NS, "text");
      label.setAttribute("x", w - pad); label.setAttribute("y", pad - 10); label.setAttribute("text-anchor", "end");
      label.textContent = "now " + m.series[m.series.length - 1][1] + "/s"; svg.appendChild(label);
      box.replaceChildren(svg);
    });
  }
})();
