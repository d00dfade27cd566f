// RadixGen live dashboard: reads /dashboard/api/stream (server-sent events, one view a second)
// and draws it. No build step, no dependencies; every text from the server goes in through
// textContent (prompts and outputs are user text).
"use strict";

const folded = new Set(); // radix node ids the user folded
const openReqs = new Set(); // request rids whose text is shown
const SVGNS = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") node.textContent = v;
    else if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function setText(id, value) {
  document.getElementById(id).textContent = value;
}

const pct = (x) => (100 * x).toFixed(1) + "%";
const ago = (s) => (s < 60 ? s.toFixed(0) + " s" : s < 3600 ? (s / 60).toFixed(0) + " min" : (s / 3600).toFixed(1) + " h");

function spark(id, values, max) {
  const svg = document.getElementById(id);
  svg.replaceChildren();
  if (values.length < 2) return;
  const top = Math.max(max || 0, ...values, 1e-9);
  const step = 200 / (values.length - 1);
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(38 - (36 * v) / top).toFixed(1)}`);
  svg.append(el("svg:polyline", { points: points.join(" ") }));
}

function drawCounters(view) {
  const st = view.state;
  const hist = view.history || [];
  const last = hist.length ? hist[hist.length - 1] : null;
  setText("kv-usage", pct(st.kv_usage));
  setText("hit-rate", pct(st.cache_hit_rate));
  setText("running", st.running_requests);
  setText("waiting", st.waiting_requests);
  setText("retracted", view.retracted_waiting);
  setText("tps", last ? last.tokens_per_s.toFixed(1) : "–");
  setText("prompt-tokens", st.prompt_tokens);
  setText("cached-tokens", st.cached_tokens);
  setText("generated-tokens", st.generated_tokens);
  setText("forward-steps", st.forward_steps);
  setText("evicted-tokens", st.evicted_tokens);
  setText("kv-tokens", `${st.kv_used_tokens} / ${st.max_total_num_tokens}`);
  drawTiers(st);
  spark("spark-kv", hist.map((p) => p.kv_usage), 1);
  spark("spark-hit", hist.map((p) => p.cache_hit_rate), 1);
  spark("spark-running", hist.map((p) => p.running));
  spark("spark-waiting", hist.map((p) => p.waiting));
  spark("spark-retracted", hist.map((p) => p.retracted));
  spark("spark-tps", hist.map((p) => p.tokens_per_s));
}

// HiCache's lower tiers (--enable-hierarchical-cache): what each holds and how many prompt tokens
// it served instead of a prefill; hidden on servers without them
function drawTiers(st) {
  const on = st.host_capacity_tokens !== undefined;
  document.getElementById("hicache-tiers").hidden = !on;
  if (!on) return;
  setText("host-tier", `${st.host_used_tokens} / ${st.host_capacity_tokens} tokens, served ${st.host_hit_tokens}`);
  const files = st.storage_blocks !== undefined;
  document.getElementById("storage-part").hidden = !files;
  if (!files) return;
  const mb = (b) => (b / 2 ** 20).toFixed(1);
  setText(
    "storage-tier",
    `${st.storage_blocks} blocks, ${mb(st.storage_used_bytes)} / ${mb(st.storage_capacity_bytes)} MB, served ${st.storage_hit_tokens}`,
  );
}

function nodeItem(n, kids) {
  const hasKids = kids.has(n.id) || n.hidden_children > 0;
  const isFolded = folded.has(n.id);
  const cls = ["node", hasKids ? (isFolded ? "folded" : "open") : "leaf", n.hot ? "hot" : ""].join(" ");
  const label = el(
    "div",
    {
      class: cls,
      "data-node-id": n.id,
      "data-tokens": n.tokens,
      "data-prefix-tokens": n.prefix_tokens,
      "data-hits": n.hits,
      "data-lock": n.lock_ref,
      title: `${n.tokens} tokens on this edge, ${n.prefix_tokens} from the root`,
      onclick: (e) => {
        e.stopPropagation();
        if (folded.has(n.id)) folded.delete(n.id);
        else folded.add(n.id);
        render(lastView);
      },
    },
    el("span", { class: "tok", text: n.tokens }),
    " ",
    el("span", { class: "text", text: n.preview.replace(/\n/g, "⏎").replace(/\t/g, "⇥") }),
    n.lock_ref ? el("span", { class: "badge lock", text: `🔒${n.lock_ref}` }) : null,
    n.hits ? el("span", { class: "badge hits", text: `${n.hits} hit${n.hits === 1 ? "" : "s"}` }) : null,
    el("span", { class: "idle", text: ` ${ago(n.idle_s)}` }),
  );
  const li = el("li", {}, label);
  if (hasKids && !isFolded) {
    const ul = el("ul");
    for (const c of kids.get(n.id) || []) ul.append(nodeItem(c, kids));
    if (n.hidden_children > 0) ul.append(el("li", { class: "more", text: `+${n.hidden_children} more` }));
    li.append(ul);
  }
  return li;
}

function drawTree(view) {
  const box = document.getElementById("tree");
  if (!view.radix_enabled) {
    box.replaceChildren(el("div", { class: "muted", text: "the radix cache is off (--disable-radix-cache)" }));
    return;
  }
  const nodes = view.tree.nodes;
  if (!nodes.length) {
    box.replaceChildren(el("div", { class: "muted", text: "the cache is empty" }));
    return;
  }
  const kids = new Map();
  for (const n of nodes) {
    if (!kids.has(n.parent)) kids.set(n.parent, []);
    kids.get(n.parent).push(n);
  }
  const ul = el("ul");
  for (const n of kids.get(-1) || []) ul.append(nodeItem(n, kids));
  if (view.tree.truncated) ul.append(el("li", { class: "more", text: "(smaller nodes left out)" }));
  const scroll = box.scrollTop;
  box.replaceChildren(ul);
  box.scrollTop = scroll;
}

function drawBatch(view) {
  const b = view.batch;
  const box = document.getElementById("batch");
  const rows = b
    ? [
        ["decode rows", b.decode_rows],
        ["prefill rows", b.prefill_rows],
        ["prefill tokens", b.prefill_tokens],
        ["grammar-constrained rows", b.grammar_rows],
        ["jump-forward tokens (total)", b.jump_forward_tokens],
        ["last step", `${ago(Math.max(0, view.time - b.time))} ago`],
      ]
    : [["no step yet", ""]];
  box.replaceChildren(...rows.flatMap(([k, v]) => [el("span", { text: k }), el("b", { id: "batch-" + k.split(" ")[0], text: v })]));
  const svg = document.getElementById("batch-bars");
  svg.replaceChildren();
  const steps = view.steps.slice(-60);
  const top = Math.max(1, ...steps.map((s) => s.decode_rows + s.prefill_rows));
  const w = 240 / 60;
  steps.forEach((s, i) => {
    const hd = (58 * s.decode_rows) / top;
    const hp = (58 * s.prefill_rows) / top;
    svg.append(el("svg:rect", { class: "decode", x: i * w, y: 60 - hd, width: w - 0.5, height: hd }));
    svg.append(el("svg:rect", { class: "prefill", x: i * w, y: 60 - hd - hp, width: w - 0.5, height: hp }));
  });
}

function timeline(r, now) {
  const svg = el("svg:svg", { class: "timeline", viewBox: "0 0 220 12", preserveAspectRatio: "none" });
  const t0 = r.arrival;
  if (!t0) return svg;
  const end = r.finished || now;
  const span = Math.max(end - t0, 1e-3);
  const x = (t) => (220 * (t - t0)) / span;
  const seg = (cls, a, b, what) => {
    if (a == null || b == null || b < a) return;
    const rect = el("svg:rect", { class: cls, x: x(a), y: 1, width: Math.max(x(b) - x(a), 0.5), height: 10 });
    rect.append(el("svg:title", { text: `${what}: ${(1000 * (b - a)).toFixed(0)} ms` }));
    svg.append(rect);
  };
  const admitted = r.admitted || (r.state === "waiting" ? end : null);
  seg("queued", t0, admitted, "queued");
  seg("prefill", r.admitted, r.first_token || (r.admitted ? end : null), "prefill");
  seg("decode", r.first_token, end, "decode");
  return svg;
}

function drawRequests(view) {
  const body = document.querySelector("#requests tbody");
  const rows = [];
  for (const r of view.requests) {
    const prompt = `${r.prompt_tokens} (${r.cached_tokens} + ${r.computed_tokens})`;
    const finish = r.finish_reason ? r.finish_reason + (r.finish_message ? `: ${r.finish_message}` : "") : "";
    const extra = [r.constrained ? "grammar" : "", r.jump_forward_tokens ? `jf ${r.jump_forward_tokens}` : "", r.retractions ? `retracted ${r.retractions}×` : ""]
      .filter(Boolean)
      .join(" · ");
    const toggle = () => {
      if (openReqs.has(r.rid)) openReqs.delete(r.rid);
      else openReqs.add(r.rid);
      render(lastView);
    };
    rows.push(
      el(
        "tr",
        { class: "req", "data-rid": r.rid, "data-state": r.state, onclick: toggle },
        el("td", { class: "rid", text: r.rid, title: r.rid }),
        el("td", { text: r.state }),
        el("td", { class: "prompt-tokens", text: prompt }),
        el("td", { text: `${r.completion_tokens}${extra ? " · " + extra : ""}` }),
        el("td", {}, timeline(r, view.time)),
        el("td", { text: finish }),
      ),
    );
    if (openReqs.has(r.rid)) {
      rows.push(el("tr", { class: "detail", "data-rid": r.rid }, el("td", { colspan: 6 }, el("div", { class: "muted", text: "prompt" }), el("div", { text: r.prompt }), el("div", { class: "muted", text: "output" }), el("div", { text: r.output }))));
    }
  }
  body.replaceChildren(...rows);
}

// --- Programs: traced DSL runs (/dashboard/api/traces) ----------------------------------------

let openTrace = null; // the trace id whose tree is shown
let traceView = null; // its tree as last fetched
let traceStamp = ""; // what of its summary changes while it runs: refetch when it does
const HIGH_SHARE = 0.5; // a cached share at least this is highlighted

const ms = (s) => (s == null ? "–" : s < 1 ? (1000 * s).toFixed(0) + " ms" : s.toFixed(2) + " s");

function tokenBar(n) {
  const svg = el("svg:svg", { class: "tokbar", viewBox: "0 0 80 8", preserveAspectRatio: "none" });
  const w = n.prompt_tokens ? (80 * n.cached_tokens) / n.prompt_tokens : 0;
  svg.append(el("svg:rect", { class: "cached", x: 0, y: 0, width: w, height: 8 }));
  svg.append(el("svg:rect", { class: "computed", x: w, y: 0, width: 80 - w, height: 8 }));
  return svg;
}

function shareSpan(share, suffix = " cached") {
  return el("span", { class: "share" + (share >= HIGH_SHARE ? " high" : ""), text: pct(share) + suffix });
}

function drawPrograms(view) {
  const body = document.querySelector("#programs tbody");
  const traces = view.traces || [];
  body.replaceChildren(
    ...traces.map((t) =>
      el(
        "tr",
        { class: "trace" + (t.id === openTrace ? " selected" : ""), "data-trace-id": t.id, onclick: () => selectTrace(t.id) },
        el("td", { text: t.program || "(program)", title: t.id }),
        el("td", { text: new Date(t.started * 1000).toLocaleTimeString() }),
        el("td", { text: t.running ? `${t.requests} (${t.running} running)` : t.requests }),
        el("td", { text: `${t.prompt_tokens} (${t.cached_tokens} + ${t.computed_tokens})` }),
        el("td", {}, shareSpan(t.cached_share, "")),
      ),
    ),
  );
  if (!traces.length) body.append(el("tr", {}, el("td", { colspan: 5, class: "muted", text: "no traced runs yet" })));
  const open = traces.find((t) => t.id === openTrace);
  const stamp = open ? `${open.requests}/${open.running}/${open.updated}` : "";
  if (open && stamp !== traceStamp) {
    traceStamp = stamp;
    fetchTrace(open.id);
  }
}

function selectTrace(id) {
  openTrace = openTrace === id ? null : id;
  traceView = null;
  traceStamp = "";
  drawTrace();
  render(lastView);
}

async function fetchTrace(id) {
  try {
    const r = await fetch(`/dashboard/api/traces/${encodeURIComponent(id)}`);
    const data = await r.json();
    if (id !== openTrace) return; // another one was picked meanwhile
    traceView = r.ok ? data : { error: data.error ? data.error.message : `HTTP ${r.status}` };
  } catch (e) {
    traceView = { error: String(e) };
  }
  drawTrace();
}

function traceItem(n, byId) {
  const isState = ["program", "fork", "branch", "item"].includes(n.kind);
  const time = isState ? `wall ${ms(n.wall_s)}` : ms(n.total_s);
  const phases = isState ? "" : `queued ${ms(n.queue_s)} · prefill ${ms(n.prefill_s)} · decode ${ms(n.decode_s)}`;
  const row = el(
    "div",
    {
      class: "tnode",
      "data-node-id": n.id,
      "data-kind": n.kind,
      "data-prompt-tokens": n.prompt_tokens,
      "data-cached-tokens": n.cached_tokens,
      title: `${n.requests} request(s)${phases ? "; " + phases : ""}${n.finish_reason ? "; finish: " + n.finish_reason : ""}`,
    },
    el("span", { class: "kind", text: n.kind }),
    el("span", { class: "label", text: n.label }),
    tokenBar(n),
    el("span", { class: "tokens", text: `${n.prompt_tokens} = ${n.cached_tokens} cached + ${n.computed_tokens} computed` }),
    shareSpan(n.cached_share),
    n.completion_tokens ? el("span", { class: "muted", text: `→ ${n.completion_tokens} out` }) : null,
    el("span", { class: "muted", text: time }),
    n.running ? el("span", { class: "badge lock", text: `${n.running} running` }) : null,
    n.finish_reason === "abort" ? el("span", { class: "badge lock", text: "aborted" }) : null,
  );
  const li = el("li", {}, row);
  if (n.children.length) {
    const ul = el("ul");
    for (const c of n.children) if (byId.has(c)) ul.append(traceItem(byId.get(c), byId));
    li.append(ul);
  }
  return li;
}

function drawTrace() {
  const box = document.getElementById("trace");
  if (!openTrace) {
    box.replaceChildren(el("div", { class: "muted", text: "no program selected" }));
    return;
  }
  if (!traceView) {
    box.replaceChildren(el("div", { class: "muted", text: "loading…" }));
    return;
  }
  if (traceView.error) {
    box.replaceChildren(el("div", { class: "muted", text: traceView.error }));
    return;
  }
  const t = traceView;
  const byId = new Map(t.nodes.map((n) => [n.id, n]));
  const head = el(
    "div",
    { class: "trace-head", id: "trace-head", "data-trace-id": t.id },
    el("b", { text: t.program || "(program)" }),
    ` · ${t.requests} requests · prompt ${t.prompt_tokens} tokens, ${t.cached_tokens} from the cache `,
    shareSpan(t.cached_share),
    t.dropped_calls ? el("span", { class: "muted", text: ` · ${t.dropped_calls} later calls not kept` }) : null,
  );
  const root = byId.get("");
  const scroll = box.scrollTop;
  box.replaceChildren(head, root ? el("ul", {}, traceItem(root, byId)) : el("div", { class: "muted", text: "no calls yet" }));
  box.scrollTop = scroll;
}

let lastView = null;

function render(view) {
  if (!view) return;
  drawCounters(view);
  drawTree(view);
  drawBatch(view);
  drawRequests(view);
  drawPrograms(view);
  setText("clock", new Date(view.time * 1000).toLocaleTimeString());
}

function connect() {
  const status = document.getElementById("status");
  // the page's own query (e.g. ?max_nodes=500) is passed on to the stream
  const query = new URLSearchParams(location.search);
  const params = new URLSearchParams();
  for (const name of ["max_nodes", "interval"]) if (query.has(name)) params.set(name, query.get(name));
  const source = new EventSource("/dashboard/api/stream" + (params.toString() ? "?" + params : ""));
  source.onmessage = (e) => {
    const data = JSON.parse(e.data);
    if (data.error) {
      status.textContent = data.error.message;
      status.className = "status error";
      return;
    }
    lastView = data;
    status.textContent = "live";
    status.className = "status live";
    render(data);
  };
  source.onerror = () => {
    status.textContent = "reconnecting…";
    status.className = "status error";
  };
}

connect();
