/*
 * health.js: the dashboard's health views, registered in
 * window.moonloopViews for app.js's router (which hands each view its
 * helpers: kit() in app.js).
 *
 *   #/health?window=24h          every skill: runs, failures, p50/p95, a
 *                                sparkline of runs per interval, what changed
 *                                since the window before (GET /v1/stats)
 *   #/health/SKILL?window=24h    one skill: runs per interval by outcome,
 *                                failure rate, duration percentiles, queue
 *                                wait, retries, LLM tokens, deploy markers;
 *                                the slowest and most failing steps; the
 *                                versions; a form to invoke it with JSON input
 *                                (GET /v1/skills/{id}/stats)
 *   #/events                     a form to send an event; the recent events
 *                                and the runs each started (GET /v1/events)
 *
 * The window is 1 h, 24 h or 7 d. The figures go into the page as data
 * attributes (data-started, data-failed, ...) beside the text, so what is
 * shown can be read back as numbers. Requests that change something are
 * JSON with Content-Type: application/json, from this page's origin.
 */
'use strict';
(function () {
  const views = window.moonloopViews = window.moonloopViews || {};
  const C = window.moonloopCharts;
  const WINDOWS = [['1h', '1 h'], ['24h', '24 h'], ['7d', '7 d']];
  /* The engine computes the figures on its loop (tens of milliseconds for
   * a day of a busy engine, more for a week): longer windows, which change
   * slower, are asked for less often. */
  const STATS_POLL_MS = { '1h': 5000, '24h': 15000, '7d': 60000 };
  const EVENTS_POLL_MS = 2000;

  function windowOf(params) {
    const w = params.get('window');
    return WINDOWS.some(([k]) => k === w) ? w : '24h';
  }

  function pct(v) { return v == null ? '—' : (v * 100).toFixed(1) + '%'; }

  function count(v) { return v == null ? '—' : Number(v).toLocaleString('en-US'); }

  /* "+20%", "-5%", "new", or "" for no change worth a word. */
  function change(now, was) {
    if (now == null || was == null) return '';
    if (!was) return now ? 'new' : '';
    const d = (now - was) / was * 100;
    return Math.abs(d) < 0.5 ? '' : (d > 0 ? '+' : '') + d.toFixed(0) + '%';
  }

  /* The 1 h / 24 h / 7 d switch: links that keep the rest of the view. */
  function windowSwitch(k, base, w) {
    return k.h('nav', { class: 'win-switch', 'aria-label': 'Window' }, WINDOWS.map(([key, label]) =>
      k.h('a', { href: `${base}?window=${key}`, id: 'win-' + key, class: key === w ? 'on' : null,
        'aria-current': key === w ? 'true' : null }, label)));
  }

  /* ---- the overview --------------------------------------------------------------- */

  function card(k, x, w) {
    const t = x.totals || {}, p = x.previous || {}, d = t.duration_ms || {};
    const rateNow = t.failure_rate, rateWas = p.failure_rate;
    const ratePt = rateNow != null && rateWas != null ? (rateNow - rateWas) * 100 : null;
    const notes = [];
    const rc = change(t.started, p.started);
    if (rc) notes.push(k.h('span', { class: 'chg', 'data-change': 'runs' }, `runs ${rc}`));
    if (ratePt != null && Math.abs(ratePt) >= 0.05) {
      notes.push(k.h('span', { class: 'chg ' + (ratePt > 0 ? 'worse' : 'better'), 'data-change': 'failure_rate' },
        `failure rate ${ratePt > 0 ? '+' : ''}${ratePt.toFixed(1)} pt`));
    }
    if ((x.versions || []).length) {
      notes.push(k.h('span', { class: 'chg deployed', 'data-change': 'deployed', 'data-versions': x.versions.length },
        `deployed ${x.versions.length} version${x.versions.length === 1 ? '' : 's'}`));
    }
    if (!notes.length) notes.push(k.h('span', { class: 'sub' }, p.started ? 'no change' : 'nothing before'));
    return k.h('article', {
      class: 'hcard' + (t.failed ? ' has-failed' : ''), id: 'hcard-' + x.skill,
      dataset: { skill: x.skill, started: t.started, failed: t.failed, completed: t.completed,
        failureRate: t.failure_rate ?? '', p50: d.p50 ?? '', p95: d.p95 ?? '', previousStarted: p.started ?? '' },
    },
    k.h('header', null, k.h('a', { href: `#/health/${k.enc(x.skill)}?window=${w}`, class: 'hname', dataset: { nav: '1' } }, x.skill),
      x.registered ? null : k.h('span', { class: 'sub' }, 'not registered')),
    k.h('div', { class: 'hfig' },
      k.h('span', null, k.h('b', { class: 'v-started' }, count(t.started)), ' runs'),
      k.h('span', { class: t.failed ? 'bad' : '' }, k.h('b', { class: 'v-failed' }, count(t.failed)), ' failed (', pct(t.failure_rate), ')'),
      k.h('span', null, 'p50 ', k.h('b', null, k.fmtDur(d.p50 ?? NaN)), ' · p95 ', k.h('b', { class: 'v-p95' }, k.fmtDur(d.p95 ?? NaN)))),
    C.spark(x.series || [], 'started', { over: 'failed', unit: 'runs', label: `runs of ${x.skill} per interval` }),
    k.h('div', { class: 'notes' }, notes));
  }

  function overview(params, k) {
    const w = windowOf(params);
    document.title = 'Health · moonloop';
    const box = k.h('div', { class: 'hcards', id: 'health-cards' });
    const info = k.h('span', { class: 'count', id: 'health-count' }, 'loading…');
    k.draw(k.h('div', { class: 'title-row' }, k.h('h1', null, 'Health'), info, k.h('span', { class: 'spacer' }),
      windowSwitch(k, '#/health', w)), box);
    let lastKey = '';
    k.poll(k.my, async () => {
      const st = await k.api('/v1/stats?since=' + w);
      if (!k.current()) return false;
      const key = JSON.stringify(st.skills);
      if (key === lastKey) return true;
      lastKey = key;
      const skills = st.skills || [];
      info.textContent = `${skills.length} skill${skills.length === 1 ? '' : 's'} · last ${w} by ${st.interval} · compared with the ${w} before`;
      box.dataset.since = st.since;
      box.dataset.until = st.until;
      box.dataset.interval = st.interval;
      box.dataset.intervalMs = st.interval_ms;
      box.replaceChildren(...(skills.length ? skills.map((x) => card(k, x, w))
        : [k.h('div', { class: 'empty' }, 'No skill has runs in this window, and none is registered.')]));
      return true;
    }, STATS_POLL_MS[w]);
  }

  /* ---- one skill ---------------------------------------------------------------------- */

  function chartBox(k, id, heading, svg, legend) {
    return k.h('section', { class: 'hchart', id }, k.h('h3', null, heading),
      legend ? k.h('div', { class: 'legend' }, legend.map(([cls, label]) => k.h('span', null, k.h('i', { class: 'sw ' + cls }), label))) : null,
      svg);
  }

  function stepsTable(k, rows, slow) {
    if (!rows.length) return k.h('p', { class: 'sub' }, slow ? 'No step took any time here.' : 'No step failed or retried in this window.');
    return k.h('table', { class: 'steps-stats ' + (slow ? 'slowest' : 'failing') },
      k.h('thead', null, k.h('tr', null, k.h('th', null, 'Step'),
        slow ? [k.h('th', { class: 'num' }, 'p50'), k.h('th', { class: 'num' }, 'p95'), k.h('th', { class: 'num' }, 'p99'),
          k.h('th', { class: 'num' }, 'max'), k.h('th', { class: 'num' }, 'sampled')]
          : [k.h('th', { class: 'num' }, 'failed'), k.h('th', { class: 'num' }, 'retries')])),
      k.h('tbody', null, rows.map((s) => k.h('tr', { dataset: { step: s.step, failed: s.failed ?? '', retries: s.retries ?? '', p95: s.p95 ?? '' } },
        k.h('td', null, k.h('code', null, s.step), s.kind !== 'run' ? k.h('span', { class: 'sub' }, s.kind) : null),
        slow ? [k.h('td', { class: 'num' }, k.fmtDur(s.p50)), k.h('td', { class: 'num' }, k.fmtDur(s.p95)),
          k.h('td', { class: 'num' }, k.fmtDur(s.p99)), k.h('td', { class: 'num' }, k.fmtDur(s.max)), k.h('td', { class: 'num' }, count(s.n))]
          : [k.h('td', { class: 'num' + (s.failed ? ' bad' : '') }, count(s.failed)), k.h('td', { class: 'num' }, count(s.retries))]))));
  }

  /* The form that starts a run of the skill with JSON input. */
  function invokeForm(k, id) {
    const data = k.h('textarea', { id: 'invoke-data', name: 'data', rows: 4, spellcheck: 'false', class: 'mono' }, '{}');
    const result = k.h('p', { id: 'invoke-result', class: 'sub', 'aria-live': 'polite' });
    const form = k.h('form', {
      class: 'jsonform', id: 'invoke-form',
      onsubmit: async (e) => {
        e.preventDefault();
        let input;
        try { input = JSON.parse(data.value || 'null'); } catch (err) {
          result.textContent = 'The input is not JSON: ' + err.message;
          result.className = 'bad';
          return;
        }
        try {
          const r = await k.api(`/v1/skills/${k.enc(id)}/invoke`, 'POST', { data: input });
          result.className = 'ok';
          result.replaceChildren('Started run ', k.runLink(r.run_id), '.');
          result.dataset.runId = r.run_id;
          k.flash(`Invoked ${id}: run ${r.run_id}.`);
        } catch (err) {
          if (err.status === 401) { k.askToken(err); return; }
          result.className = 'bad';
          result.textContent = err.message;
        }
      },
    },
    k.h('label', { for: 'invoke-data' }, 'Input (JSON)'), data,
    k.h('div', null, k.h('button', { type: 'submit', class: 'primary', id: 'invoke-go' }, 'Invoke ' + id)), result);
    return k.h('section', { class: 'panel' }, k.h('h2', null, 'Invoke'), form);
  }

  function skillHealth(id, params, k) {
    const w = windowOf(params);
    document.title = `${id} · Health · moonloop`;
    const body = k.h('div', { id: 'skill-health' }, k.h('p', { class: 'count' }, 'loading…'));
    k.draw(k.h('div', { class: 'title-row' },
      k.h('h1', null, k.h('a', { href: `#/health?window=${w}` }, 'Health'), ' / ', id),
      k.h('a', { href: '#/runs?skill=' + k.enc(id) }, 'runs'), k.h('span', { class: 'spacer' }),
      windowSwitch(k, '#/health/' + k.enc(id), w)), body, invokeForm(k, id));
    let lastKey = '';
    k.poll(k.my, async () => {
      let st;
      try {
        st = await k.api(`/v1/skills/${k.enc(id)}/stats?since=${w}`);
      } catch (e) {
        if (e.status === 404 && k.current()) body.replaceChildren(k.h('div', { class: 'empty' }, e.message));
        throw e;
      }
      if (!k.current()) return false;
      const key = JSON.stringify([st.series, st.totals, st.versions, st.slowest_steps, st.failing_steps]);
      if (key === lastKey) return true;
      lastKey = key;
      const t = st.totals, p = st.previous || {}, d = t.duration_ms, s = st.series;
      const opts = (o) => Object.assign({ interval: st.interval_ms, versions: st.versions }, o);
      const ms = (v) => k.fmtDur(v);
      const facts = k.h('dl', { class: 'facts', id: 'skill-totals',
        dataset: { started: t.started, completed: t.completed, failed: t.failed, cancelled: t.cancelled, active: t.active,
          failureRate: t.failure_rate ?? '', p50: d.p50 ?? '', p95: d.p95 ?? '', p99: d.p99 ?? '', retries: t.retries,
          tokens: t.tokens, steps: t.steps, since: st.since, until: st.until, interval: st.interval,
          intervalMs: st.interval_ms } },
      k.h('dt', null, 'Runs'), k.h('dd', null, `${count(t.started)} started · ${count(t.completed)} completed · `,
        k.h('span', { class: t.failed ? 'bad' : '' }, `${count(t.failed)} failed`), ` · ${count(t.cancelled)} cancelled${t.skipped ? ` · ${count(t.skipped)} skipped` : ''} · ${count(t.active)} active`),
      k.h('dt', null, 'Failure rate'), k.h('dd', null, pct(t.failure_rate), k.h('span', { class: 'sub' }, `the ${w} before: ${pct(p.failure_rate)}`)),
      k.h('dt', null, 'Duration'), k.h('dd', null, `p50 ${ms(d.p50 ?? NaN)} · p95 ${ms(d.p95 ?? NaN)} · p99 ${ms(d.p99 ?? NaN)}`,
        k.h('span', { class: 'sub' }, `the ${w} before: p95 ${ms((p.duration_ms || {}).p95 ?? NaN)}`)),
      k.h('dt', null, 'Queue wait'), k.h('dd', null, `p50 ${ms(t.queue_wait_ms.p50 ?? NaN)} · p95 ${ms(t.queue_wait_ms.p95 ?? NaN)}`),
      k.h('dt', null, 'Steps'), k.h('dd', null, `${count(t.steps)} steps · ${count(t.retries)} retries · ${count(t.failed_steps)} failed · p95 ${ms(t.step_duration_ms.p95 ?? NaN)}`),
      k.h('dt', null, 'LLM tokens'), k.h('dd', null, count(t.tokens)));
      const sample = st.step_sample || {};
      const sampled = sample.runs < sample.of ? k.h('p', { class: 'sub' }, `Step durations from ${count(sample.runs)} of ${count(sample.of)} ended runs, spread over the window.`) : null;
      const versions = (st.versions || []).slice().reverse();
      body.replaceChildren(
        k.h('div', { class: 'panel' }, facts),
        k.h('p', { class: 'sub' }, `${st.series.length} intervals of ${st.interval} from ${k.fmtTime(st.since)}; ▼ marks a deploy.`),
        k.h('div', { class: 'hcharts' },
          chartBox(k, 'chart-runs', 'Runs per interval, by outcome',
            C.stacked(s, [{ key: 'completed', cls: 'c-ok', label: 'completed' }, { key: 'failed', cls: 'c-fail', label: 'failed' },
              { key: 'cancelled', cls: 'c-off', label: 'cancelled' }, { key: 'active', cls: 'c-run', label: 'active' }],
            opts({ label: 'runs per interval by outcome' })),
            [['c-ok', 'completed'], ['c-fail', 'failed'], ['c-off', 'cancelled'], ['c-run', 'active']]),
          chartBox(k, 'chart-failure', 'Failure rate', C.bars(s, 'failure_rate', opts({ barCls: 'c-fail', fmt: pct, label: 'failure rate' }))),
          chartBox(k, 'chart-duration', 'Run duration',
            C.lines(s, [{ key: 'p50', cls: 'l1', label: 'p50' }, { key: 'p95', cls: 'l2', label: 'p95' }, { key: 'p99', cls: 'l3', label: 'p99' }],
              opts({ fmt: ms, label: 'run duration percentiles' })), [['l1', 'p50'], ['l2', 'p95'], ['l3', 'p99']]),
          chartBox(k, 'chart-wait', 'Queue wait (p95)', C.lines(s, [{ key: 'queue_wait_p95', cls: 'l2', label: 'p95' }], opts({ fmt: ms, label: 'queue wait p95' }))),
          chartBox(k, 'chart-steps', 'Step duration (p95, sampled)', C.lines(s, [{ key: 'step_p95', cls: 'l2', label: 'p95' }], opts({ fmt: ms, label: 'step duration p95' }))),
          chartBox(k, 'chart-retries', 'Retries', C.bars(s, 'retries', opts({ barCls: 'c-wait', label: 'retries per interval' }))),
          chartBox(k, 'chart-tokens', 'LLM tokens', C.bars(s, 'tokens', opts({ barCls: 'c-run', fmt: count, label: 'LLM tokens per interval' })))),
        k.h('div', { class: 'cols' },
          k.h('div', null, k.h('h2', null, 'Slowest steps'), stepsTable(k, st.slowest_steps || [], true), sampled),
          k.h('div', null, k.h('h2', null, 'Most failing steps'), stepsTable(k, st.failing_steps || [], false))),
        k.h('h2', null, `Versions loaded in the last ${w}`),
        versions.length ? k.h('ul', { class: 'versions', id: 'skill-versions' }, versions.map((v) => k.h('li', { dataset: { version: v.version } },
          k.h('a', { href: '#/versions/' + k.enc(v.version), class: 'mono' }, k.short(v.version)),
          v.version === st.version ? k.h('span', { class: 'live-tag' }, 'live') : null, ' ',
          k.h('time', { datetime: v.loaded_at, class: 'sub' }, 'loaded ' + k.fmtTime(v.loaded_at)))))
          : k.h('p', { class: 'sub', id: 'skill-versions' }, st.version_before ? `None; ${k.short(st.version_before.version)} was loaded before (${k.fmtTime(st.version_before.loaded_at)}).` : 'None.'));
      return true;
    }, STATS_POLL_MS[w]);
  }

  /* ---- events ---------------------------------------------------------------------------- */

  function sendForm(k, onSent) {
    const name = k.h('input', { type: 'text', id: 'send-name', name: 'name', required: true, placeholder: 'order.created', autocomplete: 'off' });
    const data = k.h('textarea', { id: 'send-data', name: 'data', rows: 3, spellcheck: 'false', class: 'mono' }, '{}');
    const key = k.h('input', { type: 'text', id: 'send-key', name: 'id', placeholder: 'optional idempotency key', autocomplete: 'off' });
    const result = k.h('p', { id: 'send-result', class: 'sub', 'aria-live': 'polite' });
    return k.h('section', { class: 'panel' }, k.h('h2', null, 'Send an event'), k.h('form', {
      class: 'jsonform', id: 'send-form',
      onsubmit: async (e) => {
        e.preventDefault();
        let payload;
        try { payload = JSON.parse(data.value || 'null'); } catch (err) {
          result.className = 'bad';
          result.textContent = 'The data is not JSON: ' + err.message;
          return;
        }
        const ev = { name: name.value.trim(), data: payload };
        if (key.value.trim()) ev.id = key.value.trim();
        try {
          const r = await k.api('/v1/events', 'POST', ev);
          result.className = 'ok';
          result.dataset.eventId = r.ids[0];
          result.textContent = `Sent ${ev.name}: event ${r.ids[0]}.`;
          onSent();
        } catch (err) {
          if (err.status === 401) { k.askToken(err); return; }
          result.className = 'bad';
          result.textContent = err.message;
        }
      },
    },
    k.h('div', { class: 'row' }, k.h('label', null, 'Name', name), k.h('label', null, 'Idempotency key', key)),
    k.h('label', { for: 'send-data' }, 'Data (JSON)'), data,
    k.h('div', null, k.h('button', { type: 'submit', class: 'primary', id: 'send-go' }, 'Send')), result));
  }

  function eventRow(k, ev) {
    const text = ev.data === null && ev.data_bytes ? `(${count(ev.data_bytes)} bytes)` : JSON.stringify(ev.data);
    return k.h('tr', { dataset: { id: ev.id, name: ev.name, runs: ev.runs.length, dispatched: ev.dispatched ? '1' : '0' } },
      k.h('td', { class: 'when' }, k.when(ev.ts)),
      k.h('td', null, k.h('strong', null, ev.name), k.h('span', { class: 'sub mono' }, ev.id)),
      k.h('td', { class: 'data' }, k.h('code', { title: text }, text.length > 120 ? text.slice(0, 117) + '…' : text)),
      k.h('td', null, ev.runs.length ? k.h('ul', { class: 'ev-runs' }, ev.runs.map((r) => k.h('li', { dataset: { run: r.id, skill: r.skill, status: r.status } },
        k.badge(r.status), ' ', k.h('a', { href: '#/health/' + k.enc(r.skill) }, r.skill), ' ', k.runLink(r.id, k.short(r.id)))))
        : k.h('span', { class: 'sub' }, ev.dispatched ? 'started no run' : 'not dispatched yet')));
  }

  function eventsView(params, k) {
    document.title = 'Events · moonloop';
    const box = k.h('div', { id: 'events-box' });
    let refresh = () => {};
    k.draw(k.h('div', { class: 'title-row' }, k.h('h1', null, 'Events'), k.h('span', { class: 'count' }, 'the 50 most recent, newest first')),
      sendForm(k, () => refresh()), box);
    let lastKey = '';
    const load = async () => {
      const d = await k.api('/v1/events?limit=50');
      if (!k.current()) return false;
      const key = JSON.stringify(d.events);
      if (key === lastKey) return true;
      lastKey = key;
      box.replaceChildren(d.events.length ? k.h('table', { class: 'events', id: 'events' },
        k.h('thead', null, k.h('tr', null, k.h('th', null, 'Received'), k.h('th', null, 'Event'), k.h('th', null, 'Data'), k.h('th', null, 'Runs it started'))),
        k.h('tbody', null, d.events.map((ev) => eventRow(k, ev))))
        : k.h('div', { class: 'empty' }, 'No event yet.'));
      return true;
    };
    refresh = () => { load().catch(() => {}); };
    k.poll(k.my, load, EVENTS_POLL_MS);
  }

  views.health = (path, params, k) => (path.length ? skillHealth(path[0], params, k) : overview(params, k));
  views.events = (path, params, k) => eventsView(params, k);
})();
