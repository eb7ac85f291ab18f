#!/usr/bin/env node
/*
 * health.test.js: the dashboard's health views (web/health.js, charts.js)
 * driven in Debian's headless Chromium through playwright-core.
 *
 * A real `moonloop serve` (with a token) on a temporary database runs the
 * runs this test makes through the API: `steady` completes, `shaky` fails
 * when asked, `greeter` starts on an event. Then, in the page:
 *   - the overview has a card per skill whose numbers (data attributes and
 *     sparkline values) match the runs' records from GET /v1/runs;
 *   - the window switch (1 h, 24 h, 7 d) changes the intervals, and with
 *     them the sparklines' values, keeping their sums;
 *   - a skill page's charts hold the runs per interval by outcome, the
 *     duration percentiles (nearest rank, computed here from the records),
 *     the failing steps; a new version (PUT) shows as a deploy marker;
 *   - invoking from the page starts a run with the JSON input typed, and
 *     the charts count it; sending an event from the events view starts the
 *     runs it triggers, listed under it;
 *   - the page asks nothing of anyone but the engine, sends its JSON with
 *     Content-Type: application/json from its own origin, raises no error.
 * Screenshots: tests/artifacts/health-overview.png, health-skill.png,
 * events.png (ARTIFACTS_DIR overrides the folder).
 *
 * Environment: MOONLOOP_BIN, CHROMIUM. Prints "ok - ..." per check and
 * ends with "N passed, N failed".
 */
'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { startEngine, call, until, check, report, cleanups, launch, ARTIFACTS } = require('./lib.js');

const TOKEN = 'health-test-token-' + process.pid;

const SKILLS = {
  'steady.lua': `return { id = "steady", description = "always works",
  run = function(ctx)
    ctx.step.run("work", function() return { n = ctx.input.n } end)
    return { n = ctx.input.n }
  end }
`,
  'shaky.lua': `return { id = "shaky", description = "fails when asked", retries = 1, backoff = "10ms",
  run = function(ctx)
    ctx.step.run("prepare", function() return 1 end)
    ctx.step.run("call", function()
      if ctx.input.fail then error("upstream said no") end
      return 2
    end)
  end }
`,
  'greeter.lua': `return { id = "greeter", triggers = { { event = "greet.please" } },
  run = function(ctx) return ctx.step.run("hello", function() return "hello " .. tostring(ctx.input.who) end) end }
`,
};

/* Nearest rank, as the engine computes percentiles. */
function rank(values, perMille) {
  const s = values.slice().sort((a, b) => a - b);
  return s[Math.ceil((perMille * s.length) / 1000) - 1];
}

const ms = (iso) => Date.parse(iso);

async function main() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ml-health-'));
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.mkdirSync(path.join(dir, 'skills'));
  for (const [f, src] of Object.entries(SKILLS)) fs.writeFileSync(path.join(dir, 'skills', f), src);
  const eng = await startEngine(dir, TOKEN);
  const url = eng.url;
  const api = (method, p, body) => call(url, TOKEN, method, p, body);

  /* The runs to look at. */
  const made = [];
  for (let i = 0; i < 4; i++) made.push((await api('POST', '/v1/skills/steady/invoke', { data: { n: i } })).json.run_id);
  for (const fail of [true, true, false]) made.push((await api('POST', '/v1/skills/shaky/invoke', { data: { fail } })).json.run_id);
  await until('the runs to end', async () => {
    for (const id of made) if (!['completed', 'failed'].includes((await api('GET', '/v1/runs/' + id)).json.status)) return false;
    return true;
  });
  const records = async (skill) => (await api('GET', '/v1/runs?limit=1000&skill=' + skill)).json.runs;

  const { ctx, page, problems } = await launch(url);
  page.on('request', (r) => {
    if (r.method() !== 'GET' && r.url().startsWith(url + '/v1/')) {
      const h = r.headers();
      if (r.postData() && h['content-type'] !== 'application/json') problems.push(`${r.method()} ${r.url()} sent Content-Type ${h['content-type']}`);
      if (h.origin && h.origin !== new URL(url).origin) problems.push(`${r.method()} ${r.url()} came from ${h.origin}`);
    }
  });

  await check('the overview asks for the token, then shows a card per skill', async () => {
    await page.goto(url + '/#/health?window=1h');
    await page.locator('#token').waitFor();
    await page.fill('#token', TOKEN);
    await page.press('#token', 'Enter');
    await page.locator('#hcard-steady').waitFor();
    await page.locator('#hcard-shaky').waitFor();
    assert.equal(await page.locator('#nav-health').getAttribute('aria-current'), 'page');
  });

  const card = (skill) => page.locator(`#hcard-${skill}`);
  /* How many intervals the window shown has: from its since (moved back to
   * a multiple of the interval) to its until. */
  const intervals = async (sel) => {
    const d = await page.locator(sel).evaluate((e) => ({ ...e.dataset }));
    return Math.ceil((ms(d.until) - ms(d.since)) / Number(d.intervalMs));
  };
  const sparkValues = async (skill) => JSON.parse(await card(skill).locator('svg.spark').getAttribute('data-values'));

  await check('the cards\' numbers and sparklines match the runs\' records', async () => {
    for (const skill of ['steady', 'shaky']) {
      const runs = await records(skill);
      const c = card(skill);
      assert.equal(Number(await c.getAttribute('data-started')), runs.length, skill);
      assert.equal(Number(await c.getAttribute('data-failed')), runs.filter((r) => r.status === 'failed').length, skill);
      const durations = runs.map((r) => ms(r.ended_at) - ms(r.started_at));
      assert.equal(Number(await c.getAttribute('data-p95')), rank(durations, 950), skill);
      const values = await sparkValues(skill);
      assert.equal(await page.locator('#health-cards').getAttribute('data-interval'), '1m');
      const n = await intervals('#health-cards');
      assert.ok(n === 60 || n === 61, 'a bar per minute of the hour (and one for the minute under way)');
      assert.equal(values.length, n);
      assert.equal(values.reduce((a, b) => a + b, 0), runs.length);
      assert.equal(await c.locator('svg.spark .slot').count(), n);
    }
    assert.match(await card('shaky').innerText(), /2 failed \(66\.7%\)/);
    assert.ok(Math.abs(Number(await card('shaky').getAttribute('data-failure-rate')) - 2 / 3) < 1e-4);
    assert.equal(await card('steady').locator('[data-change="runs"]').innerText(), 'runs new');
    assert.equal(await card('greeter').getAttribute('data-started'), '0');
    await page.screenshot({ path: path.join(ARTIFACTS, 'health-overview.png'), fullPage: true });
  });

  await check('the window switch changes the intervals and the sparklines, not the totals', async () => {
    const before = await sparkValues('steady');
    await page.click('#win-24h');
    await until('the 24 h window', async () => (await page.locator('#health-cards').getAttribute('data-interval')) === '30m');
    assert.match(await page.evaluate(() => location.hash), /window=24h/);
    const after = await sparkValues('steady');
    assert.equal(after.length, await intervals('#health-cards'));
    assert.ok(after.length === 48 || after.length === 49);
    assert.notDeepEqual(after, before);
    assert.equal(after.reduce((a, b) => a + b, 0), 4);
    assert.equal(await page.locator('#win-24h').getAttribute('aria-current'), 'true');
    await page.click('#win-7d');
    await until('the 7 d window', async () => (await page.locator('#health-cards').getAttribute('data-interval')) === '3h');
    assert.equal((await sparkValues('shaky')).reduce((a, b) => a + b, 0), 3);
  });

  await check('a skill page charts its runs, durations and failing steps', async () => {
    await page.click('#hcard-shaky a.hname');
    await page.locator('#skill-totals').waitFor();
    assert.match(await page.evaluate(() => location.hash), /^#\/health\/shaky\?window=7d$/);
    await page.click('#win-1h');
    await until('the 1 h window', async () => (await page.locator('#skill-totals').getAttribute('data-interval')) === '1m');
    const runs = await records('shaky');
    const totals = page.locator('#skill-totals');
    assert.equal(Number(await totals.getAttribute('data-started')), 3);
    assert.equal(Number(await totals.getAttribute('data-failed')), 2);
    assert.equal(Number(await totals.getAttribute('data-retries')), 2);
    /* Runs per interval by outcome: each slot against the records of its minute. */
    const slots = await page.locator('#chart-runs g.slot').evaluateAll((gs) => gs.map((g) => ({
      t: g.dataset.t, completed: Number(g.dataset.completed), failed: Number(g.dataset.failed) })));
    assert.equal(slots.length, await intervals('#skill-totals'));
    for (const s of slots) {
      const mine = runs.filter((r) => ms(r.created_at) >= ms(s.t) && ms(r.created_at) < ms(s.t) + 60000);
      assert.equal(s.completed, mine.filter((r) => r.status === 'completed').length, s.t);
      assert.equal(s.failed, mine.filter((r) => r.status === 'failed').length, s.t);
    }
    /* Duration percentiles per interval, as points of the lines. */
    const pts = await page.locator('#chart-duration circle.pt').evaluateAll((cs) => cs.map((c) => ({
      key: c.dataset.key, t: c.dataset.t, v: Number(c.dataset.v) })));
    assert.ok(pts.length >= 3);
    for (const p of pts) {
      const mine = runs.filter((r) => ms(r.created_at) >= ms(p.t) && ms(r.created_at) < ms(p.t) + 60000);
      const per = { p50: 500, p95: 950, p99: 990 }[p.key];
      assert.equal(p.v, rank(mine.map((r) => ms(r.ended_at) - ms(r.started_at)), per), `${p.key} at ${p.t}`);
    }
    const failing = page.locator('table.failing tr[data-step="call"]');
    assert.equal(await failing.getAttribute('data-failed'), '2');
    assert.equal(await failing.getAttribute('data-retries'), '2');
    assert.equal(await page.locator('#chart-failure rect.bar[data-v]:not([data-v=""])').count() >= 1, true);
  });

  let v2 = null;
  await check('a new version shows as a deploy marker on the time axis', async () => {
    await page.goto(url + '/#/health/steady?window=1h');
    await page.locator('#chart-runs').waitFor();
    const markers = () => page.locator('#chart-runs g.deploy').count();
    const first = await markers();
    assert.equal(first, 1, 'the version loaded when serve started');
    /* Deploying is saving the file: the engine hot-loads it. */
    const v1 = (await api('GET', '/v1/skills/steady')).json.version;
    fs.writeFileSync(path.join(dir, 'skills', 'steady.lua'), SKILLS['steady.lua'].replace('always works', 'always works, version 2'));
    v2 = await until('the new version', async () => {
      const v = (await api('GET', '/v1/skills/steady')).json.version;
      return v !== v1 && v;
    });
    await until('the second marker', async () => (await markers()) === 2);
    const versions = await page.locator('#chart-runs g.deploy').evaluateAll((gs) => gs.map((g) => g.dataset.version));
    assert.equal(versions[1], v2);
    assert.equal(await page.locator(`#skill-versions li[data-version="${v2}"] .live-tag`).count(), 1);
    assert.match(await page.locator('#chart-duration g.deploy title').last().textContent(), /deploy: version [0-9a-f]{12}/);
  });

  await check('invoke from the page starts the run it says, and the charts count it', async () => {
    await page.fill('#invoke-data', '{"n": 42, "from": "the dashboard"}');
    await page.click('#invoke-go');
    const id = await until('the invoke answer', async () => page.locator('#invoke-result').getAttribute('data-run-id'));
    const run = await until('the run to complete', async () => {
      const r = (await api('GET', '/v1/runs/' + id)).json;
      return r.status === 'completed' && r;
    });
    assert.equal(run.skill, 'steady');
    assert.deepEqual(run.input, { n: 42, from: 'the dashboard' });
    assert.equal(run.version, v2);
    await until('the totals to count it', async () => (await page.locator('#skill-totals').getAttribute('data-started')) === '5');
    /* Input that is not JSON is refused in the page, before any request. */
    await page.fill('#invoke-data', '{not json');
    await page.click('#invoke-go');
    await until('the refusal', async () => /not JSON/.test(await page.locator('#invoke-result').innerText()));
    await page.screenshot({ path: path.join(ARTIFACTS, 'health-skill.png'), fullPage: true });
  });

  await check('send an event from the page; the stream shows the runs it started', async () => {
    await page.click('#nav-events');
    await page.locator('#send-form').waitFor();
    await page.fill('#send-name', 'greet.please');
    await page.fill('#send-data', '{"who": "ada"}');
    await page.click('#send-go');
    const id = await until('the event id', async () => page.locator('#send-result').getAttribute('data-event-id'));
    const row = page.locator(`#events tr[data-id="${id}"]`);
    await row.waitFor();
    const li = row.locator('li[data-skill="greeter"]');
    await until('the run it started, completed', async () => (await li.count()) === 1 && (await li.getAttribute('data-status')) === 'completed');
    const runId = await li.getAttribute('data-run');
    const run = (await api('GET', '/v1/runs/' + runId)).json;
    assert.equal(run.trigger.event.id, id);
    assert.deepEqual(run.input, { who: 'ada' });
    assert.match(await row.innerText(), /greet\.please/);
    /* An event no skill listens to starts nothing, and says so. */
    await page.fill('#send-name', 'nobody.listens');
    await page.click('#send-go');
    const id2 = await until('the second event', async () => {
      const v = await page.locator('#send-result').getAttribute('data-event-id');
      return v !== id && v;
    });
    await until('its row', async () => /started no run/.test(await page.locator(`#events tr[data-id="${id2}"]`).innerText().catch(() => '')));
    assert.equal(await page.locator('#events tbody tr').first().getAttribute('data-id'), id2);
    await page.screenshot({ path: path.join(ARTIFACTS, 'events.png'), fullPage: true });
  });

  await check('the page fetched nothing from elsewhere, sent JSON properly and raised no error', async () => {
    assert.deepEqual(problems, []);
  });
  await ctx.close();
}

main().catch((e) => report.fail('the test could not run', e)).finally(report.end);
