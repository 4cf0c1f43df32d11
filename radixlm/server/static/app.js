// radixlm playground: chat over the OpenAI API (streamed), the server's /metrics and the
// radix cache from /radix_tree, refreshed live. No framework, no build step.
// Model output and prompt text only ever reach the page as text (textContent, append,
// attributes), never as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const el = {
    transcript: $("transcript"), prompt: $("prompt"), send: $("send"), stop: $("stop"),
    clear: $("clear"), error: $("error"), status: $("status"), model: $("model"),
    keyBox: $("key-box"), key: $("api-key"), system: $("system"),
    temperature: $("temperature"), topP: $("top-p"), maxTokens: $("max-tokens"),
    stops: $("stop-strings"), schema: $("schema"), regex: $("regex"),
    metrics: $("metrics"), tree: $("radix-tree"), treeSummary: $("radix-summary"),
  };
  const state = {
    key: sessionStorage.getItem("radixlm-api-key") || "",
    model: null, history: [], busy: false, controller: null, needsKey: false,
    lastCounter: null, hits: new Map(),
  };

  // ------------------------------------------------------------------ HTTP
  function headers(json) {
    const h = {};
    if (state.key) h.Authorization = "Bearer " + state.key;
    if (json) h["Content-Type"] = "application/json";
    return h;
  }

  async function call(path, init = {}) {
    const res = await fetch(path, { ...init, headers: headers(init.body !== undefined) });
    if (res.status === 401) {
      askForKey();
      throw new Error("this server needs an API key: enter it at the top");
    }
    if (!res.ok) throw new Error(await errorText(res));
    return res;
  }

  async function errorText(res) {
    const body = await res.text();
    try {
      const msg = JSON.parse(body).error?.message;
      if (msg) return `${res.status}: ${msg}`;
    } catch (_) { /* not JSON */ }
    return `${res.status}: ${body.slice(0, 300)}`;
  }

  function askForKey() {
    state.needsKey = true;
    el.keyBox.hidden = false;
    setStatus("API key needed");
  }

  function showError(message) {
    el.error.textContent = message;
    el.error.hidden = !message;
  }

  function setStatus(text) { el.status.textContent = text; }

  // ------------------------------------------------------------------ chat
  function addTurn(role, text) {
    const turn = document.createElement("div");
    turn.className = "turn " + role;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role;
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    turn.append(who, body);
    el.transcript.querySelector(".hint")?.remove();
    el.transcript.append(turn);
    el.transcript.scrollTop = el.transcript.scrollHeight;
    return { turn, body };
  }

  function numberField(input, name) {
    const value = Number(input.value);
    if (input.value === "" || !Number.isFinite(value)) throw new Error(`${name} is not a number`);
    return value;
  }

  function requestBody(messages) {
    const body = {
      model: state.model || "default", messages, stream: true,
      stream_options: { include_usage: true },
      temperature: numberField(el.temperature, "temperature"),
      top_p: numberField(el.topP, "top-p"),
      max_tokens: Math.round(numberField(el.maxTokens, "max tokens")),
    };
    const stops = el.stops.value.split("\n").filter((s) => s !== "");
    if (stops.length) body.stop = stops;
    const schemaText = el.schema.value.trim();
    const regex = el.regex.value;
    if (schemaText && regex) throw new Error("use either a JSON schema or a regex, not both");
    if (schemaText) {
      let schema;
      try { schema = JSON.parse(schemaText); } catch (e) {
        throw new Error("the JSON schema is not valid JSON: " + e.message);
      }
      body.response_format = { type: "json_schema", json_schema: { name: "playground", schema } };
    } else if (regex) {
      body.regex = regex;
    }
    return body;
  }

  // Calls onEvent with each parsed `data:` event of an SSE response, in order.
  async function readEvents(res, onEvent) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") return;
          onEvent(JSON.parse(data));
        }
      }
    }
  }

  async function send() {
    const text = el.prompt.value;
    if (!text.trim() || state.busy) return;
    showError("");
    const messages = [];
    if (el.system.value.trim()) messages.push({ role: "system", content: el.system.value });
    messages.push(...state.history, { role: "user", content: text });
    let body;
    try { body = requestBody(messages); } catch (e) { showError(e.message); return; }
    const jsonMode = body.response_format !== undefined;
    el.prompt.value = "";
    addTurn("user", text);
    document.querySelector('[data-testid="answer"]')?.removeAttribute("data-testid");
    const { turn, body: answer } = addTurn("assistant", "");
    answer.dataset.testid = "answer";
    const controller = new AbortController();
    setBusy(true, controller);
    const t0 = performance.now();
    let content = "", finish = null, usage = null, first = null;
    try {
      const res = await call("/v1/chat/completions", {
        method: "POST", body: JSON.stringify(body), signal: controller.signal });
      await readEvents(res, (event) => {
        if (event.error) throw new Error(event.error.message);
        if (event.usage) usage = event.usage;
        const choice = event.choices && event.choices[0];
        if (!choice) return;
        const delta = choice.delta && choice.delta.content;
        if (delta) {
          if (first === null) {  // running now: show it without waiting for the next poll
            first = performance.now();
            refreshViews();
          }
          answer.append(delta);  // a text node: never parsed as HTML
          content += delta;
          el.transcript.scrollTop = el.transcript.scrollHeight;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      });
      if (jsonMode) prettyJson(turn, answer, content);
      state.history.push({ role: "user", content: text }, { role: "assistant", content });
      footer(turn, finish, usage, t0, first);
    } catch (e) {
      if (e.name === "AbortError") {
        footer(turn, "stopped", null, t0, first);
        state.history.push({ role: "user", content: text }, { role: "assistant", content });
      } else {
        showError(e.message);
        footer(turn, "failed (the error is above)", null, t0, first);
      }
    } finally {
      setBusy(false, null);
      refreshViews();
    }
  }

  // The metrics and radix views at once, outside their polls (a failure waits for the poll).
  function refreshViews() {
    refreshTree().catch(() => {});
    refreshMetrics().catch(() => {});
  }

  function prettyJson(turn, answer, content) {
    try {
      answer.textContent = JSON.stringify(JSON.parse(content), null, 2);
      turn.classList.add("json");
    } catch (_) { /* not (yet) JSON, e.g. cut by max tokens: left as it came */ }
  }

  function footer(turn, finish, usage, t0, first) {
    const foot = document.createElement("span");
    foot.className = "foot";
    const parts = [];
    if (usage) {
      const cached = usage.prompt_tokens_details?.cached_tokens ?? 0;
      parts.push(`${usage.prompt_tokens} prompt tokens (${cached} from the cache)`,
                 `${usage.completion_tokens} generated`);
      if (first !== null && usage.completion_tokens > 1) {
        const rate = (usage.completion_tokens - 1) / ((performance.now() - first) / 1000);
        parts.push(`${rate.toFixed(1)} tok/s`);
      }
    }
    if (first !== null) parts.push(`first token ${(first - t0).toFixed(0)} ms`);
    if (finish) parts.push(`finish: ${finish}`);
    foot.textContent = parts.join(" · ");
    turn.append(foot);
  }

  function setBusy(busy, controller) {
    state.busy = busy;
    state.controller = controller;
    el.send.disabled = busy;
    el.stop.disabled = !busy;
    setStatus(busy ? "generating…" : "");
  }

  // ------------------------------------------------------------------ metrics
  function parseMetrics(text) {
    const out = {};
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const cut = line.lastIndexOf(" ");
      out[line.slice(0, cut)] = Number(line.slice(cut + 1));
    }
    return out;
  }

  function pct(x) { return Number.isFinite(x) ? (100 * x).toFixed(1) + "%" : "–"; }

  async function refreshMetrics() {
    if (state.needsKey && !state.key) return;
    const m = parseMetrics(await (await call("/metrics")).text());
    const now = performance.now();
    const generated = m.radixlm_generation_tokens_total ?? 0;
    let rate = null;
    if (state.lastCounter && now > state.lastCounter.t) {
      rate = (generated - state.lastCounter.n) / ((now - state.lastCounter.t) / 1000);
    }
    state.lastCounter = { t: now, n: generated };
    const used = m.radixlm_kv_used_tokens, cap = m.radixlm_kv_capacity_tokens;
    const rows = [
      ["running", "running requests", m.radixlm_num_running_requests ?? 0],
      ["queued", "queued requests", m.radixlm_num_queued_requests ?? 0],
      ["tokens-per-s", "tokens/s", rate === null ? "–" : rate.toFixed(1)],
      ["kv-use", "KV use", cap ? `${pct(used / cap)} (${used}/${cap})` : "–"],
      ["hit-rate", "cache hit rate", pct(m.radixlm_cache_hit_rate)],
      ["generated", "tokens generated", generated],
    ];
    el.metrics.replaceChildren(...rows.map(([key, label, value]) => {
      const box = document.createElement("div");
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = label;
      dd.textContent = String(value);
      dd.dataset.metric = key;
      box.append(dt, dd);
      return box;
    }));
  }

  // ------------------------------------------------------------------ radix tree
  async function refreshTree() {
    if (state.needsKey && !state.key) return;
    const view = await (await call("/radix_tree?max_nodes=256")).json();
    renderTree(view);
  }

  function renderTree(view) {
    const children = new Map();
    for (const n of view.nodes) {
      if (!children.has(n.parent)) children.set(n.parent, []);
      children.get(n.parent).push(n);
    }
    const ordered = [];  // depth first, so a node's branches follow it
    const stack = [...(children.get(null) || [])].reverse();
    while (stack.length) {
      const n = stack.pop();
      ordered.push(n);
      const kids = (children.get(n.id) || []).slice().sort((a, b) => a.id - b.id);
      for (let i = kids.length - 1; i >= 0; i--) stack.push(kids[i]);
    }
    const span = Math.max(1, ...view.nodes.map((n) => n.prefix_len));
    const rows = ordered.map((n) => treeRow(n, span));
    el.tree.replaceChildren(...rows);
    const seen = new Map(view.nodes.map((n) => [n.id, n.hits]));
    state.hits = seen;
    const parts = [
      `${view.num_nodes} node${view.num_nodes === 1 ? "" : "s"}`,
      `${view.total_tokens} tokens cached (${view.protected_tokens} locked, ` +
        `${view.evictable_tokens} evictable)`,
      `hit rate ${pct(view.cache_hit_rate)}`,
    ];
    if (view.host_tokens) parts.splice(2, 0, `${view.host_tokens} more in the host tier`);
    if (!view.enabled) parts.unshift("cache disabled");
    if (view.truncated) parts.push(`showing ${view.returned} (cut by ${view.truncated_by})`);
    el.treeSummary.textContent = parts.join(" · ");
  }

  function treeRow(n, span) {
    const row = document.createElement("div");
    row.className = "radix-node";
    row.dataset.testid = "radix-node";
    row.dataset.tokens = String(n.tokens);
    row.dataset.hits = String(n.hits);
    if (n.parent === null) row.classList.add("root");
    if (n.locked) row.classList.add("locked");
    if (n.hits > 0) row.classList.add("reused");
    if (n.hits > (state.hits.get(n.id) ?? 0)) row.classList.add("fresh");
    const pad = document.createElement("span");
    pad.className = "pad";
    pad.style.width = (70 * (n.prefix_len - n.tokens) / span) + "%";
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = (70 * n.tokens / span) + "%";
    const label = document.createElement("span");
    label.className = "label";
    label.textContent = n.parent === null ? "root"
      : `${n.tokens} tok · ${n.hits} hit${n.hits === 1 ? "" : "s"}` +
        (n.locked ? " · locked" : "") + (n.tier !== "device" ? ` · ${n.tier}` : "");
    const detail = [`node ${n.id}: tokens ${n.prefix_len - n.tokens}..${n.prefix_len}`,
      `ids ${n.ids.join(" ")}${n.tokens > n.ids.length ? " …" : ""}`,
      `tier ${n.tier}, ${n.evictable ? "evictable" : "locked"}`];
    if (n.text !== undefined) detail.push(`text: ${n.text}`);
    row.title = detail.join("\n");  // an attribute: shown as text
    row.append(pad, bar, label);
    return row;
  }

  // ------------------------------------------------------------------ polling
  function poll(fn, busyMs, idleMs) {
    const tick = async () => {
      if (!document.hidden) {
        try { await fn(); } catch (e) { if (!state.busy) setStatus(e.message); }
      }
      setTimeout(tick, state.busy ? busyMs : idleMs);
    };
    tick();
  }

  async function loadModel() {
    try {
      const models = await (await call("/v1/models")).json();
      state.model = models.data[0].id;
      el.model.textContent = state.model;
      state.needsKey = state.needsKey && !state.key;
      setStatus("");
    } catch (e) {
      setStatus(e.message);
    }
  }

  // ------------------------------------------------------------------ wiring
  el.key.value = state.key;
  el.key.addEventListener("change", () => {
    state.key = el.key.value.trim();
    sessionStorage.setItem("radixlm-api-key", state.key);
    loadModel();
  });
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  el.prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  el.stop.addEventListener("click", () => state.controller && state.controller.abort());
  el.clear.addEventListener("click", () => {
    if (state.busy) return;
    state.history = [];
    el.transcript.replaceChildren();
    showError("");
  });
  loadModel();
  poll(refreshMetrics, 500, 1500);
  poll(refreshTree, 400, 2000);
})();
