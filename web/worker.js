// kiln's engine in a Web Worker, so the page stays responsive while it loads and writes.
//
// Messages from the page:
//   {type: 'load', url | file, backend: 'auto' | 'webgpu' | 'cpu', ctx}
//   {type: 'chat', id, messages: [{role, content}], params: {max_tokens, temperature, ...}}
//   {type: 'stop'}                      ends the reply being written
//   {type: 'forget', url}               drops a cached download
// Messages to the page:
//   {type: 'progress', phase: 'download' | 'load', done, total}
//   {type: 'loaded', info, backend, cached, fetch_ms, load_ms}
//   {type: 'piece', id, text}            {type: 'done', id, stats}
//   {type: 'error', id?, message}        {type: 'fatal', message}: the engine must restart
//   {type: 'note', message}              said on the page, nothing failed
//
// Weights never pass through the wasm heap whole: a model from a URL is downloaded into the
// Origin Private File System (kept there, so a reload does not fetch it again) and read
// through a synchronous access handle one tensor at a time; a picked file is read the same
// way through FileReaderSync.
import init, { Model } from './pkg/kiln_web.js';

const ready = init();
// How kiln-web's message begins when the GPU lacks an op the model needs (session::UNSUPPORTED).
const UNSUPPORTED = "this browser's WebGPU adapter cannot run";
let model = null;
let source = null;
let stopping = false;
let replying = false;

const post = (m) => self.postMessage(m);

// The engine's panic hook calls this before the module aborts.
globalThis.kilnPanicked = (message) => post({ type: 'fatal', message });

self.onmessage = async (e) => {
  const m = e.data || {};
  try {
    if (m.type === 'load') await load(m);
    else if (m.type === 'chat') await chat(m);
    else if (m.type === 'stop') stopping = true;
    else if (m.type === 'forget') await forget(m.url);
  } catch (err) {
    const message = describe(err);
    if (err instanceof WebAssembly.RuntimeError) post({ type: 'fatal', message });
    else post({ type: 'error', id: m.id, message });
  }
};

function describe(err) {
  if (typeof err === 'string') return err;
  if (err && err.name === 'QuotaExceededError') {
    return 'not enough storage for the model in this browser (the Origin Private File System is full)';
  }
  if (err instanceof WebAssembly.RuntimeError) {
    return `the engine stopped (${err.message}): the model or its context may not fit this device's memory`;
  }
  return (err && err.message) || String(err);
}

// At most one progress message per 100 ms.
let lastProgress = 0;
function progress(phase, done, total, force) {
  const now = performance.now();
  if (!force && now - lastProgress < 100) return;
  lastProgress = now;
  post({ type: 'progress', phase, done, total });
}

async function load(m) {
  await ready;
  if (replying) throw new Error('a reply is being written: stop it before loading a model');
  if (model) { model.free(); model = null; }
  if (source) { source.close(); source = null; }
  const t0 = performance.now();
  const src = m.file ? pickedFile(m.file) : await fromUrl(m.url);
  source = src;
  const t1 = performance.now();
  let done = 0;
  const read = (offset, length) => {
    const bytes = src.read(offset, length);
    done += length;
    progress('load', Math.min(done, src.size), src.size, false);
    return bytes;
  };
  const auto = m.backend === 'auto' || !m.backend;
  let backend = auto ? await pickBackend() : m.backend;
  const options = () => JSON.stringify({ backend, ctx: m.ctx || undefined });
  try {
    try {
      model = await Model.load(read, src.size, src.name, options());
    } catch (e) {
      // Left to choose, a GPU that lacks one of the model's ops gives way to the CPU.
      if (!(auto && backend === 'webgpu' && String(e).startsWith(UNSUPPORTED))) throw e;
      post({ type: 'note', message: `${e}: running on the CPU instead` });
      backend = 'cpu';
      model = await Model.load(read, src.size, src.name, options());
    }
  } catch (e) {
    src.close();
    source = null;
    throw e;
  }
  progress('load', src.size, src.size, true);
  const t2 = performance.now();
  post({ type: 'loaded', info: JSON.parse(model.info()), backend, cached: src.cached, fetch_ms: t1 - t0, load_ms: t2 - t1 });
}

// 'auto': WebGPU on a hardware adapter; the CPU reference where there is none or only a
// software one (a software rasterizer is slower than the CPU reference on the same cores:
// see README, "In the browser"), as native kiln's --backend auto passes over lavapipe.
async function pickBackend() {
  try {
    const a = navigator.gpu && await navigator.gpu.requestAdapter();
    if (!a) return 'cpu';
    const software = (a.info && a.info.isFallbackAdapter) || a.isFallbackAdapter;
    return software ? 'cpu' : 'webgpu';
  } catch {
    return 'cpu';
  }
}

async function chat(m) {
  if (!model) throw new Error('no model is loaded');
  if (replying) throw new Error('a reply is already being written');
  replying = true;
  stopping = false;
  try {
    const stats = await model.chat(JSON.stringify(m.messages), JSON.stringify(m.params || {}), (text) => {
      if (text) post({ type: 'piece', id: m.id, text });
      return !stopping;
    });
    post({ type: 'done', id: m.id, stats: JSON.parse(stats) });
  } finally {
    replying = false;
  }
}

// A file the user picked, read synchronously (workers have FileReaderSync).
function pickedFile(file) {
  const reader = new FileReaderSync();
  return {
    name: file.name,
    size: file.size,
    cached: false,
    read: (offset, length) => new Uint8Array(reader.readAsArrayBuffer(file.slice(offset, offset + length))),
    close() {},
  };
}

async function cacheDir() {
  try {
    const root = await navigator.storage.getDirectory();
    return await root.getDirectoryHandle('kiln-models', { create: true });
  } catch {
    return null;
  }
}

async function keyOf(url) {
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(url));
  return Array.from(new Uint8Array(digest).slice(0, 16), (b) => b.toString(16).padStart(2, '0')).join('');
}

async function readMeta(dir, key) {
  try {
    const f = await (await dir.getFileHandle(key + '.json')).getFile();
    return JSON.parse(await f.text());
  } catch {
    return null;
  }
}

async function writeMeta(dir, key, meta) {
  const h = await (await dir.getFileHandle(key + '.json', { create: true })).createSyncAccessHandle();
  try {
    const bytes = new TextEncoder().encode(JSON.stringify(meta));
    h.truncate(0);
    h.write(bytes, { at: 0 });
    h.flush();
  } finally {
    h.close();
  }
}

function handleSource(name, h, cached) {
  return {
    name,
    size: h.getSize(),
    cached,
    read(offset, length) {
      const b = new Uint8Array(length);
      let n = 0;
      while (n < length) {
        const r = h.read(b.subarray(n), { at: offset + n });
        if (r <= 0) throw new Error(`the cached model file ended at ${offset + n} bytes`);
        n += r;
      }
      return b;
    },
    close() { h.close(); },
  };
}

// A model from a URL: from the cache when a complete download of it is there, else fetched
// (with progress) into the cache first.
async function fromUrl(url) {
  const abs = new URL(url, self.location.href).href;
  const last = new URL(abs).pathname.split('/').pop() || abs;
  let name = last;
  try { name = decodeURIComponent(last); } catch { /* keep it as written */ }
  const dir = await cacheDir();
  if (!dir) return inMemory(name, abs);
  const key = await keyOf(abs);
  const meta = await readMeta(dir, key);
  const h = await (await dir.getFileHandle(key + '.gguf', { create: true })).createSyncAccessHandle();
  if (meta && meta.complete && meta.url === abs && h.getSize() === meta.size) {
    return handleSource(name, h, true);
  }
  try {
    const resp = await fetch(abs);
    if (!resp.ok) throw new Error(`${abs}: HTTP ${resp.status} ${resp.statusText}`);
    const total = resp.headers.get('content-encoding') ? 0 : Number(resp.headers.get('content-length')) || 0;
    h.truncate(0);
    const reader = resp.body.getReader();
    let at = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      let w = 0;
      while (w < value.length) {
        const n = h.write(value.subarray(w), { at: at + w });
        if (n <= 0) throw new Error('the browser would not write the model into its storage');
        w += n;
      }
      at += value.length;
      progress('download', at, total, false);
    }
    if (total && at !== total) throw new Error(`the download of ${abs} ended after ${at} of ${total} bytes`);
    h.flush();
    progress('download', at, at, true);
    // Only a GGUF file is kept (a server's error page can come with a 200).
    const magic = new Uint8Array(4);
    h.read(magic, { at: 0 });
    if (new TextDecoder().decode(magic) !== 'GGUF') {
      throw new Error(`${abs} is not a GGUF file (it starts with ${JSON.stringify(new TextDecoder().decode(magic))})`);
    }
    await writeMeta(dir, key, { url: abs, size: at, complete: true, saved: Date.now() });
    return handleSource(name, h, false);
  } catch (e) {
    h.close();
    try { await dir.removeEntry(key + '.gguf'); } catch { /* already gone */ }
    throw e;
  }
}

// Without the Origin Private File System (some private windows): the download is held in
// JavaScript memory (not the wasm heap) and not kept.
async function inMemory(name, abs) {
  const resp = await fetch(abs);
  if (!resp.ok) throw new Error(`${abs}: HTTP ${resp.status} ${resp.statusText}`);
  const buf = new Uint8Array(await resp.arrayBuffer());
  return {
    name,
    size: buf.length,
    cached: false,
    read: (offset, length) => buf.slice(offset, offset + length),
    close() {},
  };
}

async function forget(url) {
  const dir = await cacheDir();
  if (!dir) return;
  const key = await keyOf(new URL(url, self.location.href).href);
  for (const f of [key + '.gguf', key + '.json']) {
    try { await dir.removeEntry(f); } catch { /* not cached */ }
  }
  post({ type: 'forgotten', url });
}
