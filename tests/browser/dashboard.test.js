#!/usr/bin/env node
/*
 * dashboard.test.js: the dashboard (GET / of `moonloop serve`) driven as an
 * operator would, in Debian's headless Chromium through playwright-core.
 *
 * It starts a real `moonloop serve --listen 127.0.0.1:0` on a temporary
 * database, with a token (so the page must ask for it) and a skills folder:
 * `flaky` fails after its retries, `greet` succeeds, `parent` invokes
 * `greet` as a child. Then, in the browser: the page loads and asks for the
 * token; the run list shows the runs and updates by itself; a failed run
 * opens with its error, its failing step's attempts and a link to the source
 * of its version; rerun (confirmed) starts a new run that shows and appears
 * in the list; a parent lists its child; the skills page shows versions and
 * the last load error; a run queued behind a concurrency limit says why it
 * waits and its place in the queue, in the list and on its page. A screenshot of the failed run goes to
 * tests/artifacts/dashboard.png (ARTIFACTS_DIR overrides the folder).
 *
 * Environment: MOONLOOP_BIN (the binary), CHROMIUM (default /usr/bin/chromium).
 * Prints "ok - ..." per check and ends with "N passed, N failed".
 */
'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const lib = require('./lib.js');
const { startEngine, until, check, report, cleanups, launch, ARTIFACTS } = lib;

const TOKEN = 'dash-test-token-' + process.pid;

/* ---- the engine ------------------------------------------------------------ */

const SKILLS = {
  'flaky.lua': `-- fails after its retries: what an operator comes to the dashboard for
return {
  id = "flaky", description = "calls an API that keeps failing", retries = 2, backoff = "50ms",
  run = function(ctx)
    ctx.step.run("prepare", function() log.info("preparing order", ctx.input.order) return { ok = true } end)
    ctx.step.run("call-api", function()
      log.warn("calling the API, attempt", ctx.attempt)
      error("upstream returned 503 for order " .. tostring(ctx.input.order))
    end)
  end,
}
`,
  'greet.lua': `return {
  id = "greet", description = "says hello", triggers = { { event = "greet.please" } },
  run = function(ctx)
    local t = ctx.step.run("compose", function()
      log.info("composing for", ctx.input.who)
      return { text = "hello " .. tostring(ctx.input.who) }
    end)
    return t
  end,
}
`,
  /* One at a time: the first run holds the slot while its child waits
   * for an event (inside step.parallel, which keeps the run's slots), so
   * the next ones wait queued. */
  'gate.lua': `return {
  id = "gate", description = "one at a time", concurrency = { limit = 1 },
  run = function(ctx)
    return ctx.step.parallel("hold", { function() return ctx.step.invoke("go", { skill = "hold" }) end })
  end,
}
`,
  'hold.lua': `return {
  id = "hold", description = "waits for gate.go",
  run = function(ctx) return ctx.step.wait_for_event("go", { event = "gate.go" }) end,
}
`,
  /* A long error (100 kB) and a run that waits with a large input. */
  'loud.lua': `return {
  id = "loud", retries = 0, run = function(ctx)
    ctx.step.run("shout", function() error("first line of a long error\\n" .. string.rep("x", 100000)) end)
  end,
}
`,
  'nap.lua': `return {
  id = "nap", run = function(ctx) ctx.step.sleep("nap", 120) end,
}
`,
  'parent.lua': `return {
  id = "parent", description = "invokes greet as a child run",
  run = function(ctx)
    local out = ctx.step.invoke("child", { skill = "greet", data = { who = "child" } })
    return { child = out }
  end,
}
`,
};

/* A request to the API with the token: {status, json}. */
const call = (url, method, p, body) => lib.call(url, TOKEN, method, p, body);

/* ---- the test -------------------------------------------------------------- */

async function main() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ml-dash-'));
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  fs.mkdirSync(path.join(dir, 'skills'));
  for (const [f, src] of Object.entries(SKILLS)) fs.writeFileSync(path.join(dir, 'skills', f), src);

  const eng = await startEngine(dir, TOKEN);
  const url = eng.url;

  /* The runs to look at, made through the API. */
  const flaky = (await call(url, 'POST', '/v1/skills/flaky/invoke', { data: { order: 4242 } })).json.run_id;
  const parent = (await call(url, 'POST', '/v1/skills/parent/invoke', { data: {} })).json.run_id;
  await call(url, 'POST', '/v1/events', { name: 'greet.please', data: { who: 'ada' } });
  /* A skill with two versions and a last load error, as PUT (the sidecar's path) makes them. */
  const notes1 = 'return { id = "notes", description = "v1", run = function(ctx) return 1 end }\n';
  const notes2 = 'return { id = "notes", description = "v2", run = function(ctx) return 2 end }\n';
  assert.equal((await call(url, 'PUT', '/v1/skills/notes', notes1)).status, 200);
  assert.equal((await call(url, 'PUT', '/v1/skills/notes', notes2)).status, 200);
  assert.equal((await call(url, 'PUT', '/v1/skills/notes', 'return { id = "notes", retires = 1, run = function() end }\n')).status, 400);
  await until('the failed and the parent runs to end', async () => {
    const a = (await call(url, 'GET', '/v1/runs/' + flaky)).json;
    const b = (await call(url, 'GET', '/v1/runs/' + parent)).json;
    return a.status === 'failed' && b.status === 'completed';
  });
  const child = (await call(url, 'GET', '/v1/runs?parent=' + parent)).json.runs[0].id;

  /* Nothing but the engine is ever asked for, and the page raises no error
  ** (lib.js's launch watches; the one expected console error is the 401 of
  ** the first fetch, before the token). */
  const { page, problems } = await launch(url);

  await check('the page loads and asks for the token', async () => {
    const res = await page.goto(url + '/');
    assert.equal(res.status(), 200);
    assert.match(res.headers()['content-type'], /^text\/html/);
    await page.locator('#token').waitFor();
    assert.match(await page.locator('.login').innerText(), /token/i);
    await page.fill('#token', TOKEN);
    await page.press('#token', 'Enter');
  });

  await check('the run list shows the runs, the failed one marked failed', async () => {
    await page.locator('table.runs tbody tr').nth(3).waitFor(); /* flaky, parent, child, greet by event */
    const row = page.locator(`table.runs tr[data-id="${flaky}"]`);
    assert.equal(await row.getAttribute('data-status'), 'failed');
    assert.match(await row.innerText(), /upstream returned 503 for order 4242/);
    assert.match(await row.innerText(), /flaky/);
    assert.match(await page.locator(`table.runs tr[data-id="${child}"]`).innerText(), /child of/);
    assert.equal(await page.evaluate(() => sessionStorage.getItem('moonloop.token')), TOKEN);
  });

  await check('the list updates by itself when a run starts', async () => {
    const fresh = (await call(url, 'POST', '/v1/skills/greet/invoke', { data: { who: 'live' } })).json.run_id;
    await page.locator(`table.runs tr[data-id="${fresh}"]`).waitFor();
  });

  await check('the status filter narrows the list', async () => {
    await page.selectOption('#f-status', 'failed');
    await until('only failed runs', async () => {
      const st = await page.locator('table.runs tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.status));
      return st.length >= 1 && st.every((s) => s === 'failed') && /status=failed/.test(await page.evaluate(() => location.hash));
    });
  });

  await check('"Older" pages through the list', async () => {
    await page.goto(url + '/#/runs?limit=2');
    const ids = () => page.locator('table.runs tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.id));
    await until('a page of 2', async () => (await ids()).length === 2);
    const first = await ids();
    await page.click('#older');
    await until('the older page', async () => {
      const next = await ids();
      return /before=/.test(await page.evaluate(() => location.hash)) && next.length === 2 &&
        next.every((id) => !first.includes(id) && id < first[1]);
    });
  });

  await check('keys: j moves to the first run, Enter opens it, Esc comes back', async () => {
    await page.goto(url + '/#/runs');
    await page.locator('table.runs tbody tr').nth(3).waitFor();
    const top = await page.locator('table.runs tbody tr').first().getAttribute('data-id');
    await page.keyboard.press('j');
    await page.keyboard.press('Enter');
    await until('the run view', async () => (await page.evaluate(() => location.hash)) === '#/runs/' + top);
    await page.locator('.run-head').waitFor();
    await page.keyboard.press('Escape');
    await until('the list again', async () => (await page.evaluate(() => location.hash)) === '#/runs');
    await page.selectOption('#f-status', 'failed');
    await page.locator(`table.runs tr[data-id="${flaky}"]`).waitFor();
  });

  await check('a failed run opens with its error, failing step and attempts', async () => {
    await page.click(`table.runs tr[data-id="${flaky}"] a.run-link`);
    await page.locator('#run-error').waitFor();
    const err = await page.locator('#run-error').innerText();
    assert.match(err, /upstream returned 503 for order 4242/);
    assert.match(err, /in step call-api after 3 attempts/);
    assert.match(err, /stack traceback/);
    /* The failing step is open: its three attempts, each with the error. */
    const step = page.locator('#waterfall .wf-row[data-step="call-api"]');
    assert.equal(await step.getAttribute('data-status'), 'failed');
    const attempts = step.locator('tr.attempt');
    await until('3 attempts', async () => (await attempts.count()) === 3);
    for (let i = 0; i < 3; i++) {
      assert.equal(await attempts.nth(i).getAttribute('data-status'), 'failed');
      assert.match(await attempts.nth(i).innerText(), /upstream returned 503/);
    }
    assert.match(await step.locator('.logs').innerText(), /calling the API, attempt 3/);
    /* The input, and the first step's bar placed in the waterfall. */
    assert.match(await page.locator('.cols').innerText(), /"order": 4242/);
    const bar = await page.locator('#waterfall .wf-row[data-step="prepare"] .wf-bar').first().evaluate((el) => el.style.left);
    assert.match(bar, /%$/);
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: path.join(ARTIFACTS, 'dashboard.png'), fullPage: true });
  });

  await check('the version links to the source that ran', async () => {
    await page.click('#version-link');
    await page.locator('#source').waitFor();
    assert.match(await page.locator('#source').innerText(), /upstream returned 503 for order/);
    await page.goBack();
    await page.locator('#run-error').waitFor();
  });

  let rerun = null;
  await check('rerun asks, starts a new run and shows it; it appears in the list', async () => {
    page.once('dialog', (d) => d.accept());
    await page.click('#rerun');
    await until('the new run', async () => {
      const m = /^#\/runs\/([0-9A-Z]+)$/.exec(await page.evaluate(() => location.hash));
      return m && m[1] !== flaky && (rerun = m[1]);
    });
    await until('the new run\'s header', async () => /rerun/.test(await page.locator('dl.facts').first().innerText().catch(() => '')));
    assert.match(await page.locator('dl.facts').first().innerText(), new RegExp('rerun\\s+of\\s+' + flaky));
    assert.match(await page.locator('#banner').innerText(), /Rerun started/);
    await page.click('#nav-runs');
    await page.locator(`table.runs tr[data-id="${rerun}"]`).waitFor();
  });

  await check('a parent run links to its child, and the child to its parent', async () => {
    await page.goto(url + '/#/runs/' + parent);
    await page.locator('#run-children').waitFor();
    await page.click(`table.runs tr[data-id="${child}"] a.run-link`);
    await until('the child run', async () => (await page.evaluate(() => location.hash)) === '#/runs/' + child);
    await page.locator(`dl.facts a[href="#/runs/${parent}"]`).first().waitFor();
  });

  await check('the skills page shows versions and the last load error', async () => {
    await page.click('#nav-skills');
    const row = page.locator('tr[data-skill="notes"]');
    await row.waitFor();
    assert.equal(await row.locator('.versions li').count(), 2);
    assert.match(await row.locator('.skill-err').innerText(), /unknown key 'retires'/);
    assert.equal(await page.locator('tr[data-skill="flaky"] .versions li').count(), 1);
  });

  await check('an unknown run and a bad filter say what is wrong', async () => {
    await page.goto(url + '/#/runs/NOSUCHRUN1');
    await until('the unknown run\'s message', async () => /no run with id 'NOSUCHRUN1'/.test(await page.locator('main').innerText()));
    await page.goto(url + '/#/runs?since=yesterday');
    await until('the error banner', async () => /since: expected a duration/.test(await page.locator('#banner').innerText()));
  });

  await check('a queued run says why it waits, and its place in the queue', async () => {
    await call(url, 'POST', '/v1/skills/gate/invoke', { data: { n: 1 } });
    await until('the first gate run to hold the slot', async () => (await call(url, 'GET', '/v1/runs?skill=hold')).json.runs.length === 1);
    const second = (await call(url, 'POST', '/v1/skills/gate/invoke', { data: { n: 2 } })).json.run_id;
    const third = (await call(url, 'POST', '/v1/skills/gate/invoke', { data: { n: 3 } })).json.run_id;
    await until('the third queued', async () => ((await call(url, 'GET', '/v1/runs/' + third)).json.queued || {}).position === 2);
    await page.goto(url + '/#/runs?skill=gate');
    const row = page.locator(`table.runs tr[data-id="${second}"]`);
    await until('the queued row', async () => /waiting: concurrency limit 1 of skill gate/.test(await row.innerText().catch(() => '')));
    assert.equal(await row.getAttribute('data-status'), 'queued');
    await page.goto(url + '/#/runs/' + third);
    const why = page.locator('#queued-reason');
    await why.waitFor();
    assert.equal(await why.innerText(), 'waiting: concurrency limit 1 of skill gate, number 2 in the queue');
    await call(url, 'POST', '/v1/events', { name: 'gate.go', data: {} });
  });

  await check('a long error is cut in the list and on its page, and shown whole on demand', async () => {
    const loud = (await call(url, 'POST', '/v1/skills/loud/invoke', { data: {} })).json.run_id;
    await until('the loud run to fail', async () => (await call(url, 'GET', '/v1/runs/' + loud)).json.status === 'failed');
    await page.goto(url + '/#/runs?skill=loud');
    const row = page.locator(`table.runs tr[data-id="${loud}"]`);
    await row.waitFor();
    /* One line, not the 27,000 px row the whole message made. */
    assert.ok((await row.boundingBox()).height < 200, 'row height ' + (await row.boundingBox()).height);
    await page.goto(url + '/#/runs/' + loud);
    const box = page.locator('#run-error');
    await box.waitFor();
    assert.ok((await box.innerText()).length < 5000);
    await box.locator('button.more').click();
    await until('the whole error', async () => (await box.innerText()).length > 100000);
  });

  await check('a running run with a large input stays usable: not drawn again while unchanged, text stays selected', async () => {
    const big = 'y'.repeat(300000);
    const nap = (await call(url, 'POST', '/v1/skills/nap/invoke', { data: { big } })).json.run_id;
    await until('the nap to sleep', async () => (await call(url, 'GET', '/v1/runs/' + nap)).json.status === 'sleeping');
    await page.goto(url + '/#/runs/' + nap);
    /* Drawn, and again once its version's file is known. */
    await until('the version\'s file', async () => /nap\.lua/.test(await page.locator('dl.facts').innerText().catch(() => '')));
    /* The input is cut, with "show all". */
    assert.ok(await page.locator('button.more').count() >= 1);
    await page.evaluate(() => {
      const r = document.createRange();
      r.selectNodeContents(document.querySelector('.rid'));
      window.getSelection().removeAllRanges();
      window.getSelection().addRange(r);
    });
    await new Promise((res) => setTimeout(res, 4000)); /* two polls and more */
    assert.equal(await page.evaluate(() => String(window.getSelection())), nap);
    /* Its duration still grows. */
    const d1 = await page.locator('.live-dur').first().innerText();
    await new Promise((res) => setTimeout(res, 2100));
    assert.notEqual(await page.locator('.live-dur').first().innerText(), d1);
  });

  await check('an engine that hangs is not shown as live', async () => {
    await page.goto(url + '/#/runs');
    await page.locator('table.runs').waitFor();
    process.kill(eng.proc.pid, 'SIGSTOP');
    try {
      await until('the page to say the engine does not answer', async () =>
        /did not answer within/.test(await page.locator('#banner').innerText().catch(() => '')), 20000);
      assert.match(await page.locator('#live').innerText(), /offline/);
    } finally {
      process.kill(eng.proc.pid, 'SIGCONT');
    }
    await until('live again', async () => !/offline/.test(await page.locator('#live').innerText()), 20000);
  });

  await check('the page fetched nothing from elsewhere and raised no error', async () => {
    /* The two refused requests just above log their status; nothing else may. */
    for (let i = problems.length - 1; i >= 0; i--) if (/status of (404|400)/.test(problems[i])) problems.splice(i, 1);
    assert.deepEqual(problems, []);
  });
}

main().catch((e) => report.fail('the test could not run', e)).finally(report.end);
