// Drives `kiln serve`'s chat page in headless Chromium through playwright-core, for
// tests/tests/chat_page.rs (which starts the server and checks what this prints).
//
// Environment: KILN_URL (the server), KILN_KEY (its API key), PLAYWRIGHT (the playwright-core
// folder), CHROMIUM (the browser), PROMPT, MAX_TOKENS, LONG_PROMPT, SCREENSHOT (optional path).
// Prints one JSON line: what the page showed at each step.
'use strict';

const { chromium } = require(process.env.PLAYWRIGHT);

const url = process.env.KILN_URL;
const key = process.env.KILN_KEY;

async function api(path) {
  const res = await fetch(url + path, { headers: { Authorization: 'Bearer ' + key } });
  return res.json();
}

async function main() {
  const out = {};
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu'],
  });
  try {
    const context = await browser.newContext({ viewport: { width: 1100, height: 760 } });
    const page = await context.newPage();
    const consoleErrors = [];
    page.on('console', (m) => {
      if (m.type() === 'error') consoleErrors.push(m.text());
    });
    page.on('pageerror', (e) => consoleErrors.push(String(e)));
    await page.goto(url + '/');

    // The server wants a key: the page asks for it.
    const keyBox = page.getByTestId('api-key');
    await keyBox.waitFor({ state: 'visible', timeout: 20000 });
    await keyBox.fill(key);
    await page.getByTestId('api-key-save').click();
    await page.locator('[data-testid="model"] option').first().waitFor({ state: 'attached', timeout: 20000 });
    out.models = await page.locator('[data-testid="model"] option').allTextContents();

    // Greedy settings, then the first question.
    await page.getByRole('button', { name: 'Settings' }).click();
    await page.getByTestId('temperature').fill('0');
    await page.getByTestId('max-tokens').fill(process.env.MAX_TOKENS);
    await page.getByRole('button', { name: 'Settings' }).click();
    out.settingsHidden = await page.locator('#settings').isHidden();
    await page.getByTestId('prompt').fill(process.env.PROMPT);
    await page.getByTestId('send').click();

    // Watch the answer grow: its text length at each animation frame until it is done.
    out.lengths = await page.evaluate(
      () =>
        new Promise((resolve, reject) => {
          const seen = [];
          const t0 = performance.now();
          const tick = () => {
            const m = document.querySelector('[data-testid="assistant-message"]');
            if (m) {
              const n = (m.querySelector('.body') || m).textContent.length;
              if (seen[seen.length - 1] !== n) seen.push(n);
              if (m.dataset.done === 'true') return resolve(seen);
            }
            if (performance.now() - t0 > 120000) return reject(new Error('no finished answer in 120 s'));
            requestAnimationFrame(tick);
          };
          tick();
        }),
    );
    const first = page.getByTestId('assistant-message').first();
    out.answer = await first.getAttribute('data-raw');
    out.errors = await page.getByTestId('error').allTextContents();

    // A second, long answer, stopped mid-stream.
    await page.getByRole('button', { name: 'Settings' }).click();
    await page.getByTestId('max-tokens').fill('');
    await page.getByTestId('prompt').fill(process.env.LONG_PROMPT);
    await page.getByTestId('send').click();
    const second = page.getByTestId('assistant-message').nth(1);
    await page.waitForFunction(
      () => {
        const m = document.querySelectorAll('[data-testid="assistant-message"]')[1];
        return m && m.querySelector('.body').textContent.length > 20;
      },
      null,
      { timeout: 60000 },
    );
    out.busyBeforeStop = (await api('/slots')).slots.length;
    await page.getByTestId('stop').click();
    await page.waitForFunction(
      () => document.querySelectorAll('[data-testid="assistant-message"]')[1].dataset.done === 'true',
      null,
      { timeout: 20000 },
    );
    out.stopped = (await second.textContent()).includes('Stopped.');
    out.stoppedAnswer = await second.getAttribute('data-raw');
    // The server lets the request go: no slot left, no KV block in use.
    let slots = null;
    for (let i = 0; i < 100; i++) {
      slots = await api('/slots');
      if (slots.slots.length === 0 && slots.kv_blocks.used === 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    out.slotsAfterStop = slots.slots.length;
    out.kvUsedAfterStop = slots.kv_blocks.used;
    if (process.env.SCREENSHOT) await page.screenshot({ path: process.env.SCREENSHOT });

    // A reload finds the conversation and both answers.
    await page.reload();
    await page.getByTestId('assistant-message').nth(1).waitFor({ timeout: 20000 });
    out.conversations = await page.getByTestId('conversation').allTextContents();
    out.answerAfterReload = await page.getByTestId('assistant-message').first().getAttribute('data-raw');
    out.userMessages = await page.getByTestId('user-message').locator('.text').allTextContents();
    out.consoleErrors = consoleErrors;
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
