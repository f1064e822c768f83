// Drives kiln's browser page (scripts/web-build.sh's folder) in headless Chromium through
// playwright-core, for tests/tests/web_page.rs, which checks what this prints.
//
// Serves WEB_DIR and the model file MODEL (as /models/model.gguf) from a small local server,
// then: loads the model from that URL (downloaded into the browser's cache), types PROMPT,
// watches the reply stream into #output, asks for a long reply to LONG_PROMPT and presses
// stop, saves SCREENSHOT (optional), and opens the page again with the work in the address
// (?model=...&prompt=...) to load the model from the cache.
//
// Environment: PLAYWRIGHT, CHROMIUM, WEB_DIR, MODEL, PROMPT, MAX_TOKENS, LONG_PROMPT,
// SCREENSHOT. Prints one JSON line.
'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');
const { chromium } = require(process.env.PLAYWRIGHT);
const { serve, launch } = require('./static_server.cjs');

async function main() {
  const out = { consoleErrors: [] };
  const { server, base, modelFetches } = await serve(process.env.WEB_DIR, process.env.MODEL);
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-web-'));
  const context = await launch(chromium, process.env.CHROMIUM, profile);
  let page;
  try {
    page = context.pages()[0] || await context.newPage();
    page.on('console', (m) => { if (m.type() === 'error') out.consoleErrors.push(m.text()); });
    page.on('pageerror', (e) => out.consoleErrors.push(String(e)));
    const maxTokens = process.env.MAX_TOKENS;

    // 1. Load from the URL: a download into the browser's cache.
    await page.goto(`${base}?model=/models/model.gguf&max_tokens=${maxTokens}&temperature=0&backend=webgpu`);
    await page.waitForFunction(() => !document.getElementById('send').disabled
      || !document.getElementById('error').hidden, null, { timeout: 300000 });
    out.loadError = await page.locator('#error').evaluate((e) => (e.hidden ? '' : e.textContent));
    const status = async () => page.locator('#status').evaluate((e) => ({
      text: e.textContent, cached: e.dataset.cached, fetchMs: Number(e.dataset.fetchMs), loadMs: Number(e.dataset.loadMs),
    }));
    out.firstLoad = await status();
    // The adapter's description replaces the engine's once the page has asked the browser.
    await page.waitForFunction(() => document.getElementById('device').textContent.startsWith('WebGPU'), null, { timeout: 10000 })
      .catch(() => {});
    out.device = await page.locator('#device').textContent();
    if (out.loadError) throw new Error(out.loadError);

    // 2. A prompt typed and sent: the reply streams into #output.
    await page.locator('#prompt').fill(process.env.PROMPT);
    await page.locator('#prompt').press('Enter');
    const lengths = [];
    for (;;) {
      const s = await page.locator('#output').evaluate((e) => ({ text: e.textContent, done: e.dataset.done }));
      if (!lengths.length || lengths[lengths.length - 1] !== s.text.length) lengths.push(s.text.length);
      if (s.done === 'true') break;
      await page.waitForTimeout(20);
    }
    const reply = () => page.locator('#output').evaluate((e) => ({
      text: e.textContent, finish: e.dataset.finish || null, error: e.dataset.error || null,
      decodeTps: Number(e.dataset.decodeTps), promptTps: Number(e.dataset.promptTps), tokens: Number(e.dataset.tokens),
    }));
    out.lengths = lengths;
    out.first = await reply();

    // 3. A long reply, stopped once it has started.
    await page.locator('#loader summary').click();
    await page.locator('#max-tokens').fill('400');
    await page.locator('#loader summary').click();
    await page.locator('#prompt').fill(process.env.LONG_PROMPT);
    await page.locator('#send').click();
    await page.waitForFunction(() => {
      const o = document.getElementById('output');
      return o && o.textContent.length > 20 && o.dataset.done === 'false';
    }, null, { timeout: 300000 });
    out.stopEnabled = await page.locator('#stop').isEnabled();
    await page.locator('#stop').click();
    await page.waitForFunction(() => document.getElementById('output').dataset.done === 'true', null, { timeout: 60000 });
    out.stopped = await reply();
    out.userMessages = await page.locator('.msg.user').allTextContents();
    if (process.env.SCREENSHOT) await page.screenshot({ path: process.env.SCREENSHOT });

    // 4. The work in the address, the model from the cache, the backend left to the page
    // (auto: the CPU reference on a software adapter).
    const fetchesBefore = modelFetches();
    const q = new URLSearchParams({ model: '/models/model.gguf', prompt: process.env.PROMPT, max_tokens: maxTokens, temperature: '0' });
    await page.goto(`${base}?${q}`);
    await page.waitForFunction(() => {
      const o = document.getElementById('output');
      return (o && o.dataset.done === 'true') || !document.getElementById('error').hidden;
    }, null, { timeout: 300000 });
    out.reload = await status();
    out.reloadDevice = await page.locator('#device').textContent();
    out.fromAddress = await reply();
    out.modelFetchesOnReload = modelFetches() - fetchesBefore;
  } catch (e) {
    // What the page showed when it went wrong.
    const shown = page ? await page.evaluate(() => document.body.innerText).catch(() => '') : '';
    throw new Error(`${e.message}\n--- the page showed:\n${shown}\n--- console errors: ${JSON.stringify(out.consoleErrors)}`);
  } finally {
    await context.close();
    server.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
