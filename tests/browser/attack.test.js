#!/usr/bin/env node
/*
 * attack.test.js: hostile pages against a token-less moonloop engine, in
 * Debian's headless Chromium through playwright-core. tests/security/
 * test_chromium.py starts the engine (with a run waiting for an approval)
 * and a second HTTP server that serves attack.html, runs this script, and
 * then checks the engine: nothing started, nothing deployed, the waiting
 * run untouched, the idempotency key unburnt.
 *
 * Three pages run attack.html:
 *   - cross-site: http://evil.test:PAGE_PORT/ (the resolver maps evil.test
 *     to 127.0.0.1), attacking http://127.0.0.1:ENGINE_PORT;
 *   - same-site: http://127.0.0.1:PAGE_PORT/, another port of the engine's
 *     own host;
 *   - DNS rebinding: http://rebind.test:ENGINE_PORT/, the page served as the
 *     attacker's (a route fulfils it) while rebind.test resolves to
 *     127.0.0.1, so its same-origin requests reach the engine with
 *     Host: rebind.test.
 *
 * Environment: ENGINE_URL, PAGE_PORT, WAITER_ID, CHROMIUM (default
 * /usr/bin/chromium). Prints one line per page, "page NAME RESULTS_JSON",
 * and ends with "N pages"; exits 1 when a page could not run.
 */
'use strict';
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { chromium } = require('playwright-core');

const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const ENGINE = process.env.ENGINE_URL;
const ENGINE_PORT = new URL(ENGINE).port;
const PAGE_PORT = process.env.PAGE_PORT;
const WAITER = process.env.WAITER_ID || '';
const HTML = fs.readFileSync(path.join(__dirname, 'attack.html'), 'utf8');

async function main() {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ml-attack-'));
  const ctx = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--host-resolver-rules=MAP evil.test 127.0.0.1, MAP rebind.test 127.0.0.1',
      /* Chromium's own guard for private networks would stop the rebound
      ** page before the engine sees it; other browsers have none, so the
      ** engine must hold without it. */
      '--disable-features=BlockInsecurePrivateNetworkRequests,PrivateNetworkAccessSendPreflights,' +
        'PrivateNetworkAccessRespectPreflightResults,LocalNetworkAccessChecks'],
    timeout: 30000,
  });
  let pages = 0;
  try {
    const q = `?engine=${encodeURIComponent(ENGINE)}&waiter=${WAITER}`;
    const targets = [
      ['cross-site', `http://evil.test:${PAGE_PORT}/attack.html${q}`],
      ['same-site', `http://127.0.0.1:${PAGE_PORT}/attack.html${q}`],
      ['rebinding', `http://rebind.test:${ENGINE_PORT}/attack.html?waiter=${WAITER}`],
    ];
    for (const [name, url] of targets) {
      const page = await ctx.newPage();
      if (name === 'rebinding') {
        /* The attacker's server answered this first request; every later
        ** one goes to what rebind.test resolves to now: the engine. */
        await page.route((u) => u.pathname === '/attack.html', (route) =>
          route.fulfill({ status: 200, contentType: 'text/html', body: HTML }));
      }
      await page.goto(url);
      await page.waitForFunction(() => window.__done === true, null, { timeout: 60000 });
      const results = await page.evaluate(() => window.__results);
      console.log('page ' + name + ' ' + JSON.stringify(results));
      pages++;
      await page.close();
    }
  } finally {
    await ctx.close().catch(() => {});
    fs.rmSync(profile, { recursive: true, force: true });
  }
  console.log(pages + ' pages');
}

main().catch((e) => {
  console.log('the attack pages could not run: ' + String(e && e.stack || e));
  process.exit(1);
});
