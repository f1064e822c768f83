// One round of the browser benchmark for scripts/web-bench.sh: kiln's page in headless
// Chromium loads MODEL from a local server into a fresh profile (first load: a download into
// the browser's cache), writes a greedy reply of MAX_TOKENS tokens to PROMPT, then opens again
// (cached reload) and writes it again. Prints one JSON line.
//
// Environment: PLAYWRIGHT, CHROMIUM, WEB_DIR, MODEL, PROMPT, MAX_TOKENS, BACKEND (webgpu|cpu).
'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');
const { chromium } = require(process.env.PLAYWRIGHT);
const { serve, launch } = require('./static_server.cjs');

async function run(page, base) {
  const q = new URLSearchParams({
    model: '/models/model.gguf', prompt: process.env.PROMPT, max_tokens: process.env.MAX_TOKENS,
    temperature: '0', backend: process.env.BACKEND || 'webgpu',
  });
  await page.goto(`${base}?${q}`);
  await page.waitForFunction(() => {
    const o = document.getElementById('output');
    return (o && o.dataset.done === 'true') || !document.getElementById('error').hidden;
  }, null, { timeout: 600000 });
  return page.evaluate(() => {
    const o = document.getElementById('output');
    const s = document.getElementById('status');
    const err = document.getElementById('error');
    return {
      error: err.hidden ? null : err.textContent,
      cached: s.dataset.cached, fetchMs: Number(s.dataset.fetchMs), loadMs: Number(s.dataset.loadMs),
      tokens: o ? Number(o.dataset.tokens) : 0,
      promptTokens: o ? Number(o.dataset.promptTokens) : 0,
      decodeTps: o ? Number(o.dataset.decodeTps) : 0, promptTps: o ? Number(o.dataset.promptTps) : 0,
      device: document.getElementById('device').textContent,
    };
  });
}

async function main() {
  const { server, base } = await serve(process.env.WEB_DIR, process.env.MODEL);
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-bench-'));
  const context = await launch(chromium, process.env.CHROMIUM, profile);
  try {
    const page = context.pages()[0] || await context.newPage();
    const first = await run(page, base);
    const again = await run(page, base);
    for (const r of [first, again]) {
      if (r.error || !r.tokens) throw new Error(`the page failed: ${r.error || 'no tokens'}`);
    }
    console.log(JSON.stringify({ first, again }));
  } finally {
    await context.close();
    server.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

main().catch((e) => { console.error(e && e.stack ? e.stack : String(e)); process.exit(1); });
