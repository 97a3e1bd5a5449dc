/* smelt's web chat (docs/server.md, "Web chat"). One page talking to the server's own
 * OpenAI routes: GET /v1/models for the model picker, POST /v1/chat/completions with
 * stream: true for answers. Conversations and settings live in this browser's
 * localStorage. Model output is untrusted: markdown is rendered by marked, the HTML it makes
 * is cleaned by DOMPurify before it reaches innerHTML, and code is highlighted by
 * highlight.js from its text; the user's own text is shown as text. Without marked or
 * DOMPurify (a page loaded without them) everything is shown as plain text. */
"use strict";

(function () {
  const KEYS = { settings: "smelt.settings", convs: "smelt.conversations", current: "smelt.current" };
  const SAVE_EVERY_MS = 1000; /* a streaming answer is saved this often (a reload keeps it) */
  const AUTO_DETECT_MAX = 20000; /* code longer than this is not given to language detection */

  const $ = (id) => document.getElementById(id);
  const el = {
    app: $("app"), list: $("conversations"), newChat: $("new-chat"), messages: $("messages"),
    model: $("model"), status: $("status"), input: $("input"), send: $("send"), stop: $("stop"),
    settings: $("settings"), toggleSettings: $("toggle-settings"), toggleSidebar: $("toggle-sidebar"),
    system: $("set-system"), temperature: $("set-temperature"), topP: $("set-top-p"),
    topK: $("set-top-k"), minP: $("set-min-p"), maxTokens: $("set-max-tokens"), apiKey: $("set-api-key"), keyRow: $("key-row"), keyNote: $("key-note"),
  };

  /* ---- storage ---- */

  function load(key, fallback) {
    try {
      const v = localStorage.getItem(key);
      return v === null ? fallback : JSON.parse(v);
    } catch (e) {
      return fallback;
    }
  }

  function store(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
      return true;
    } catch (e) {
      setStatus("Could not save to this browser's storage: " + e.message, true);
      return false;
    }
  }

  const settings = Object.assign(
    { model: "", system: "", temperature: "", top_p: "", top_k: "", min_p: "", max_tokens: "", apiKey: "" },
    load(KEYS.settings, {}));
  /* the stored conversations, less entries this page cannot show (storage is shared with
   * other tabs and older pages; anything in it may be malformed) */
  function loadConvs() {
    const v = load(KEYS.convs, []);
    return (Array.isArray(v) ? v : []).filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages)
      && c.messages.every((m) => m && typeof m.content === "string"));
  }
  let convs = loadConvs();
  let currentId = load(KEYS.current, null);
  let busy = null; /* the answer streaming now: {controller, conv, msg} */
  let lastSave = 0;

  const saveSettings = () => store(KEYS.settings, settings);
  function saveConvs() {
    lastSave = Date.now();
    store(KEYS.convs, convs);
    store(KEYS.current, currentId);
  }
  const current = () => convs.find((c) => c.id === currentId) || null;

  /* ---- rendering untrusted text ---- */

  const lib = { marked: window.marked, purify: window.DOMPurify, hljs: window.hljs };
  const rich = !!(lib.marked && lib.marked.parse && lib.purify && lib.purify.sanitize);
  /* marked 4 (Debian 12): no heading ids (they could clobber this page's), no e-mail mangling */
  const MD = { gfm: true, breaks: false, headerIds: false, mangle: false };
  /* what model output may not contain even after DOMPurify's defaults: forms and their
   * fields (a fake "enter your key" box), ids and names (DOM clobbering), inline styles */
  const PURIFY = {
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option", "dialog"],
    FORBID_ATTR: ["id", "name", "style", "autofocus"],
    ALLOW_DATA_ATTR: false,
  };
  if (rich) {
    /* classes: only marked's language-NAME on code (highlight.js reads it) */
    lib.purify.addHook("uponSanitizeAttribute", (node, data) => {
      if (data.attrName === "class")
        data.attrValue = data.attrValue.split(/\s+/).filter((c) => /^language-[\w+#.-]+$/.test(c)).join(" ");
    });
    /* links open elsewhere, without this page as their opener or referrer */
    lib.purify.addHook("afterSanitizeAttributes", (node) => {
      if (node.tagName === "A" && node.hasAttribute("href")) {
        node.setAttribute("target", "_blank");
        node.setAttribute("rel", "noopener noreferrer");
      }
    });
  }
  if (lib.hljs && lib.hljs.configure)
    lib.hljs.configure({ hideUpgradeWarningAcceptNoSupportOrSecurityUpdates: true });

  function highlight(code, final) {
    const h = lib.hljs;
    if (!h) return;
    const m = /(?:^|\s)language-([\w+#.-]+)/.exec(code.className);
    if (m && !h.getLanguage(m[1])) return; /* a language highlight.js does not know: as it is */
    /* guessing a language tries every one: only once the answer is complete */
    if (!m && (!final || code.textContent.length > AUTO_DETECT_MAX)) return;
    const fn = h.highlightElement || h.highlightBlock; /* v11 / v9-10 */
    if (fn) fn.call(h, code);
  }

  /* Shows markdown text in node: marked -> DOMPurify -> innerHTML, then code highlighting
   * (final: the text is complete, so code without a language may be guessed). */
  function renderMarkdown(node, text, final) {
    if (!rich) {
      node.textContent = text;
      return;
    }
    let html;
    try {
      html = lib.marked.parse(text, MD);
    } catch (e) {
      node.textContent = text;
      return;
    }
    node.innerHTML = lib.purify.sanitize(html, PURIFY);
    node.querySelectorAll("pre code").forEach((code) => highlight(code, final));
  }

  /* ---- the conversation list ---- */

  function titleFrom(text) {
    const t = text.replace(/\s+/g, " ").trim();
    return t.length > 48 ? t.slice(0, 47) + "\u2026" : t || "New chat";
  }

  /* A button showing text (named label for a screen reader when text is a symbol). */
  function button(cls, text, label, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = cls;
    b.textContent = text;
    if (label) b.setAttribute("aria-label", label);
    b.addEventListener("click", onClick);
    return b;
  }

  function renderList() {
    el.list.textContent = "";
    for (const c of convs) {
      const li = document.createElement("li");
      li.dataset.id = c.id;
      if (c.id === currentId) li.className = "current";
      const name = c.title || "New chat";
      const title = button("conv-title", name, null, () => select(c.id));
      title.title = c.title || "";
      if (c.id === currentId) title.setAttribute("aria-current", "true");
      const rename = button("rename", "\u270E", "Rename " + name, () => startRename(li, c));
      rename.title = "Rename";
      const del = button("delete", "\u2715", "Delete " + name, () => askDelete(del, c));
      del.title = "Delete";
      li.append(title, rename, del);
      el.list.appendChild(li);
    }
  }

  function startRename(li, c) {
    const input = document.createElement("input");
    input.type = "text";
    input.className = "rename-input";
    input.value = c.title || "";
    input.maxLength = 200;
    input.setAttribute("aria-label", "New title");
    li.textContent = "";
    li.appendChild(input);
    input.focus();
    input.select();
    let done = false;
    const finish = (keep) => {
      if (done) return;
      done = true;
      const t = input.value.trim();
      if (keep && t) {
        c.title = t;
        saveConvs();
      }
      renderList();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") finish(true);
      else if (e.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(true));
  }

  /* Delete asks twice: the first click arms the button for three seconds. */
  function askDelete(button, c) {
    if (!button.classList.contains("armed")) {
      button.classList.add("armed");
      button.textContent = "Delete?";
      setTimeout(() => {
        button.classList.remove("armed");
        button.textContent = "\u2715";
      }, 3000);
      return;
    }
    if (busy && busy.conv === c) busy.controller.abort();
    convs = convs.filter((x) => x !== c);
    if (currentId === c.id) currentId = null;
    saveConvs();
    renderList();
    renderConversation();
  }

  /* Shows conversation id (null: a new, empty one). */
  function select(id) {
    currentId = id;
    store(KEYS.current, currentId);
    el.app.classList.remove("show-sidebar");
    renderList();
    renderConversation();
    el.input.focus();
  }

  /* ---- messages ---- */

  function renderConversation() {
    el.messages.textContent = "";
    const c = current();
    if (!c || c.messages.length === 0) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "Send a message to start a conversation.";
      el.messages.appendChild(p);
      return;
    }
    c.messages.forEach((m, i) => {
      const view = messageView(m);
      el.messages.appendChild(view);
      if (m.role === "assistant") fillAssistant(view, m, true, i === c.messages.length - 1);
    });
    el.messages.scrollTop = el.messages.scrollHeight;
  }

  function messageView(m) {
    const div = document.createElement("div");
    div.className = "msg " + (m.role === "user" ? "user" : "assistant");
    const role = document.createElement("div");
    role.className = "role";
    role.textContent = m.role === "user" ? "You" : m.model || "Assistant";
    div.appendChild(role);
    if (m.role === "user") {
      const t = document.createElement("div");
      t.className = "text";
      t.textContent = m.content;
      div.appendChild(t);
    } else {
      const details = document.createElement("details");
      details.className = "reasoning";
      details.hidden = true;
      const summary = document.createElement("summary");
      summary.textContent = "Reasoning";
      const r = document.createElement("div");
      r.className = "md";
      details.append(summary, r);
      const content = document.createElement("div");
      content.className = "md content";
      const error = document.createElement("div");
      error.className = "error";
      error.hidden = true;
      const stats = document.createElement("div");
      stats.className = "stats";
      div.append(details, content, error, stats);
    }
    return div;
  }

  function fmt(x, digits) {
    return x.toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: digits });
  }

  /* The assistant message m in its view (final: complete; last: the conversation's last
   * message, which gets a Regenerate button). */
  function fillAssistant(view, m, final, last) {
    view.querySelector(".role").textContent = m.model || "Assistant";
    const details = view.querySelector(".reasoning");
    if (m.reasoning) {
      details.hidden = false;
      details.querySelector("summary").textContent = final ? "Reasoning" : "Reasoning\u2026";
      renderMarkdown(details.querySelector(".md"), m.reasoning, final);
    }
    const content = view.querySelector(".content");
    renderMarkdown(content, m.content, final);
    content.classList.toggle("cursor", !final);
    const error = view.querySelector(".error");
    error.hidden = !m.error;
    error.textContent = m.error || "";
    const stats = view.querySelector(".stats");
    stats.textContent = "";
    const parts = [];
    const s = m.stats;
    if (s) {
      parts.push(s.tokens + (s.tokens === 1 ? " token" : " tokens"));
      if (s.tps) parts.push(fmt(s.tps, 1) + " tok/s");
      if (s.ttft !== undefined && s.ttft !== null) parts.push("first token " + fmt(s.ttft, 2) + " s");
    }
    if (m.stopped) parts.push("stopped");
    else if (m.finish === "length") parts.push("cut at max_tokens");
    else if (m.finish && m.finish !== "stop" && m.finish !== "tool_calls") parts.push("ended: " + m.finish);
    for (const p of parts) {
      const span = document.createElement("span");
      span.textContent = p;
      stats.appendChild(span);
    }
    if (final && last && !busy) {
      stats.appendChild(button("regenerate", "Regenerate", null, regenerate));
    }
  }

  /* ---- talking to the server ---- */

  function headers(json) {
    const h = {};
    if (json) h["Content-Type"] = "application/json";
    if (settings.apiKey) h["Authorization"] = "Bearer " + settings.apiKey;
    return h;
  }

  function setStatus(text, isError) {
    el.status.textContent = text || "";
    el.status.classList.toggle("error", !!isError);
  }

  function askKey() {
    el.settings.hidden = false;
    el.toggleSettings.setAttribute("aria-expanded", "true");
    el.keyNote.hidden = false;
    el.keyRow.classList.add("needed");
    el.apiKey.focus();
  }

  /* The error body's message (OpenAI's or Anthropic's shape), else the status line. */
  async function errorText(res) {
    let msg = "";
    try {
      const j = await res.json();
      msg = (j && j.error && (j.error.message || j.error)) || "";
    } catch (e) {
      /* not JSON */
    }
    return "HTTP " + res.status + (msg ? ": " + msg : res.statusText ? " " + res.statusText : "");
  }

  async function loadModels() {
    let res;
    try {
      res = await fetch("/v1/models", { headers: headers(false) });
    } catch (e) {
      setStatus("Cannot reach the server: " + e.message, true);
      return;
    }
    if (res.status === 401) {
      setStatus("This server needs an API key (Settings).", true);
      askKey();
      return;
    }
    if (!res.ok) {
      setStatus("/v1/models: " + (await errorText(res)), true);
      return;
    }
    let list = [];
    try {
      const j = await res.json();
      list = Array.isArray(j.data) ? j.data.filter((m) => m && typeof m.id === "string") : [];
    } catch (e) {
      setStatus("/v1/models: not JSON", true);
      return;
    }
    el.model.textContent = "";
    for (const m of list) {
      const o = document.createElement("option");
      o.value = m.id;
      /* a server with several models says whether each is loaded (status.value) */
      const st = m.status && typeof m.status.value === "string" ? m.status.value : "";
      o.textContent = st && st !== "loaded" ? m.id + " (" + st + ")" : m.id;
      el.model.appendChild(o);
    }
    if (list.some((m) => m.id === settings.model)) el.model.value = settings.model;
    if (list.length) {
      settings.model = el.model.value;
      saveSettings();
      setStatus("");
    } else {
      setStatus("The server lists no model.", true);
    }
  }

  function requestBody(c) {
    const messages = [];
    if (settings.system.trim()) messages.push({ role: "system", content: settings.system });
    for (const m of c.messages) {
      if (m.role === "assistant" && !m.content) continue; /* failed or empty answers */
      messages.push({ role: m.role, content: m.content });
    }
    /* an answer with nothing before it from the user is not sent */
    while (messages.length && messages[messages.length - 1].role === "assistant") messages.pop();
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    if (settings.model) body.model = settings.model;
    const num = (v) => (v === "" || v === null || v === undefined ? null : Number(v));
    for (const k of ["temperature", "top_p", "min_p"]) {
      const v = num(settings[k]);
      if (v !== null && isFinite(v)) body[k] = v;
    }
    for (const k of ["top_k", "max_tokens"]) {
      const v = num(settings[k]);
      if (v !== null && isFinite(v) && v >= 1) body[k] = Math.floor(v);
    }
    return body;
  }

  function setBusy(on) {
    el.send.disabled = on;
    el.stop.hidden = !on;
    /* a screen reader announces the answer once it is complete, not each token */
    el.messages.setAttribute("aria-busy", String(on));
  }

  let renderPending = 0; /* the requestAnimationFrame of the streaming answer's next render */
  function scheduleRender(view, m) {
    if (renderPending) return;
    renderPending = requestAnimationFrame(() => {
      renderPending = 0;
      if (!view.isConnected) return;
      const box = el.messages;
      const stick = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
      fillAssistant(view, m, false, false);
      if (stick) box.scrollTop = box.scrollHeight;
    });
  }

  /* Streams the answer to conversation c into m (its last message), shown in view. The
   * Stop button aborts the fetch; the server cancels the request when the connection
   * closes. Tokens/s is the completion's tokens (the stream's usage; else one per chunk,
   * as smelt sends a chunk per token) over the time from the first to the last token. */
  async function stream(c, m, view) {
    const controller = new AbortController();
    busy = { controller, conv: c, msg: m };
    setBusy(true);
    const t0 = performance.now();
    let tFirst = 0, tLast = 0, chunks = 0, usage = null;
    try {
      const res = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(true), body: JSON.stringify(requestBody(c)),
        signal: controller.signal,
      });
      if (!res.ok) {
        m.error = await errorText(res);
        if (res.status === 401) {
          m.error += "\nEnter the server's API key in Settings, then Regenerate.";
          askKey();
        }
        return;
      }
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          for (const line of block.split("\n")) {
            if (!line.startsWith("data:")) continue;
            const data = line.slice(5).trim();
            if (data === "[DONE]") continue;
            let ev;
            try {
              ev = JSON.parse(data);
            } catch (e) {
              continue;
            }
            if (ev.error) {
              m.error = "Error: " + (ev.error.message || JSON.stringify(ev.error));
              continue;
            }
            if (typeof ev.model === "string") m.model = ev.model;
            if (ev.usage) usage = ev.usage;
            const ch = Array.isArray(ev.choices) ? ev.choices[0] : null;
            if (!ch) continue;
            const d = ch.delta || {};
            const r = typeof d.reasoning_content === "string" ? d.reasoning_content : "";
            const t = typeof d.content === "string" ? d.content : "";
            if (r || t) {
              chunks++;
              tLast = performance.now();
              if (!tFirst) tFirst = tLast;
            }
            m.reasoning = (m.reasoning || "") + r;
            m.content += t;
            if (ch.finish_reason) m.finish = ch.finish_reason;
          }
        }
        scheduleRender(view, m);
        if (Date.now() - lastSave > SAVE_EVERY_MS) saveConvs();
      }
    } catch (e) {
      if (e.name === "AbortError") m.stopped = true;
      else m.error = "The connection failed: " + e.message;
    } finally {
      const tokens = usage && typeof usage.completion_tokens === "number" ? usage.completion_tokens : chunks;
      if (tFirst) {
        const span = (tLast - tFirst) / 1000;
        m.stats = {
          tokens,
          tps: tokens > 1 && span > 0 ? (tokens - 1) / span : null,
          ttft: (tFirst - t0) / 1000,
        };
      }
      cancelAnimationFrame(renderPending); /* the render below is the last */
      renderPending = 0;
      busy = null;
      setBusy(false);
      c.updated = Date.now();
      saveConvs();
      if (view.isConnected) fillAssistant(view, m, true, c.messages[c.messages.length - 1] === m);
    }
  }

  function newConversation() {
    const id = Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
    const c = { id, title: "", created: Date.now(), updated: Date.now(), messages: [] };
    convs.unshift(c);
    currentId = id;
    return c;
  }

  function toTop(c) {
    convs = [c].concat(convs.filter((x) => x !== c));
  }

  function send() {
    const text = el.input.value;
    if (!text.trim() || busy) return;
    const c = current() || newConversation();
    if (!c.title) c.title = titleFrom(text);
    c.messages.push({ role: "user", content: text });
    const m = { role: "assistant", content: "", model: settings.model };
    c.messages.push(m);
    c.updated = Date.now();
    toTop(c);
    saveConvs();
    el.input.value = "";
    renderList();
    renderConversation();
    stream(c, m, el.messages.lastElementChild);
  }

  function regenerate() {
    const c = current();
    if (!c || busy) return;
    while (c.messages.length && c.messages[c.messages.length - 1].role === "assistant") c.messages.pop();
    if (!c.messages.length) return;
    const m = { role: "assistant", content: "", model: settings.model };
    c.messages.push(m);
    saveConvs();
    renderConversation();
    stream(c, m, el.messages.lastElementChild);
  }

  /* ---- settings ---- */

  const fields = [
    [el.system, "system"], [el.temperature, "temperature"], [el.topP, "top_p"], [el.topK, "top_k"],
    [el.minP, "min_p"], [el.maxTokens, "max_tokens"], [el.apiKey, "apiKey"],
  ];
  for (const [input, key] of fields) {
    input.value = settings[key];
    input.addEventListener("change", () => {
      settings[key] = key === "apiKey" ? input.value.trim() : input.value;
      saveSettings();
      if (key === "apiKey") {
        el.keyNote.hidden = true;
        el.keyRow.classList.remove("needed");
        setStatus("");
        loadModels();
      }
    });
  }
  el.model.addEventListener("change", () => {
    settings.model = el.model.value;
    saveSettings();
  });
  el.toggleSettings.addEventListener("click", () => {
    el.settings.hidden = !el.settings.hidden;
    el.toggleSettings.setAttribute("aria-expanded", String(!el.settings.hidden));
  });
  el.toggleSidebar.addEventListener("click", () => el.app.classList.toggle("show-sidebar"));

  /* ---- the composer ---- */

  el.send.addEventListener("click", send);
  el.stop.addEventListener("click", () => busy && busy.controller.abort());
  el.input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    } else if (e.key === "Escape" && busy) {
      busy.controller.abort();
    }
  });
  el.newChat.addEventListener("click", () => select(null));
  /* another tab changed the conversations */
  window.addEventListener("storage", (e) => {
    if (e.key !== KEYS.convs || busy) return;
    convs = loadConvs();
    renderList();
    renderConversation();
  });

  renderList();
  renderConversation();
  loadModels();
  el.input.focus();
  document.documentElement.dataset.ready = "1"; /* for tests: the script ran */
})();
