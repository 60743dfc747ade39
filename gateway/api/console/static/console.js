// The gateway console: plain DOM and inline SVG, no framework, no build step.
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="csrf"]').content;
  const $ = (sel, root) => (root || document).querySelector(sel);
  const el = (tag, attrs, text) => {
    const ns = ["svg", "rect", "text", "title", "g"].includes(tag) ? "http://www.w3.org/2000/svg" : null;
    const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  };
  async function call(method, path, body) {
    const opts = { method, headers: { "x-console-csrf": csrf }, credentials: "same-origin" };
    if (body !== undefined) {
      opts.headers["content-type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const res = await fetch(path, opts);
    const data = await res.json();
    if (!res.ok) throw new Error((data.error && data.error.message) || res.status);
    return data;
  }
  const today = new Date().toISOString().slice(0, 10);
  $("#start").value = new Date(Date.now() - 6 * 864e5).toISOString().slice(0, 10);
  $("#end").value = today;

  // the usage answer's cost in micro-units of its currency (docs/spend.md), when the gateway prices models
  const costOf = (row) => (typeof row.cost_micros === "number" ? row.cost_micros : null);

  function chart(fig, rows, label) {
    for (const old of fig.querySelectorAll("svg,p")) old.remove();
    if (!rows.length) { fig.append(el("p", {}, "No usage in this range.")); return; }
    const max = Math.max(...rows.map((r) => r.total_tokens), 1);
    const rowH = 22, labelW = 140, barW = 260, h = rows.length * rowH + 4;
    const svg = el("svg", { width: labelW + barW + 150, height: h, role: "img" });
    rows.forEach((r, i) => {
      const y = i * rowH + 2, w = Math.max(1, Math.round((r.total_tokens / max) * barW));
      const g = el("g", { "data-label": r[label], "data-total-tokens": r.total_tokens, "data-requests": r.requests });
      g.append(el("text", { x: 0, y: y + 14 }, String(r[label])));
      const bar = el("rect", { class: "bar", x: labelW, y, width: w, height: rowH - 6 });
      bar.append(el("title", {}, `${r[label]}: ${r.total_tokens} tokens`));
      g.append(bar);
      const cost = costOf(r);
      let text = `${r.total_tokens} tokens`;
      if (cost !== null) { g.setAttribute("data-cost", cost); text += ` · ${(cost / 1e6).toFixed(4)}`; }
      g.append(el("text", { x: labelW + w + 6, y: y + 14, class: "value" }, text));
      svg.append(g);
    });
    fig.append(svg);
  }
  function sum(rows, by) {
    const out = new Map();
    for (const r of rows) {
      const k = r[by];
      const s = out.get(k) || { [by]: k, total_tokens: 0, requests: 0 };
      s.total_tokens += r.total_tokens; s.requests += r.requests;
      const c = costOf(r);
      if (c !== null) s.cost = (s.cost || 0) + c;
      out.set(k, s);
    }
    return [...out.values()].sort((a, b) => String(a[by]).localeCompare(String(b[by])));
  }
  async function usage() {
    const q = `start=${$("#start").value}&end=${$("#end").value}`;
    const [byModel, byDay] = await Promise.all([
      call("GET", `/console/api/usage?${q}&group_by=model`),
      call("GET", `/console/api/usage?${q}&group_by=day`),
    ]);
    chart($('[data-chart="tenant"]'), sum(byModel.data, "tenant"), "tenant");
    chart($('[data-chart="model"]'), sum(byModel.data, "model"), "model");
    chart($('[data-chart="day"]'), sum(byDay.data, "day"), "day");
    const t = byModel.totals;
    const cost = costOf(t);
    $("#totals").textContent = `Total: ${t.requests} requests, ${t.total_tokens} tokens` + (cost !== null ? `, cost ${(cost / 1e6).toFixed(4)}` : "");
    $("#totals").dataset.totalTokens = t.total_tokens;
  }
  function fill(tbody, rows) {
    tbody.replaceChildren(...rows.map((cells) => {
      const tr = el("tr");
      for (const c of cells) { const td = el("td"); if (c instanceof Node) td.append(c); else td.textContent = c; tr.append(td); }
      return tr;
    }));
  }
  async function overview() {
    const o = await call("GET", "/console/api/overview");
    fill($("#budgets tbody"), o.budgets.map((b) => [
      b.key ? `${b.tenant} (key ${b.key})` : b.tenant,
      b.budget.amount !== undefined ? String(b.budget.amount) : `${b.budget.tokens} tokens`,
      typeof b.budget.period === "string" ? b.budget.period : JSON.stringify(b.budget.period),
      (b.use || []).map((u) => (u.unit === "micros" ? `${(u.used / 1e6).toFixed(2)} of ${(u.limit / 1e6).toFixed(2)}` : `${u.used} of ${u.limit} tokens`)).join(", "),
    ]));
    fill($("#live tbody"), o.live.map((r) => [r.tenant, String(r.websocket_connections), String(r.inflight_responses)]));
    $("#config pre").textContent = JSON.stringify(o.config, null, 2);
  }
  async function keys() {
    const list = await call("GET", "/admin/keys");
    fill($("#keys tbody"), list.data.map((k) => {
      const actions = el("span");
      const rotate = el("button", { type: "button", "data-rotate": k.id }, "Rotate");
      rotate.onclick = async () => { showSecret((await call("POST", `/admin/keys/${k.id}/rotate`, {})).secret); keys(); };
      const revoke = el("button", { type: "button", "data-revoke": k.id }, "Revoke");
      revoke.onclick = async () => { await call("DELETE", `/admin/keys/${k.id}`); keys(); };
      actions.append(rotate, revoke);
      return [k.id, k.tenant, k.name || "", k.models ? k.models.join(", ") : "all",
        k.expires_at ? new Date(k.expires_at * 1000).toISOString() : "never", actions];
    }));
  }
  function showSecret(secret) {
    $("#secret-value").textContent = secret;
    $("#secret").hidden = false;
  }
  $("#secret-done").onclick = () => { $("#secret-value").textContent = ""; $("#secret").hidden = true; };
  $("#create").onsubmit = async (ev) => {
    ev.preventDefault();
    const body = { tenant: $("#k-tenant").value.trim() };
    if ($("#k-name").value.trim()) body.name = $("#k-name").value.trim();
    if ($("#k-models").value.trim()) body.models = $("#k-models").value.split(",").map((s) => s.trim()).filter(Boolean);
    if ($("#k-expires").value) body.expires_in = Number($("#k-expires").value);
    try { showSecret((await call("POST", "/admin/keys", body)).secret); await keys(); }
    catch (err) { alert(err.message); }
  };
  $("#range").onsubmit = (ev) => { ev.preventDefault(); usage(); };
  $("#logout").onclick = async () => { await call("POST", "/console/logout"); location.reload(); };
  const loaders = { usage, budgets: overview, keys, live: overview, config: overview };
  for (const b of document.querySelectorAll("nav button")) {
    b.onclick = () => {
      for (const o of document.querySelectorAll("nav button")) o.classList.toggle("on", o === b);
      for (const s of document.querySelectorAll("main section")) s.hidden = s.id !== b.dataset.tab;
      loaders[b.dataset.tab]();
    };
  }
  usage();
})();
