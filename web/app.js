// kiln's browser page: the model runs in a Web Worker (worker.js); this script is the chat.
//
// The address can carry the work, so a link can be shared and a test can drive the page:
//   ?model=URL            loads that model at once
//   &prompt=TEXT          then sends TEXT as the first message
//   &max_tokens=N &temperature=T &backend=auto|webgpu|cpu &ctx=N
// The reply being written is the element #output (its text only); it gets data-done="true"
// when finished, with data-error holding the message on a failure.

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);

let worker = null;
let loaded = null;         // the loaded model's info
let busy = false;          // a load or a reply is running
let messages = [];         // the conversation
let reply = null;          // {id, el, text}
let nextId = 1;
let lastLoad = null;       // what the last load asked for

function numberParam(name, lo, hi) {
  const v = params.get(name);
  if (v === null || v === '') return null;
  const n = Number(v);
  return Number.isFinite(n) ? Math.min(hi, Math.max(lo, n)) : null;
}

function setup() {
  if (params.get('model')) $('model-url').value = params.get('model');
  const temp = numberParam('temperature', 0, 2);
  if (temp !== null) $('temperature').value = String(temp);
  const max = numberParam('max_tokens', 1, 32768);
  if (max !== null) $('max-tokens').value = String(Math.round(max));
  const ctx = numberParam('ctx', 64, 131072);
  if (ctx !== null) $('ctx').value = String(Math.round(ctx));
  if (!('gpu' in navigator)) {
    $('backend').value = 'cpu';
    $('device').textContent = 'no WebGPU in this browser: the CPU reference runs instead';
  }
  if (['auto', 'webgpu', 'cpu'].includes(params.get('backend'))) $('backend').value = params.get('backend');

  $('load-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const url = $('model-url').value.trim();
    if (url) load({ url });
  });
  $('model-file').addEventListener('change', () => {
    const f = $('model-file').files[0];
    if (f) load({ file: f });
  });
  $('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
    if (e.key === 'Escape') stop();
  });
  $('stop').addEventListener('click', stop);
  $('new-chat').addEventListener('click', () => { messages = []; $('messages').replaceChildren(); $('stats').textContent = ''; });
  $('forget').addEventListener('click', () => {
    const url = $('model-url').value.trim();
    if (url) ensureWorker().postMessage({ type: 'forget', url });
  });
  startWorker();
  if (params.get('model')) load({ url: params.get('model') }, params.get('prompt'));
}

// Messages from a worker that was replaced (after a fatal error) are ignored.
function startWorker() {
  const w = new Worker('worker.js', { type: 'module' });
  w.onmessage = (e) => { if (w === worker) onWorker(e.data); };
  w.onerror = (e) => { if (w === worker) fatal(e.message || 'the engine could not start'); };
  worker = w;
}

function ensureWorker() {
  if (!worker) startWorker();
  return worker;
}

function showError(message) {
  $('error').textContent = message;
  $('error').hidden = !message;
}

function setBusy(b) {
  busy = b;
  const ready = !!loaded && !b;
  $('prompt').disabled = !loaded;
  $('send').disabled = !ready;
  $('stop').disabled = !(b && reply);
  $('new-chat').disabled = !ready;
  $('load').disabled = b;
  $('model-file').disabled = b;
  $('forget').disabled = b;
}

// The engine stopped for good (a panic, a lost device, out of memory): say so; the next load
// starts a fresh worker, so another model or a shorter context can be tried.
function fatal(message) {
  const msg = `${message}\nThe engine stopped: load the model again, or a smaller model or a shorter context.`;
  if (reply) finishReply({ error: message });
  showError(msg);
  $('progress').hidden = true;
  if (worker) worker.terminate();
  worker = null;
  loaded = null;
  $('device').textContent = '';
  setBusy(false);
}

function load(what, then) {
  if (busy) return;
  showError('');
  loaded = null;
  const ctx = Number($('ctx').value) || undefined;
  lastLoad = { ...what, backend: $('backend').value, ctx };
  $('status').textContent = `Loading ${what.file ? what.file.name : what.url}…`;
  $('progress').hidden = false;
  $('progress-bar').value = 0;
  setBusy(true);
  pendingPrompt = then || null;
  loadId = nextId++;
  ensureWorker().postMessage({ type: 'load', id: loadId, ...lastLoad });
}

let loadId = 0;
let loadNote = null;       // what the worker said while loading

let pendingPrompt = null;

function fmtBytes(n) {
  if (n >= 1 << 30) return `${(n / (1 << 30)).toFixed(2)} GiB`;
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  return `${(n / 1024).toFixed(0)} KiB`;
}

function onWorker(m) {
  switch (m.type) {
    case 'progress': {
      const what = m.phase === 'download' ? 'Downloading' : 'Loading weights';
      $('progress-bar').value = m.total ? m.done / m.total : 0;
      $('progress-text').textContent = `${what}: ${fmtBytes(m.done)}${m.total ? ` of ${fmtBytes(m.total)}` : ''}`;
      break;
    }
    case 'loaded': {
      loaded = m.info;
      $('progress').hidden = true;
      const secs = (ms) => (ms / 1000).toFixed(1);
      const from = m.cached ? 'from the browser cache' : (lastLoad && lastLoad.file ? 'from the file' : `downloaded in ${secs(m.fetch_ms)} s`);
      const params = loaded.parameters >= 1e9 ? `${(loaded.parameters / 1e9).toFixed(2)} B` : `${(loaded.parameters / 1e6).toFixed(0)} M`;
      $('status').textContent = `${loaded.name}: ${loaded.architecture}, ${params} parameters, context ${loaded.context}; ${from}, loaded in ${secs(m.load_ms)} s.`;
      $('status').dataset.cached = String(!!m.cached);
      $('status').dataset.fetchMs = String(Math.round(m.fetch_ms));
      $('status').dataset.loadMs = String(Math.round(m.load_ms));
      $('device').textContent = loaded.device;
      if (m.backend === 'webgpu') describeAdapter().then((d) => { if (d && loaded) $('device').textContent = d; });
      if (!loaded.chat_template) $('status').textContent += ' This model has no chat template: each message is sent as a plain prompt.';
      if (loadNote) $('status').textContent += ` (${loadNote})`;
      loadNote = null;
      setBusy(false);
      $('prompt').focus();
      if (pendingPrompt) {
        $('prompt').value = pendingPrompt;
        pendingPrompt = null;
        send();
      }
      break;
    }
    case 'piece':
      if (reply && m.id === reply.id) {
        reply.text += m.text;
        reply.body.textContent = reply.text;
        $('messages').scrollTop = $('messages').scrollHeight;
      }
      break;
    case 'done':
      if (reply && m.id === reply.id) finishReply({ stats: m.stats });
      break;
    case 'error':
      if (reply && m.id === reply.id) finishReply({ error: m.message });
      else if (m.id === loadId && !loaded) {
        $('progress').hidden = true;
        $('status').textContent = '';
        setBusy(false);
      }
      showError(m.message);
      break;
    case 'fatal':
      fatal(m.message);
      break;
    case 'note':
      loadNote = m.message;
      $('status').textContent = m.message;
      break;
    case 'forgotten':
      $('status').textContent = `The cached download of ${m.url} is gone.`;
      break;
  }
}

// What the browser says of its WebGPU adapter (wgpu is not told its name).
async function describeAdapter() {
  try {
    const a = await navigator.gpu.requestAdapter();
    if (!a) return null;
    const i = a.info || {};
    const name = [i.vendor, i.architecture, i.description].filter(Boolean).join(' ') || 'unnamed adapter';
    const fallback = i.isFallbackAdapter || a.isFallbackAdapter;
    const f16 = a.features.has('shader-f16') ? 'f16' : 'no f16';
    return `WebGPU: ${name}${fallback ? ' (software)' : ''}, ${f16}`;
  } catch {
    return null;
  }
}

function addMessage(role, text) {
  const el = document.createElement('div');
  el.className = `msg ${role}`;
  const body = document.createElement('span');
  body.textContent = text;
  el.append(body);
  $('messages').append(el);
  $('messages').scrollTop = $('messages').scrollHeight;
  return { el, body };
}

function send() {
  const text = $('prompt').value.trim();
  if (!text || !loaded || busy) return;
  $('prompt').value = '';
  showError('');
  messages.push({ role: 'user', content: text });
  addMessage('user', text);
  const old = $('output');
  if (old) old.removeAttribute('id');
  const { el, body } = addMessage('assistant', '');
  body.id = 'output';
  body.dataset.done = 'false';
  el.dataset.done = 'false';
  reply = { id: nextId++, el, body, text: '' };
  setBusy(true);
  const p = {
    max_tokens: Math.max(1, Math.round(Number($('max-tokens').value) || 512)),
    temperature: Math.max(0, Number($('temperature').value) || 0),
  };
  ensureWorker().postMessage({ type: 'chat', id: reply.id, messages, params: p });
}

function stop() {
  if (reply && worker) worker.postMessage({ type: 'stop' });
}

function finishReply({ stats, error }) {
  const r = reply;
  reply = null;
  if (!r) return;
  if (error) {
    r.body.dataset.error = error;
    // The failed turn leaves the conversation (the next send must not repeat a role).
    if (messages.length && messages[messages.length - 1].role === 'user') messages.pop();
  } else {
    messages.push({ role: 'assistant', content: r.text });
    const note = document.createElement('span');
    note.className = 'note';
    const tps = (x) => x.toFixed(1);
    note.textContent = `${stats.completion_tokens} tokens, ${tps(stats.decode_tps)} tokens/s (prompt ${stats.prompt_tokens} tokens at ${tps(stats.prompt_tps)} tokens/s)${stats.finish_reason === 'cancelled' ? ', stopped' : ''}`;
    if (stats.cpu_ops && stats.cpu_ops.length) {
      note.textContent += `; on the CPU (the GPU lacks them): ${stats.cpu_ops.map((o) => `${o.op} ×${o.count}`).join(', ')}`;
    }
    r.el.append(note);
    r.body.dataset.finish = stats.finish_reason;
    r.body.dataset.decodeTps = String(stats.decode_tps);
    r.body.dataset.promptTps = String(stats.prompt_tps);
    r.body.dataset.tokens = String(stats.completion_tokens);
    r.body.dataset.promptTokens = String(stats.prompt_tokens);
    $('stats').textContent = note.textContent;
  }
  r.el.dataset.done = 'true';
  r.body.dataset.done = 'true';
  setBusy(false);
}

setup();
