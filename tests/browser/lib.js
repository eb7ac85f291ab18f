/*
 * lib.js: what the browser tests share: a `moonloop serve` of their own,
 * the API with a token, waiting, checks that print "ok - ..." and a
 * summary, and Chromium (Debian's, headless) through playwright-core with
 * a watch on what the page asks for and what it raises.
 */
'use strict';
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { chromium } = require('playwright-core');

const ROOT = path.resolve(__dirname, '..', '..');
const BIN = process.env.MOONLOOP_BIN || path.join(ROOT, 'build', 'moonloop');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const ARTIFACTS = process.env.ARTIFACTS_DIR || path.join(ROOT, 'tests', 'artifacts');
const WAIT = 15000; /* the longest any one expectation may take */

const cleanups = [];
let passed = 0, failed = 0;

/* `moonloop serve` on dir (skills in dir/skills), with token; resolves to
 * {proc, url} once it listens. */
function startEngine(dir, token) {
  return new Promise((resolve, reject) => {
    const env = { ...process.env, MOONLOOP_TOKEN: token, NO_COLOR: '1' };
    delete env.MOONLOOP_URL;
    const p = spawn(BIN, ['serve', '--workspace', path.join(dir, 'skills'), '--listen', '127.0.0.1:0',
      '--db', path.join(dir, 'moonloop.db')], { cwd: dir, env, stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    const timer = setTimeout(() => reject(new Error('moonloop serve did not listen within 10 s: ' + err)), 10000);
    p.stderr.on('data', (b) => {
      err += b.toString();
      const m = /listening on (http:\/\/[0-9.:]+)/.exec(err);
      if (m) { clearTimeout(timer); resolve({ proc: p, url: m[1], log: () => err }); }
    });
    p.on('exit', (code) => { clearTimeout(timer); reject(new Error(`moonloop serve exited ${code}: ${err}`)); });
    cleanups.unshift(() => { try { process.kill(p.pid, 'SIGKILL'); } catch (e) { /* gone */ } });
  });
}

/* A request to the API with the token; {status, json}. A string body goes
 * as it is (Lua source for PUT, sent as text/x-lua), anything else as JSON. */
async function call(url, token, method, p, body) {
  const res = await fetch(url + p, {
    method, headers: { Authorization: 'Bearer ' + token, 'Content-Type': method === 'PUT' ? 'text/x-lua' : 'application/json' },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, json: text ? JSON.parse(text) : null };
}

/* fn's first truthy answer, polled every 100 ms for at most ms. */
async function until(what, fn, ms = WAIT) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error('timed out waiting for ' + what);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log('ok - ' + name);
  } catch (e) {
    report.fail(name, e);
  }
}

const report = {
  fail(name, e) {
    failed++;
    console.log('not ok - ' + name + '\n    ' + String((e && e.stack) || e).split('\n').join('\n    '));
  },
  async end() {
    for (const f of cleanups) { try { await f(); } catch (e) { /* best effort */ } }
    console.log(`${passed} passed, ${failed} failed`);
    process.exit(failed ? 1 : 0);
  },
};

/* Chromium with a fresh profile, its page, and the list of problems seen:
 * requests outside the engine at url, page errors, console errors (but the
 * 401 of the first request, before the token is typed). */
async function launch(url) {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ml-chromium-'));
  cleanups.push(() => fs.rmSync(profile, { recursive: true, force: true }));
  const ctx = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1280, height: 900 },
    timeout: 30000,
  });
  cleanups.unshift(() => ctx.close().catch(() => {}));
  ctx.setDefaultTimeout(WAIT);
  const page = ctx.pages()[0] || await ctx.newPage();
  const problems = [];
  const origin = new URL(url).origin;
  page.on('request', (r) => {
    const u = r.url();
    if (!u.startsWith(origin + '/') && !u.startsWith('data:')) problems.push('request outside the engine: ' + u);
  });
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/401/.test(m.text())) problems.push('console error: ' + m.text());
  });
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  return { ctx, page, problems };
}

module.exports = { BIN, CHROMIUM, ARTIFACTS, WAIT, cleanups, startEngine, call, until, check, report, launch };
