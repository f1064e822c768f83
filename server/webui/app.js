// kiln's chat page: served by `kiln serve` at / (embedded in the binary; no network beyond this
// server). Conversations live in this browser's localStorage. Model output is never inserted
// as HTML: the markdown renderer below builds DOM nodes with text content only.
'use strict';

const KEYS = { convs: 'kiln.conversations', current: 'kiln.current', settings: 'kiln.settings', key: 'kiln.apiKey' };
const MAX_CONVERSATIONS = 200;

const state = {
  convs: [],
  current: null,
  settings: { system: '', temperature: '', top_p: '', max_tokens: '', model: '' },
  key: '',
  models: [],
  ctx: null,
  busy: null,
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

// ---- storage -------------------------------------------------------------------------------

function load(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch {
    return fallback;
  }
}

function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    notice('This browser refused to store more (its storage is full): delete old conversations to keep new ones.');
    return false;
  }
}

function saveConvs() {
  if (state.convs.length > MAX_CONVERSATIONS) {
    state.convs.sort((a, b) => b.updated - a.updated);
    state.convs.length = MAX_CONVERSATIONS;
  }
  save(KEYS.convs, state.convs);
  save(KEYS.current, state.current);
}

function conv() {
  return state.convs.find((c) => c.id === state.current) || null;
}

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

// ---- the API -------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

let keyPrompt = null;

// Asks for the API key (once for every request waiting on it).
function askKey(wrong) {
  if (keyPrompt) return keyPrompt;
  const d = $('key-dialog');
  $('key-error').hidden = !wrong;
  $('key-error').textContent = wrong ? 'The server did not accept that key.' : '';
  $('api-key').value = '';
  keyPrompt = new Promise((resolve) => {
    d.addEventListener('close', function done() {
      d.removeEventListener('close', done);
      keyPrompt = null;
      const k = $('api-key').value.trim();
      if (k) {
        state.key = k;
        save(KEYS.key, k);
      }
      resolve(Boolean(k));
    });
  });
  if (!d.open) d.showModal();
  setTimeout(() => $('api-key').focus(), 0);
  return keyPrompt;
}

// fetch with the key; a 401 asks for the key and tries again (until the user gives none).
async function api(path, init = {}) {
  for (let tries = 0; ; tries++) {
    const headers = Object.assign({}, init.headers);
    if (state.key) headers.Authorization = 'Bearer ' + state.key;
    if (init.body) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, Object.assign({}, init, { headers }));
    if (res.status !== 401 || tries > 5) return res;
    if (!(await askKey(Boolean(state.key)))) return res;
  }
}

async function errorOf(res) {
  let detail = '';
  try {
    const body = await res.json();
    detail = (body && body.error && (body.error.message || body.error)) || '';
  } catch {
    // not JSON
  }
  if (typeof detail !== 'string') detail = JSON.stringify(detail);
  const retry = res.headers.get('Retry-After');
  const wait = retry ? ` Try again in ${retry} s.` : ' Try again in a moment.';
  switch (res.status) {
    case 401: return 'The server needs an API key (set one in the dialog, or reload).';
    case 429: return `The server is busy (429): it holds as many requests as it takes.${wait}${detail ? ` (${detail})` : ''}`;
    case 503: return `The server cannot answer now (503): the model is loading or the engine is stuck.${wait}${detail ? ` (${detail})` : ''}`;
    case 400: return `The server refused the request (400): ${detail || 'bad request'}`;
    default: return `The server answered ${res.status}${detail ? `: ${detail}` : ''}`;
  }
}

async function loadModels() {
  try {
    const res = await api('v1/models');
    if (!res.ok) throw new ApiError(await errorOf(res), res.status);
    const body = await res.json();
    state.models = (body.data || []).map((m) => ({ id: String(m.id), status: m.status && m.status.value }));
  } catch (e) {
    notice(e instanceof ApiError ? e.message : 'Cannot reach the server: ' + e.message);
    return;
  }
  const sel = $('model');
  // A server in router mode (--models-dir) says which models are loaded; the others load on
  // their first request.
  const label = (m) => (m.status && m.status !== 'loaded' ? `${m.id} (${m.status === 'failed' ? 'failed to load' : 'loads on first use'})` : m.id);
  sel.replaceChildren(...state.models.map((m) => el('option', { value: m.id, text: label(m) })));
  if (state.models.some((m) => m.id === state.settings.model)) sel.value = state.settings.model;
  await loadProps();
}

// The chosen model's context length and defaults (/props; in router mode only once it is
// loaded, so that opening the page loads nothing).
async function loadProps() {
  const m = state.models.find((x) => x.id === $('model').value);
  if (!m || (m.status && m.status !== 'loaded')) {
    state.ctx = null;
    renderContext();
    return;
  }
  try {
    const res = await api('props' + (m.status ? '?model=' + encodeURIComponent(m.id) : ''));
    if (res.ok) {
      const p = await res.json();
      state.ctx = Number(p.context_length) || null;
      const d = p.default_generation_settings || {};
      const show = (v) => String(Number(Number(v).toPrecision(4)));
      if (d.temperature !== undefined) $('temperature').placeholder = `server default (${show(d.temperature)})`;
      if (d.top_p !== undefined) $('top-p').placeholder = `server default (${show(d.top_p)})`;
    }
  } catch {
    // /props is optional for the page
  }
  renderContext();
}

// ---- markdown to DOM (text nodes only) --------------------------------------------------------

const SAFE_URL = /^(https?:|mailto:)/i;

function inline(text, parent, depth = 0) {
  const re = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([\s\S]+?)\*\*|__([\s\S]+?)__|\*(?!\s)([^*]+?)\*|(?<![\w])_(?!\s)([^_]+?)_(?![\w])|\[([^\]\n]+)\]\(([^()\s]+)\)|(https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"])/g;
  let last = 0;
  for (const m of text.matchAll(re)) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[1]) {
      parent.append(el('code', { text: m[2].replace(/^ (.*) $/, '$1') }));
    } else if ((m[3] || m[4]) && depth < 4) {
      const b = el('strong');
      inline(m[3] || m[4], b, depth + 1);
      parent.append(b);
    } else if ((m[5] || m[6]) && depth < 4) {
      const i = el('em');
      inline(m[5] || m[6], i, depth + 1);
      parent.append(i);
    } else if (m[7] && SAFE_URL.test(m[8])) {
      const a = el('a', { href: m[8], target: '_blank', rel: 'noopener noreferrer nofollow' });
      inline(m[7], a, depth + 1);
      parent.append(a);
    } else if (m[9]) {
      parent.append(el('a', { href: m[9], target: '_blank', rel: 'noopener noreferrer nofollow', text: m[9] }));
    } else {
      parent.append(m[0]);
    }
  }
  if (last < text.length) parent.append(text.slice(last));
}

function inlineLines(lines, parent) {
  lines.forEach((l, i) => {
    if (i > 0) parent.append(el('br'));
    inline(l, parent);
  });
}

function codeBlock(lang, body) {
  const code = el('code', { text: body });
  const copy = el('button', { type: 'button', text: 'Copy', title: 'Copy the code' });
  copy.addEventListener('click', () => copyText(body, copy));
  return el('pre', {}, el('div', { class: 'code-head' }, el('span', { text: lang || 'code' }), copy), code);
}

function markdown(src, parent, depth = 0) {
  const lines = src.replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  // One pattern both recognises a list item and splits it ([\s\S]: any character, line
  // separators included), so every line the list loop starts on is consumed.
  const ITEM = /^\s{0,3}([-*+]|\d{1,9}[.)])\s+([\s\S]*)$/;
  const isList = (l) => ITEM.test(l);
  const special = (l) => /^\s{0,3}(```|~~~|#{1,6}\s|>)/.test(l) || isList(l) || /^\s{0,3}([-*_])(\s*\1){2,}\s*$/.test(l);
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s{0,3}(`{3,}|~{3,})\s*([^\s`]*)/);
    if (fence) {
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i++; // the closing fence (an answer still streaming may not have one yet)
      parent.append(codeBlock(fence[2], body.join('\n')));
      continue;
    }
    const h = line.match(/^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/);
    if (h) {
      const e = el('h' + h[1].length);
      inline(h[2], e);
      parent.append(e);
      i++;
      continue;
    }
    if (/^\s{0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) {
      parent.append(el('hr'));
      i++;
      continue;
    }
    if (/^\s{0,3}>/.test(line) && depth < 4) {
      const body = [];
      while (i < lines.length && /^\s{0,3}>/.test(lines[i])) body.push(lines[i++].replace(/^\s{0,3}>\s?/, ''));
      const q = el('blockquote');
      markdown(body.join('\n'), q, depth + 1);
      parent.append(q);
      continue;
    }
    if (isList(line)) {
      const ordered = /^\s*\d/.test(line);
      const list = el(ordered ? 'ol' : 'ul');
      const start = line.match(/^\s*(\d+)/);
      if (ordered && start && start[1] !== '1') list.setAttribute('start', String(Number(start[1])));
      let item = null;
      const from = i;
      while (i < lines.length) {
        const l = lines[i];
        const m = l.match(ITEM);
        if (m && /^\s*\d/.test(l) === ordered) {
          item = [m[2]];
          list.append(el('li'));
          list.lastChild.item = item;
        } else if (item && l.trim() && /^\s+/.test(l) && !/^\s{0,3}(```|~~~)/.test(l)) {
          item.push(l.trim());
        } else {
          break;
        }
        i++;
      }
      if (i === from) i++; // never: the first line is an item; but never loop on one either
      for (const li of list.children) inlineLines(li.item, li);
      parent.append(list);
      continue;
    }
    if (!line.trim()) {
      i++;
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() && (para.length === 0 || !special(lines[i]))) para.push(lines[i++]);
    const p = el('p');
    inlineLines(para, p);
    parent.append(p);
  }
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    if (button) {
      const was = button.textContent;
      button.textContent = 'Copied';
      setTimeout(() => (button.textContent = was), 1200);
    }
  } catch {
    notice('The browser did not allow copying to the clipboard.');
  }
}

// ---- rendering -----------------------------------------------------------------------------

function notice(text) {
  const n = $('notice');
  n.hidden = !text;
  n.textContent = text || '';
  n.className = text ? 'error' : '';
}

// A model that writes its reasoning inline (<think>…</think>) when the server did not split it.
function splitThink(m) {
  const c = m.content || '';
  const open = c.match(/^\s*<think>/);
  if (!open) return { reasoning: m.reasoning || '', content: c };
  const end = c.indexOf('</think>');
  if (end < 0) return { reasoning: (m.reasoning || '') + c.slice(open[0].length), content: '' };
  return { reasoning: (m.reasoning || '') + c.slice(open[0].length, end), content: c.slice(end + 8).replace(/^\s+/, '') };
}

function renderSidebar() {
  const nav = $('conversations');
  const list = [...state.convs].sort((a, b) => b.updated - a.updated);
  nav.replaceChildren(
    ...list.map((c) => {
      const a = el('a', { href: '#' + c.id, text: c.title || 'New chat', 'data-testid': 'conversation', title: c.title });
      a.addEventListener('click', (e) => {
        e.preventDefault();
        select(c.id);
        $('sidebar').classList.remove('open');
      });
      const del = el('button', { type: 'button', text: '\u00d7', 'aria-label': 'Delete ' + (c.title || 'chat'), title: 'Delete' });
      del.addEventListener('click', () => remove(c.id));
      return el('div', { class: 'conv' + (c.id === state.current ? ' current' : '') }, a, del);
    }),
  );
}

function statsText(s) {
  if (!s) return '';
  const parts = [];
  if (s.completion !== undefined) parts.push(`${s.completion} tokens`);
  if (s.tps) parts.push(`${s.approx ? '\u2248' : ''}${s.tps.toFixed(1)} tokens/s`);
  if (s.cached) parts.push(`${s.cached} prompt tokens cached`);
  return parts.join(' \u00b7 ');
}

function renderContext() {
  const c = conv();
  let used = 0;
  if (c) for (const m of c.messages) if (m.stats && m.stats.total) used = m.stats.total;
  $('context').textContent = state.ctx ? `context ${used.toLocaleString()} / ${state.ctx.toLocaleString()}` : '';
}

function messageNode(c, m, index) {
  if (m.role === 'user') {
    const text = el('div', { class: 'text', text: m.content });
    const edit = el('button', { type: 'button', text: 'Edit', title: 'Edit and send again' });
    const node = el('div', { class: 'msg user', 'data-testid': 'user-message' }, text, el('div', { class: 'actions' }, edit));
    edit.addEventListener('click', () => editMessage(c, index, node));
    return node;
  }
  const node = el('div', { class: 'msg assistant', 'data-testid': 'assistant-message' });
  fillAssistant(node, c, m, index);
  return node;
}

function fillAssistant(node, c, m, index) {
  const { reasoning, content } = splitThink(m);
  node.replaceChildren();
  node.dataset.done = m.done ? 'true' : 'false';
  if (m.done) node.dataset.raw = m.content || '';
  if (reasoning) {
    const body = el('div', { class: 'md' });
    markdown(reasoning, body);
    const words = reasoning.trim().split(/\s+/).length;
    const d = el('details', { class: 'reasoning' }, el('summary', { text: m.done || content ? `Reasoning (${words} words)` : 'Reasoning\u2026' }), body);
    node.append(d);
  }
  const body = el('div', { class: 'md body' + (m.done ? '' : ' cursor') });
  markdown(content, body);
  node.append(body);
  for (const t of m.tool_calls || []) {
    let args = t.arguments || '';
    try {
      args = JSON.stringify(JSON.parse(args), null, 2);
    } catch {
      // still streaming, or not JSON: as written
    }
    node.append(el('div', { class: 'tool-call', 'data-testid': 'tool-call' }, el('span', { text: 'Tool call ' }), el('span', { class: 'name', text: t.name || '?' }), el('pre', { text: args })));
  }
  if (m.stopped) node.append(el('div', { class: 'stopped', text: 'Stopped.' }));
  if (m.error) node.append(el('div', { class: 'error', 'data-testid': 'error', role: 'alert', text: m.error }));
  if (m.done) {
    const actions = el('div', { class: 'actions' }, el('span', { class: 'stats', text: statsText(m.stats) }));
    const copy = el('button', { type: 'button', text: 'Copy', title: 'Copy the answer' });
    copy.addEventListener('click', () => copyText(m.content || '', copy));
    actions.append(copy);
    if (index === c.messages.length - 1) {
      const again = el('button', { type: 'button', text: 'Regenerate', 'data-testid': 'regenerate', title: 'Answer again' });
      again.addEventListener('click', () => regenerate());
      actions.append(again);
    }
    node.append(actions);
  }
}

function renderLog() {
  const log = $('log');
  const c = conv();
  if (!c || c.messages.length === 0) {
    log.replaceChildren(el('p', { class: 'empty', text: 'Ask anything. The answer streams from this server\u2019s model.' }));
  } else {
    log.replaceChildren(...c.messages.map((m, i) => messageNode(c, m, i)));
  }
  renderContext();
  log.scrollTop = log.scrollHeight;
}

function render() {
  renderSidebar();
  renderLog();
  setBusy(Boolean(state.busy));
}

function setBusy(busy) {
  $('send').hidden = busy;
  $('stop').hidden = !busy;
}

// ---- conversations -------------------------------------------------------------------------

function select(id) {
  state.current = id;
  save(KEYS.current, id);
  render();
  $('prompt').focus();
}

function newChat() {
  if (state.busy) stop();
  state.current = null;
  save(KEYS.current, null);
  render();
  $('prompt').focus();
}

function remove(id) {
  const c = state.convs.find((x) => x.id === id);
  if (!c || !confirm(`Delete \u201c${c.title || 'New chat'}\u201d?`)) return;
  if (state.busy && state.busy.conv === c) stop();
  state.convs = state.convs.filter((x) => x.id !== id);
  if (state.current === id) state.current = null;
  saveConvs();
  render();
}

function editMessage(c, index, node) {
  if (state.busy) return;
  const m = c.messages[index];
  const box = el('textarea', { 'aria-label': 'Edit the message' });
  box.value = m.content;
  const ok = el('button', { type: 'button', text: 'Send' });
  const cancel = el('button', { type: 'button', text: 'Cancel' });
  node.replaceChildren(box, el('div', { class: 'actions' }, cancel, ok));
  box.focus();
  cancel.addEventListener('click', () => renderLog());
  const commit = () => {
    const text = box.value.trim();
    if (!text) return;
    m.content = text;
    c.messages.length = index + 1;
    c.updated = Date.now();
    saveConvs();
    renderLog();
    generate(c);
  };
  ok.addEventListener('click', commit);
  box.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      commit();
    } else if (e.key === 'Escape') {
      renderLog();
    }
  });
}

function regenerate() {
  const c = conv();
  if (!c || state.busy) return;
  while (c.messages.length && c.messages[c.messages.length - 1].role === 'assistant') c.messages.pop();
  if (!c.messages.length) return;
  generate(c);
}

// ---- generation ----------------------------------------------------------------------------

function number(v, int) {
  const s = String(v).trim();
  if (!s) return undefined;
  const n = int ? parseInt(s, 10) : parseFloat(s);
  return Number.isFinite(n) ? n : undefined;
}

function requestBody(c) {
  const messages = [];
  if (state.settings.system.trim()) messages.push({ role: 'system', content: state.settings.system });
  for (const m of c.messages) {
    if (m.role === 'user') messages.push({ role: 'user', content: m.content });
    else if (m.role === 'assistant' && (m.content || (m.tool_calls || []).length)) {
      const a = { role: 'assistant', content: m.content || '' };
      if ((m.tool_calls || []).length) {
        a.tool_calls = m.tool_calls.map((t, i) => ({ id: t.id || `call_${i}`, type: 'function', function: { name: t.name || '', arguments: t.arguments || '' } }));
      }
      messages.push(a);
    }
  }
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  if ($('model').value) body.model = $('model').value;
  const t = number(state.settings.temperature);
  const p = number(state.settings.top_p);
  const n = number(state.settings.max_tokens, true);
  if (t !== undefined) body.temperature = t;
  if (p !== undefined) body.top_p = p;
  if (n !== undefined) body.max_tokens = n;
  return body;
}

// The events of a server-sent-event stream, one `data:` payload at a time.
async function* events(res) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, '');
      const data = block
        .split(/\r?\n/)
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, ''))
        .join('\n');
      if (data) yield data;
    }
  }
}

async function generate(c) {
  const m = { role: 'assistant', content: '', reasoning: '', tool_calls: [], done: false };
  c.messages.push(m);
  c.updated = Date.now();
  const index = c.messages.length - 1;
  const controller = new AbortController();
  state.busy = { controller, conv: c, msg: m };
  renderSidebar();
  renderLog();
  setBusy(true);
  const log = $('log');
  let pending = false;
  const paint = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      // Looked up each time: switching chats and back rebuilds the log.
      const node = log.lastElementChild;
      if (state.current !== c.id || !node) return;
      const stick = log.scrollHeight - log.scrollTop - log.clientHeight < 80;
      fillAssistant(node, c, m, index);
      if (stick) log.scrollTop = log.scrollHeight;
    });
  };
  const t0 = performance.now();
  let first = null;
  let pieces = 0;
  let finished = false;
  let usage = null;
  try {
    const res = await api('v1/chat/completions', { method: 'POST', body: JSON.stringify(requestBody(c)), signal: controller.signal });
    if (!res.ok) {
      m.error = await errorOf(res);
    } else {
      for await (const data of events(res)) {
        if (data === '[DONE]') {
          finished = true;
          break;
        }
        let ev;
        try {
          ev = JSON.parse(data);
        } catch {
          continue;
        }
        if (ev.error) {
          m.error = 'The server stopped the answer: ' + (ev.error.message || JSON.stringify(ev.error));
          finished = true;
          break;
        }
        if (ev.usage) usage = ev.usage;
        const d = ev.choices && ev.choices[0] && ev.choices[0].delta;
        if (!d) continue;
        if (first === null && (d.content || d.reasoning_content || d.tool_calls)) first = performance.now();
        if (d.content) m.content += d.content;
        if (d.reasoning_content) m.reasoning += d.reasoning_content;
        for (const t of d.tool_calls || []) {
          const at = Number.isInteger(t.index) ? t.index : m.tool_calls.length;
          const slot = (m.tool_calls[at] = m.tool_calls[at] || { id: '', name: '', arguments: '' });
          if (t.id) slot.id = t.id;
          if (t.function && t.function.name) slot.name += t.function.name;
          if (t.function && t.function.arguments) slot.arguments += t.function.arguments;
        }
        pieces++;
        paint();
      }
      if (!finished && !m.error) {
        m.error = m.content ? 'The connection dropped mid-answer; the part received is kept.' : 'The connection dropped before an answer came.';
      }
    }
  } catch (e) {
    if (e && e.name === 'AbortError') m.stopped = true;
    else m.error = (m.content ? 'The connection dropped mid-answer; the part received is kept. ' : 'Cannot reach the server. ') + (e && e.message ? `(${e.message})` : '');
  }
  const t1 = performance.now();
  const secs = first === null ? 0 : (t1 - first) / 1000;
  const completion = usage ? usage.completion_tokens : pieces;
  m.stats = {
    completion,
    approx: !usage,
    tps: secs > 0 && completion > 1 ? (completion - 1) / secs : 0,
    cached: usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0,
    total: usage ? usage.total_tokens : undefined,
    ms: Math.round(t1 - t0),
  };
  m.tool_calls = m.tool_calls.filter(Boolean);
  m.done = true;
  state.busy = null;
  c.updated = Date.now();
  saveConvs();
  setBusy(false);
  if (state.current === c.id) renderLog();
  const chosen = state.models.find((x) => x.id === $('model').value);
  if (chosen && chosen.status && chosen.status !== 'loaded' && !m.error) loadModels();
}

function stop() {
  if (state.busy) state.busy.controller.abort();
}

function send(text) {
  if (state.busy || !text.trim()) return;
  let c = conv();
  if (!c) {
    c = { id: newId(), title: '', created: Date.now(), updated: Date.now(), messages: [] };
    state.convs.push(c);
    state.current = c.id;
  }
  if (!c.title) c.title = text.trim().replace(/\s+/g, ' ').slice(0, 60);
  c.messages.push({ role: 'user', content: text });
  saveConvs();
  generate(c);
}

// ---- wiring --------------------------------------------------------------------------------

function growPrompt() {
  const p = $('prompt');
  p.style.height = 'auto';
  p.style.height = Math.min(p.scrollHeight + 2, window.innerHeight * 0.4) + 'px';
}

function bindSettings() {
  const fields = { 'system-prompt': 'system', temperature: 'temperature', 'top-p': 'top_p', 'max-tokens': 'max_tokens' };
  for (const [id, key] of Object.entries(fields)) {
    const f = $(id);
    f.value = state.settings[key] || '';
    f.addEventListener('input', () => {
      state.settings[key] = f.value;
      save(KEYS.settings, state.settings);
    });
  }
  $('model').addEventListener('change', () => {
    state.settings.model = $('model').value;
    save(KEYS.settings, state.settings);
    loadProps();
  });
  $('settings-button').addEventListener('click', () => {
    const s = $('settings');
    s.hidden = !s.hidden;
    $('settings-button').setAttribute('aria-expanded', String(!s.hidden));
  });
  $('forget-key').addEventListener('click', () => {
    state.key = '';
    try {
      localStorage.removeItem(KEYS.key);
    } catch {
      // nothing stored
    }
    $('settings-note').textContent = 'Forgotten: the page will ask again when the server wants it.';
  });
}

function start() {
  state.convs = load(KEYS.convs, []).filter((c) => c && typeof c.id === 'string' && Array.isArray(c.messages));
  // An answer interrupted by a reload is complete as far as it got.
  for (const c of state.convs) for (const m of c.messages) if (m.role === 'assistant' && !m.done) {
    m.done = true;
    m.stopped = true;
  }
  state.current = load(KEYS.current, null);
  if (!conv()) state.current = null;
  state.settings = Object.assign(state.settings, load(KEYS.settings, {}));
  state.key = load(KEYS.key, '') || '';
  bindSettings();
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const p = $('prompt');
    const text = p.value;
    if (!text.trim() || state.busy) return;
    p.value = '';
    growPrompt();
    send(text);
  });
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('prompt').addEventListener('input', growPrompt);
  $('stop').addEventListener('click', stop);
  $('new-chat').addEventListener('click', newChat);
  $('menu').addEventListener('click', () => {
    const open = $('sidebar').classList.toggle('open');
    $('menu').setAttribute('aria-expanded', String(open));
  });
  // On a phone the list slides over the page: a tap beside it closes it.
  document.addEventListener('click', (e) => {
    const side = $('sidebar');
    if (side.classList.contains('open') && !side.contains(e.target) && !$('menu').contains(e.target)) {
      side.classList.remove('open');
      $('menu').setAttribute('aria-expanded', 'false');
    }
  });
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && state.busy) {
      e.preventDefault();
      stop();
    } else if ((e.ctrlKey || e.metaKey) && e.shiftKey && e.key.toLowerCase() === 'o') {
      e.preventDefault();
      newChat();
    } else if (e.key === '/' && !/^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName)) {
      e.preventDefault();
      $('prompt').focus();
    }
  });
  window.addEventListener('storage', (e) => {
    if (e.key === KEYS.convs && !state.busy) {
      state.convs = load(KEYS.convs, []);
      render();
    }
  });
  render();
  loadModels();
  $('prompt').focus();
}

document.addEventListener('DOMContentLoaded', start);
