// A small static server for kiln's browser page in tests and benchmarks: serves a folder, and
// one model file at /models/model.gguf. Counts the model's downloads.
'use strict';

const fs = require('fs');
const http = require('http');
const path = require('path');

const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.css': 'text/css',
  '.svg': 'image/svg+xml', '.wasm': 'application/wasm', '.gguf': 'application/octet-stream',
  '.json': 'application/json',
};

// Resolves to {server, base, modelFetches()}.
function serve(dir, model) {
  const root = path.resolve(dir);
  let fetches = 0;
  const server = http.createServer((req, res) => {
    let file;
    let p;
    try {
      p = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    } catch {
      res.writeHead(400); res.end(); return;
    }
    if (p === '/models/model.gguf') {
      file = model;
      fetches += 1;
    } else {
      file = path.join(root, p === '/' ? 'index.html' : p);
      if (!file.startsWith(root + path.sep)) { res.writeHead(403); res.end(); return; }
    }
    fs.stat(file, (err, st) => {
      if (err || !st.isFile()) { res.writeHead(404); res.end('not found'); return; }
      res.writeHead(200, {
        'Content-Type': TYPES[path.extname(file)] || 'application/octet-stream',
        'Content-Length': st.size,
        'Cache-Control': 'no-store',
      });
      if (req.method === 'HEAD') { res.end(); return; }
      fs.createReadStream(file).pipe(res);
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
    server,
    base: `http://127.0.0.1:${server.address().port}/`,
    modelFetches: () => fetches,
  })));
}

// Chromium with WebGPU on (SwiftShader where there is no GPU), in a fresh profile.
async function launch(chromium, executablePath, profile) {
  return chromium.launchPersistentContext(profile, {
    executablePath,
    headless: true,
    viewport: { width: 1100, height: 760 },
    args: ['--no-sandbox', '--disable-gpu-sandbox', '--enable-unsafe-webgpu',
      '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
  });
}

module.exports = { serve, launch };
