/*
 * moonloop dashboard: one page over the engine's HTTP API, in plain
 * JavaScript (no framework, no build step, nothing fetched from elsewhere).
 *
 * Views, by location.hash:
 *   #/runs?skill=&status=&trigger=&since=&parent=&before=&limit=
 *                                                            the run list, polled every 1.5 s
 *   #/runs/ID                                                one run: error, waterfall of steps,
 *                                                            attempts, logs, input and output,
 *                                                            children; polled until it has ended
 *   #/skills                                                 the registry: versions, load errors
 *   #/versions/HASH?line=N                                   the source of a version
 *   #/health, #/health/SKILL, #/events                       health.js's views (window.moonloopViews),
 *                                                            given the helpers below by kit()
 *
 * Every view is drawn from scratch from the API's JSON (no state kept but
 * what the user opened); a generation number stops the answers of a view
 * that was left from touching the page. When the engine has a token
 * (MOONLOOP_TOKEN), the first 401 asks for it; it is kept in sessionStorage
 * (this tab only) and sent as "Authorization: Bearer" with every request.
 * All text from the API goes into the page as text nodes, never as HTML.
 */
'use strict';
(function () {
  const POLL_MS = 1500;
  const SKILLS_POLL_MS = 3000;
  const PAGE = 50;
  const TOKEN_KEY = 'moonloop.token';
  /* The engine's words (base/vocab.h), from vocab.js, written at build time. */
  const VOCAB = window.moonloopVocab;
  const FINISHED = new Set(VOCAB.ended);
  /* An attempt cut when its process stopped: it ended at an unknown time,
   * before the step ran again (its retry_at). */
  const INTERRUPTED = 'interrupted';
  const STATUSES = VOCAB.runStatuses;
  const TRIGGERS = VOCAB.triggerKinds;
  const SINCES = ['1h', '6h', '24h', '7d', '30d'];

  const main = document.getElementById('main');
  const banner = document.getElementById('banner');
  const live = document.getElementById('live');
  const forget = document.getElementById('forget');

  let gen = 0;           /* bumped by every navigation: older answers are dropped */
  let timer = null;      /* the pending poll of the current view */
  let flashTimer = null;
  const versionCache = new Map(); /* hash -> {version, skill, file, source}: versions never change */

  /* ---- DOM helpers -------------------------------------------------------- */

  /* h('a', {href: '#/x', class: 'y'}, 'text', child...): an element; null and false children are skipped. */
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v == null || v === false) continue;
        if (k === 'class') el.className = v;
        else if (k === 'style') Object.assign(el.style, v);
        else if (k === 'dataset') Object.assign(el.dataset, v);
        else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
        else if (k === 'value') el.value = v;
        else el.setAttribute(k, v === true ? '' : String(v));
      }
    }
    add(el, kids);
    return el;
  }

  function add(el, kids) {
    for (const k of kids.flat(Infinity)) {
      if (k == null || k === false) continue;
      el.append(k instanceof Node ? k : String(k));
    }
    return el;
  }

  function enc(s) { return encodeURIComponent(s); }

  /* Redraw the main area with nodes, keeping the focused control, the open
   * <details> and the scroll position when the same ones exist afterwards. */
  function draw(...nodes) {
    const active = document.activeElement;
    const fk = active && active.dataset ? active.dataset.fk : null;
    const open = new Set([...main.querySelectorAll('details[data-fk]')].filter((d) => d.open).map((d) => d.dataset.fk));
    const closed = new Set([...main.querySelectorAll('details[data-fk]')].filter((d) => !d.open).map((d) => d.dataset.fk));
    const y = window.scrollY;
    main.replaceChildren(...nodes.flat().filter(Boolean));
    for (const d of main.querySelectorAll('details[data-fk]')) {
      if (open.has(d.dataset.fk)) d.open = true;
      else if (closed.has(d.dataset.fk)) d.open = false;
    }
    if (fk) {
      const again = main.querySelector(`[data-fk="${CSS.escape(fk)}"]`);
      if (again) again.focus({ preventScroll: true });
    }
    window.scrollTo(0, y);
  }

  /* ---- formatting ----------------------------------------------------------- */

  function ms(iso) { return iso ? Date.parse(iso) : NaN; }

  /* "Nov 29 03:00:12" in local time ("2025 Nov 29 ..." for another year). */
  function fmtTime(iso) {
    if (!iso) return '—';
    const d = new Date(iso);
    if (isNaN(d)) return String(iso);
    const opts = { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false };
    if (d.getFullYear() !== new Date().getFullYear()) opts.year = 'numeric';
    return d.toLocaleString(undefined, opts);
  }

  /* 850 ms, 4.2 s, 3m 12s, 2h 03m, 3d 4h. */
  function fmtDur(n) {
    if (!isFinite(n)) return '—';
    if (n < 0) n = 0;
    if (n < 1000) return Math.round(n) + ' ms';
    const s = n / 1000;
    if (s < 60) return (s < 10 ? s.toFixed(1) : Math.round(s)) + ' s';
    const m = Math.floor(s / 60);
    if (m < 60) return m + 'm ' + String(Math.floor(s % 60)).padStart(2, '0') + 's';
    const hrs = Math.floor(m / 60);
    if (hrs < 48) return hrs + 'h ' + String(m % 60).padStart(2, '0') + 'm';
    return Math.floor(hrs / 24) + 'd ' + (hrs % 24) + 'h';
  }

  function fmtAgo(iso) {
    const t = ms(iso);
    if (!isFinite(t)) return '';
    const d = Date.now() - t;
    if (d < -1000) return 'in ' + fmtDur(-d);
    if (d < 5000) return 'just now';
    return fmtDur(d) + ' ago';
  }

  /* An absolute time with its relative age under it; the ISO time in the tooltip. */
  function when(iso, extra) {
    if (!iso) return h('span', { class: 'sub' }, extra || '—');
    return [h('time', { datetime: iso, title: iso }, fmtTime(iso)),
      h('span', { class: 'sub rel', dataset: { ts: iso } }, (extra ? extra + ' · ' : '') + fmtAgo(iso))];
  }

  /* Scroll to an element of the view by id (in-page links do not change the route). */
  function scrollTo_(id) {
    const el = document.getElementById(id);
    if (el) el.scrollIntoView({ block: 'start' });
  }

  function refreshAges() {
    for (const el of main.querySelectorAll('.rel[data-ts]')) {
      const txt = el.textContent;
      const i = txt.indexOf(' · ');
      el.textContent = (i >= 0 ? txt.slice(0, i + 3) : '') + fmtAgo(el.dataset.ts);
    }
    for (const el of main.querySelectorAll('.live-dur[data-start]')) {
      el.textContent = fmtDur(Date.now() - ms(el.dataset.start)) + (el.dataset.suffix || '');
    }
  }

  /* The duration since start of something still going, kept current by
   * refreshAges (so a page need not be drawn again to show it grow). */
  function liveDur(start, suffix) {
    return h('span', { class: 'live-dur', dataset: { start, suffix: suffix || '' } },
      fmtDur(Date.now() - ms(start)) + (suffix || ''));
  }

  /* Whether the page should be drawn again although its data did not
   * change (the bars of running steps grow): not while the reader selects
   * text (a redraw drops the selection), not for large records (drawing a
   * megabyte of JSON blocks the tab for seconds), and at most every 10 s. */
  let lastDraw = 0;
  function redrawIdle(key) {
    const sel = window.getSelection && String(window.getSelection());
    if (sel || key.length > 200000 || Date.now() - lastDraw < 10000) return false;
    return true;
  }
  function drew() { lastDraw = Date.now(); }

  /* A long text (an error of 100 kB) cut to its start, with a control that
   * shows all of it: a list row or an error box stays readable. */
  function longText(text, max, render) {
    text = String(text);
    if (text.length <= max) return render(text);
    const box = h('span', { class: 'long' });
    const more = h('button', { type: 'button', class: 'more', onclick: () => { box.replaceChildren(); add(box, [render(text)]); } },
      `show all ${fmtSize(text.length)}`);
    return add(box, [render(text.slice(0, max) + '…'), ' ', more]);
  }
  function fmtSize(n) {
    return n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + ' MB' : n >= 1024 ? Math.round(n / 1024) + ' kB' : n + ' bytes';
  }

  function badge(status, big) {
    const s = status || 'unknown';
    return h('span', { class: `badge s-${s}${big ? ' big' : ''}`, title: s }, s);
  }

  function runLink(id, text) {
    return h('a', { href: '#/runs/' + enc(id), class: 'mono', title: id }, text || id);
  }

  function short(hash) { return hash ? String(hash).slice(0, 12) : '—'; }

  /* A duration between two ISO times (the second missing: until now, while unfinished). */
  function span(a, b, running) {
    const t0 = ms(a);
    const t1 = b ? ms(b) : running ? Date.now() : NaN;
    return t1 - t0;
  }

  const JSON_SHOWN = 64 * 1024; /* characters of a JSON value shown before "show all" */

  /* JSON, pretty and coloured (keys, strings, numbers, booleans, null). */
  function jsonView(v) {
    const text = v === undefined ? 'undefined' : JSON.stringify(v, null, 2);
    if (text.length > JSON_SHOWN) {
      /* Coloured, a megabyte is tens of thousands of elements: its start,
       * plain, and the rest on demand. */
      const pre = h('pre', { class: 'json' }, text.slice(0, JSON_SHOWN) + '\n…');
      const box = h('div', null, pre);
      box.append(h('button', { type: 'button', class: 'more', onclick: () => box.replaceChildren(h('pre', { class: 'json' }, text)) },
        `show all ${fmtSize(text.length)}`));
      return box;
    }
    const pre = h('pre', { class: 'json' });
    const re = /("(?:\\.|[^"\\])*")(\s*:)?|\b(true|false)\b|\b(null)\b|(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)/g;
    let last = 0, m;
    while ((m = re.exec(text))) {
      if (m.index > last) pre.append(text.slice(last, m.index));
      const cls = m[1] ? (m[2] ? 'k' : 's') : m[3] ? 'b' : m[4] ? 'z' : 'n';
      pre.append(h('span', { class: cls }, m[1] || m[0]));
      if (m[2]) pre.append(m[2]);
      last = re.lastIndex;
    }
    if (last < text.length) pre.append(text.slice(last));
    return pre;
  }

  /* Text with "file.lua:LINE" references to the run's version turned into links to its source. */
  function withSourceLinks(text, version, file) {
    const out = [];
    const base = file ? file.split('/').pop() : null;
    /* Each run of path characters is tried from its start only, and at most
     * 300 long: unbounded, an error of 100 kB of word characters took the
     * regex some 10^10 steps (a 28 s freeze of the tab). */
    const re = /(?<![\w.\/-])([\w.\/-]{1,300}\.lua):(\d+)/g;
    let last = 0, m;
    while ((m = re.exec(text))) {
      if (!version || !base || m[1].split('/').pop() !== base) continue;
      out.push(text.slice(last, m.index));
      out.push(h('a', { href: `#/versions/${enc(version)}?line=${m[2]}`, title: 'the source of this version' }, m[0]));
      last = re.lastIndex;
    }
    out.push(text.slice(last));
    return out;
  }

  /* ---- the API -------------------------------------------------------------- */

  const API_TIMEOUT = 8000; /* ms an answer may take before the engine counts as unreachable */

  class ApiError extends Error {
    constructor(status, code, message) { super(message); this.status = status; this.code = code; }
  }

  /* A request to the engine's API; body (when given) goes as JSON, with
   * its Content-Type, from this page's own origin. */
  async function api(path, method, body) {
    const headers = { Accept: 'application/json' };
    const tok = sessionStorage.getItem(TOKEN_KEY);
    if (tok) headers.Authorization = 'Bearer ' + tok;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let res, text;
    /* An engine that hangs (stopped, its loop stuck) answers nothing: the
     * page says so after API_TIMEOUT instead of showing "live" data. */
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), API_TIMEOUT);
    try {
      res = await fetch(path, { method: method || 'GET', headers, cache: 'no-store', signal: ctl.signal,
        body: body === undefined ? undefined : JSON.stringify(body) });
      text = await res.text();
    } catch (e) {
      throw new ApiError(0, 'offline', e.name === 'AbortError'
        ? `the engine did not answer within ${API_TIMEOUT / 1000} s`
        : 'cannot reach the engine (' + e.message + ')');
    } finally {
      clearTimeout(timer);
    }
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (!res.ok) {
      const er = (data && data.error) || {};
      throw new ApiError(res.status, er.code || 'http_' + res.status, er.message || `${res.status} ${res.statusText}`);
    }
    return data;
  }

  async function version(hash) {
    if (versionCache.has(hash)) return versionCache.get(hash);
    const v = await api('/v1/versions/' + enc(hash));
    versionCache.set(hash, v);
    return v;
  }

  /* ---- banner, live indicator, polling ------------------------------------- */

  function showError(e) {
    banner.className = 'banner error';
    banner.textContent = e.message || String(e);
    banner.hidden = false;
  }

  function flash(text) {
    banner.className = 'banner info';
    banner.textContent = text;
    banner.hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { if (banner.classList.contains('info')) banner.hidden = true; }, 8000);
  }

  function clearError() { if (banner.classList.contains('error')) banner.hidden = true; }

  function setLive(state, text) {
    live.className = 'live' + (state === 'ok' ? '' : ' ' + state);
    live.textContent = text;
  }

  /* Call fn now and every ms while the view is current (fn returning false
   * stops it: the thing shown can no longer change). */
  function poll(my, fn, every) {
    const tick = async () => {
      if (my !== gen) return;
      if (document.hidden) {
        setLive('paused', 'paused (tab hidden)');
        timer = setTimeout(tick, every || POLL_MS);
        return;
      }
      let again = true;
      try {
        again = await fn();
        if (my !== gen) return;
        clearError();
        setLive(again === false ? 'paused' : 'ok',
          (again === false ? 'final · ' : 'live · ') + new Date().toLocaleTimeString(undefined, { hour12: false }));
      } catch (e) {
        if (my !== gen) return;
        if (e.status === 401) { askToken(e); return; }
        showError(e);
        /* A refused request (a bad filter, a run that does not exist) will
         * be refused again: stop until the user changes something. */
        if (e.status >= 400 && e.status < 500) { setLive('paused', 'stopped'); return; }
        setLive('offline', 'offline · retrying');
      }
      if (my === gen && again !== false) timer = setTimeout(tick, every || POLL_MS);
    };
    tick();
  }

  /* ---- the token ------------------------------------------------------------ */

  function askToken(err) {
    gen++;
    clearTimeout(timer);
    const had = !!sessionStorage.getItem(TOKEN_KEY);
    setLive('paused', 'needs a token');
    const input = h('input', { type: 'password', name: 'token', id: 'token', autocomplete: 'off', required: true, 'aria-describedby': 'token-why' });
    const form = h('form', {
      onsubmit: (e) => {
        e.preventDefault();
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        forget.hidden = false;
        route();
      },
    },
    h('label', { for: 'token' }, 'API token'), input,
    h('button', { type: 'submit', class: 'primary' }, 'Open the dashboard'));
    banner.hidden = true;
    draw(h('section', { class: 'login panel' },
      h('h1', null, 'This engine needs its API token'),
      h('p', { id: 'token-why' }, had ? 'The token kept for this tab was refused (' + err.message + '). Type the right one.'
        : 'moonloop serve was started with a token (MOONLOOP_TOKEN). Type it once: it is kept for this tab only and sent with every request.'),
      form));
    input.focus();
  }

  forget.hidden = !sessionStorage.getItem(TOKEN_KEY);
  forget.addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    forget.hidden = true;
    route();
  });

  /* ---- triggers ------------------------------------------------------------- */

  /* What started a run, as nodes: the kind, then who or what. */
  function triggerInfo(run, full) {
    const t = run.trigger || {};
    const kind = h('span', { class: 'trig' }, t.kind || '?');
    const out = [kind];
    switch (t.kind) {
      case 'event': {
        const ev = t.event || {};
        out.push(' ', h('span', null, ev.name || t.name || ''));
        if (full && ev.id) out.push(h('span', { class: 'sub mono' }, 'event ' + ev.id + (ev.ts ? ' · ' + fmtTime(ev.ts) : '')));
        break;
      }
      case 'cron':
        out.push(' ', h('span', { class: 'mono' }, t.cron || ''), t.tz ? ' ' + t.tz : '');
        if (t.tick) out.push(h('span', { class: 'sub', title: t.tick }, 'tick ' + fmtTime(t.tick) +
          (t.catch_up ? ' · catch-up after downtime' : '')));
        break;
      case 'invoke':
        if (t.by) out.push(' by ', t.by);
        if (t.step) out.push(h('span', { class: 'sub' }, 'from step ', h('code', null, t.step)));
        break;
      case 'rerun':
        if (t.run_id) out.push(' of ', runLink(t.run_id, full ? t.run_id : t.run_id.slice(-8)));
        break;
      case 'on_failure':
        if (t.run_id) out.push(' of ', runLink(t.run_id, full ? t.run_id : t.run_id.slice(-8)));
        break;
      default:
        break;
    }
    if (run.parent_id) {
      out.push(h('span', { class: 'sub' }, 'child of ', runLink(run.parent_id, full ? run.parent_id : run.parent_id.slice(-8))));
    }
    return out;
  }

  /* Why a queued run waits (its record's `queued`), in words, as
   * `moonloop trace` says it: "concurrency limit 2 of scope openai, key ...". */
  function queuedText(q) {
    if (!q || typeof q !== 'object') return '';
    const of = q.scope ? 'scope ' + q.scope : 'skill ' + (q.skill || '?');
    const amount = q.limit !== undefined ? ` limit ${q.limit}${q.period ? ' per' : ''}` : '';
    return `${q.reason || '?'}${amount}${q.period ? ' ' + q.period : ''} of ${of}${q.key ? ', key ' + q.key : ''}${q.until ? ', until ' + q.until : ''}${q.position ? ', number ' + q.position + ' in the queue' : ''}`;
  }

  /* ---- the run list ------------------------------------------------------- */

  function runRow(run) {
    const running = !FINISHED.has(run.status);
    const started = run.started_at || null;
    const err = run.error;
    return h('tr', { dataset: { id: run.id, status: run.status } },
      h('td', null, badge(run.status)),
      h('td', { class: 'id' }, h('a', { href: '#/runs/' + enc(run.id), class: 'run-link', dataset: { nav: '1', fk: 'run:' + run.id } }, run.id)),
      h('td', null, h('a', { href: '#/runs?skill=' + enc(run.skill), title: 'runs of ' + run.skill }, run.skill),
        h('span', { class: 'sub mono', title: run.version }, short(run.version).slice(0, 8))),
      h('td', null, triggerInfo(run, false)),
      h('td', { class: 'when' }, started ? when(started) : when(run.created_at, 'queued')),
      h('td', { class: 'num' }, started ? (running && !run.ended_at ? liveDur(started, ' …') : fmtDur(span(started, run.ended_at, running))) : '—'),
      h('td', { class: 'err', title: err && err.message ? String(err.message).slice(0, 1000) : null },
        err && err.message ? [cut(String(err.message).split('\n')[0], 300), err.step ? h('span', { class: 'sub' }, 'step ', h('code', null, err.step)) : null]
          : run.queued ? h('span', { class: 'sub queued-reason' }, 'waiting: ' + queuedText(run.queued)) : ''));
  }

  function cut(text, max) { return text.length > max ? text.slice(0, max) + '…' : text; }

  function runTable(runs) {
    return h('table', { class: 'runs' },
      h('thead', null, h('tr', null,
        h('th', null, 'Status'), h('th', null, 'Run'), h('th', null, 'Skill'), h('th', null, 'Trigger'),
        h('th', null, 'Started'), h('th', { class: 'num' }, 'Duration'), h('th', null, 'Error'))),
      h('tbody', null, runs.map(runRow)));
  }

  function runsHash(f) {
    const q = new URLSearchParams();
    for (const k of ['skill', 'status', 'trigger', 'since', 'parent', 'before', 'limit']) if (f[k]) q.set(k, f[k]);
    const s = q.toString();
    return '#/runs' + (s ? '?' + s : '');
  }

  function runsView(params) {
    const my = gen;
    const f = {};
    for (const k of ['skill', 'status', 'trigger', 'since', 'parent', 'before', 'limit']) f[k] = params.get(k) || '';
    document.title = 'Runs · moonloop';

    const apply = () => {
      const next = { skill: skillSel.value, status: statusSel.value, trigger: trigSel.value, since: sinceIn.value.trim(), parent: f.parent, limit: f.limit };
      location.hash = runsHash(next);
    };
    const skillSel = h('select', { name: 'skill', id: 'f-skill', onchange: apply },
      h('option', { value: '' }, 'all skills'), f.skill ? h('option', { value: f.skill }, f.skill) : null);
    skillSel.value = f.skill;
    const statusSel = h('select', { name: 'status', id: 'f-status', onchange: apply },
      h('option', { value: '' }, 'any status'), STATUSES.map((s) => h('option', { value: s }, s)));
    statusSel.value = f.status;
    const trigSel = h('select', { name: 'trigger', id: 'f-trigger', onchange: apply },
      h('option', { value: '' }, 'any trigger'), TRIGGERS.map((s) => h('option', { value: s }, s)));
    trigSel.value = f.trigger;
    const sinceIn = h('input', { type: 'text', name: 'since', id: 'f-since', list: 'f-since-list', value: f.since,
      placeholder: '24h, 7d or 2026-01-31T03:00Z', title: 'a duration back from now, or an RFC 3339 time' });
    const form = h('form', { class: 'filters', role: 'search', onsubmit: (e) => { e.preventDefault(); apply(); } },
      h('label', null, 'Skill', skillSel), h('label', null, 'Status', statusSel), h('label', null, 'Trigger', trigSel),
      h('label', null, 'Since', sinceIn, h('datalist', { id: 'f-since-list' }, SINCES.map((s) => h('option', { value: s })))),
      h('button', { type: 'submit' }, 'Apply'),
      (f.skill || f.status || f.trigger || f.since || f.parent) ? h('a', { href: '#/runs' }, 'clear filters') : null);

    const chips = [];
    if (f.parent) chips.push(h('span', { class: 'chip' }, 'children of ', runLink(f.parent), ' ', h('a', { href: runsHash({ ...f, parent: '', before: '' }), 'aria-label': 'remove this filter' }, '×')));
    if (f.before) chips.push(h('span', { class: 'chip' }, 'older than ', runLink(f.before), ' ', h('a', { href: runsHash({ ...f, before: '' }) }, 'back to the newest')));
    const count = h('span', { class: 'count', id: 'runs-count' }, 'loading…');
    const head = h('div', { class: 'title-row' }, h('h1', null, 'Runs'), count, h('span', { class: 'spacer' }), chips);
    const box = h('div', { id: 'runs-box' });
    const pager = h('div', { class: 'pager' });
    draw(head, form, box, pager);

    /* The skill filter lists the registered skills (once per visit). */
    api('/v1/skills').then((d) => {
      if (my !== gen || !d) return;
      const ids = (d.skills || []).map((s) => s.id).filter((id) => id !== f.skill);
      add(skillSel, ids.map((id) => h('option', { value: id }, id)));
      skillSel.value = f.skill;
    }).catch(() => {});

    let lastKey = '';
    poll(my, async () => {
      const q = new URLSearchParams();
      for (const k of ['skill', 'status', 'trigger', 'since', 'parent', 'before']) if (f[k]) q.set(k, f[k]);
      q.set('limit', f.limit || String(PAGE));
      const d = await api('/v1/runs?' + q.toString());
      if (my !== gen) return false;
      const key = JSON.stringify(d);
      /* Unfinished runs' durations grow in place (refreshAges); the rows
       * are drawn again when the data changed. */
      if (key !== lastKey) {
        lastKey = key;
        const focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.fk : null;
        box.replaceChildren(d.runs.length ? runTable(d.runs)
          : h('div', { class: 'empty' }, 'No runs match these filters', f.since ? ' (since ' + f.since + ')' : '', '.'));
        if (focused) { const el = box.querySelector(`[data-fk="${CSS.escape(focused)}"]`); if (el) el.focus({ preventScroll: true }); }
        count.textContent = d.runs.length + (d.next ? '+' : '') + ' run' + (d.runs.length === 1 ? '' : 's') + (f.before ? ' (older page)' : '');
        pager.replaceChildren(...[
          f.before ? h('a', { href: runsHash({ ...f, before: '' }) }, '← Newest') : null,
          d.next ? h('a', { href: runsHash({ ...f, before: d.next }), id: 'older', rel: 'next' }, 'Older →') : null].filter(Boolean));
      } else {
        refreshAges();
      }
      return true;
    });
  }

  /* ---- one run ---------------------------------------------------------------- */

  function stepKey(s) { return 'step:' + s.seq + ':' + s.id; }

  function attemptsTable(step, run, file) {
    const rows = (step.attempts || []).map((a) => h('tr', { class: 'attempt', dataset: { n: a.n, status: a.status } },
      h('td', { class: 'num' }, '#' + a.n),
      h('td', null, badge(a.status)),
      h('td', { class: 'when' }, a.started_at ? h('time', { datetime: a.started_at, title: a.started_at }, fmtTime(a.started_at)) : '—'),
      h('td', { class: 'num' }, a.started_at && a.status !== INTERRUPTED ? fmtDur(span(a.started_at, a.ended_at, !FINISHED.has(a.status))) : '—'),
      h('td', { class: 'msg' }, a.error ? withSourceLinks(String(a.error), run.version, file) : '',
        a.traceback ? h('details', { dataset: { fk: stepKey(step) + ':tb:' + a.n } }, h('summary', null, 'traceback'), h('pre', null, withSourceLinks(a.traceback, run.version, file))) : null),
      h('td', { class: 'when' }, a.retry_at ? [a.status === INTERRUPTED ? 'ran again at ' : 'retry at ', h('time', { datetime: a.retry_at, title: a.retry_at }, fmtTime(a.retry_at))] : '')));
    return h('table', { class: 'attempts' },
      h('thead', null, h('tr', null, h('th', { class: 'num' }, 'Attempt'), h('th', null, 'Status'), h('th', null, 'Started'),
        h('th', { class: 'num' }, 'Took'), h('th', null, 'Error'), h('th', null, 'Next'))),
      h('tbody', null, rows));
  }

  function usageView(u) {
    if (!u || typeof u !== 'object') return null;
    const items = [];
    const names = { prompt_tokens: 'prompt tokens', completion_tokens: 'completion tokens', total_tokens: 'total tokens', input_tokens: 'input tokens', output_tokens: 'output tokens', calls: 'calls', model: 'model' };
    for (const [k, v] of Object.entries(u)) {
      if (v !== null && typeof v === 'object') continue;
      items.push(h('span', null, (names[k] || k.replace(/_/g, ' ')) + ' ', h('b', null, String(v))));
    }
    return [h('h3', null, 'LLM usage'), h('div', { class: 'usage' }, items)];
  }

  function logsView(logs) {
    if (!logs || !logs.length) return null;
    return h('ul', { class: 'logs' }, logs.map((l) => h('li', null,
      h('span', { class: 'ts', title: l.ts }, l.ts ? new Date(l.ts).toLocaleTimeString(undefined, { hour12: false }) + '.' + String(new Date(l.ts).getMilliseconds()).padStart(3, '0') : ''),
      h('span', { class: 'lv lv-' + (l.level || 'info') }, l.level || ''),
      l.msg)));
  }

  function stepDetail(step, run, file) {
    const running = !FINISHED.has(step.status);
    const facts = h('dl', { class: 'facts' },
      h('dt', null, 'Status'), h('dd', null, badge(step.status)),
      h('dt', null, 'Kind'), h('dd', null, step.kind || 'run'),
      h('dt', null, 'Started'), h('dd', null, step.started_at ? h('time', { datetime: step.started_at, title: step.started_at }, fmtTime(step.started_at)) : '—'),
      h('dt', null, 'Took'), h('dd', null, step.started_at ? fmtDur(span(step.started_at, step.ended_at, running)) : '—'),
      step.wake_at ? [h('dt', null, 'Wakes'), h('dd', null, fmtTime(step.wake_at))] : null,
      step.retry_at ? [h('dt', null, 'Next retry'), h('dd', null, fmtTime(step.retry_at))] : null);
    const child = step.kind === 'invoke' && step.output && step.output.run_id ? step.output.run_id : null;
    return h('div', { class: 'wf-detail', id: 'detail-' + step.seq },
      facts,
      step.error ? h('div', { class: 'error-box' }, h('div', { class: 'msg' }, longText(step.error, 2000, (t) => withSourceLinks(t, run.version, file)))) : null,
      child ? h('p', null, 'Child run: ', runLink(child)) : null,
      (step.attempts && step.attempts.length) ? [h('h3', null, `Attempts (${step.attempts.length})`), attemptsTable(step, run, file)] : null,
      usageView(step.usage),
      step.logs && step.logs.length ? [h('h3', null, `Logs (${step.logs.length})`), logsView(step.logs)] : null,
      step.output !== null && step.output !== undefined ? [h('h3', null, 'Output'), jsonView(step.output)] : null);
  }

  /* The waterfall: one row per step, its bar placed by its start and end
   * relative to the run's; a step retried shows each attempt as a bar over
   * a faint one for its whole span (backoff included). */
  function waterfall(run, open, file, rerender) {
    const steps = run.steps || [];
    if (!steps.length) return h('div', { class: 'empty' }, FINISHED.has(run.status) ? 'This run took no steps.' : 'No step yet.');
    const now = Date.now();
    const t0 = ms(run.started_at || run.created_at);
    let t1 = run.ended_at ? ms(run.ended_at) : now;
    for (const s of steps) {
      const e = s.ended_at ? ms(s.ended_at) : FINISHED.has(s.status) ? ms(s.started_at) : now;
      if (e > t1) t1 = e;
    }
    const total = Math.max(t1 - t0, 1);
    const pos = (a, b) => {
      const l = Math.min(Math.max((a - t0) / total, 0), 1);
      const w = Math.min(Math.max((b - a) / total, 0), 1 - l);
      return { left: (l * 100).toFixed(3) + '%', width: (w * 100).toFixed(3) + '%' };
    };
    const axis = h('div', { class: 'wf-axis', 'aria-hidden': 'true' }, h('span', { class: 'wf-name' }, 'step'),
      h('div', { class: 'ticks' }, [0, 0.25, 0.5, 0.75, 1].map((f) => h('span', { style: { left: f * 100 + '%' } }, fmtDur(total * f)))),
      h('span', { class: 'wf-dur' }, 'took'));
    const rows = steps.map((s) => {
      const key = stepKey(s);
      const isOpen = open.has(key);
      const a = ms(s.started_at);
      const b = s.ended_at ? ms(s.ended_at) : FINISHED.has(s.status) ? a : now;
      const bars = [];
      const atts = s.attempts || [];
      if (isFinite(a)) {
        if (atts.length > 1) {
          bars.push(h('span', { class: 'wf-bar span ' + s.status, style: pos(a, b) }));
          for (const t of atts) {
            /* An interrupted attempt ended somewhere before the step ran again. */
            const ta = ms(t.started_at), tb = t.ended_at ? ms(t.ended_at) : t.status === INTERRUPTED && t.retry_at ? ms(t.retry_at) : now;
            if (isFinite(ta)) bars.push(h('span', { class: 'wf-bar ' + (t.status || 'unknown'), style: pos(ta, tb), title: `attempt ${t.n}: ${t.status}` }));
          }
        } else {
          bars.push(h('span', { class: 'wf-bar ' + (s.status || 'unknown'), style: pos(a, b) }));
        }
      }
      const failed = s.status === 'failed';
      const line = h('button', {
        type: 'button', class: 'wf-line', 'aria-expanded': isOpen ? 'true' : 'false', 'aria-controls': 'detail-' + s.seq,
        dataset: { nav: '1', fk: key }, title: `${s.id}: ${s.status}`,
        onclick: () => { if (open.has(key)) open.delete(key); else open.add(key); rerender(); },
      },
      h('span', { class: 'wf-name' }, h('span', { class: 'caret' }, isOpen ? '▾' : '▸'), h('span', { class: 'sid' }, s.id),
        s.kind && s.kind !== 'run' ? h('span', { class: 'kind' }, s.kind) : null,
        atts.length > 1 ? h('span', { class: 'tries' }, `×${atts.length}`) : null,
        failed ? h('span', { class: 'badge s-failed' }, 'failed') : null),
      h('span', { class: 'wf-track' }, bars),
      h('span', { class: 'wf-dur' }, isFinite(a) ? fmtDur(b - a) + (s.ended_at || FINISHED.has(s.status) ? '' : ' …') : s.status));
      return h('div', { class: 'wf-row' + (failed ? ' failed' : ''), id: 'step-' + s.seq, dataset: { step: s.id, status: s.status } },
        line, isOpen ? stepDetail(s, run, file) : null);
    });
    return h('div', { class: 'wf', id: 'waterfall' }, axis, rows);
  }

  function runView(id) {
    const my = gen;
    const open = new Set();
    let first = true, lastKey = '', run = null, kids = [], file = null;
    draw(h('p', { class: 'count' }, 'Loading run ' + id + '…'));

    const render = () => {
      if (!run) return;
      const finished = FINISHED.has(run.status);
      document.title = `${run.status} · ${run.skill} · moonloop`;
      const cancel = h('button', { type: 'button', class: 'danger', id: 'cancel', disabled: finished, onclick: () => doCancel(run) }, 'Cancel');
      const rerun = h('button', { type: 'button', id: 'rerun', onclick: () => doRerun(run) }, 'Rerun');
      const head = h('div', { class: 'run-head' },
        h('h1', null, h('a', { href: '#/runs?skill=' + enc(run.skill) }, run.skill)), badge(run.status, true),
        h('span', { class: 'rid', title: 'run id' }, run.id), h('span', { class: 'spacer' }), cancel, rerun);
      const failStep = run.error && run.error.step ? (run.steps || []).find((s) => s.id === run.error.step) : null;
      const facts = h('dl', { class: 'facts' },
        h('dt', null, 'Trigger'), h('dd', null, triggerInfo(run, true)),
        h('dt', null, 'Version'), h('dd', null, run.version ? h('a', { href: '#/versions/' + enc(run.version), class: 'mono', title: run.version, id: 'version-link' }, short(run.version)) : '—',
          file ? h('span', { class: 'sub mono' }, file) : null),
        h('dt', null, 'Created'), h('dd', null, when(run.created_at)),
        run.queued ? [h('dt', null, 'Queued'), h('dd', { class: 'queued-reason', id: 'queued-reason' }, 'waiting: ' + queuedText(run.queued))] : null,
        h('dt', null, 'Started'), h('dd', null, when(run.started_at, run.status === 'queued' && !run.started_at ? 'not yet' : null)),
        h('dt', null, 'Ended'), h('dd', null, when(run.ended_at, finished ? null : 'not yet')),
        h('dt', null, 'Duration'), h('dd', null, run.started_at ? (finished || run.ended_at ? fmtDur(span(run.started_at, run.ended_at, false)) : liveDur(run.started_at, ' so far')) : '—'),
        run.parent_id ? [h('dt', null, 'Parent'), h('dd', null, runLink(run.parent_id))] : null,
        kids.length ? [h('dt', null, 'Children'), h('dd', null, h('a', { href: '#run-children', onclick: (e) => { e.preventDefault(); scrollTo_('run-children'); } }, kids.length + ' run' + (kids.length === 1 ? '' : 's')))] : null);
      const err = run.error ? h('section', { class: 'error-box', id: 'run-error', 'aria-label': 'error' },
        h('div', { class: 'msg' }, longText(run.error.message || JSON.stringify(run.error), 2000, (t) => withSourceLinks(t, run.version, file))),
        run.error.step ? h('div', { class: 'where' }, 'in step ',
          h('a', { href: '#step-' + (failStep ? failStep.seq : ''), onclick: (e) => { e.preventDefault(); if (failStep) { open.add(stepKey(failStep)); render(); scrollTo_('step-' + failStep.seq); } } }, h('code', null, run.error.step)),
          failStep && failStep.attempts && failStep.attempts.length ? ` after ${failStep.attempts.length} attempt${failStep.attempts.length === 1 ? '' : 's'}` : '') : null,
        run.error.traceback ? h('details', { open: true, dataset: { fk: 'run-tb' } }, h('summary', null, 'traceback'), h('pre', null, withSourceLinks(run.error.traceback, run.version, file))) : null) : null;
      const wf = waterfall(run, open, file, render);
      const io = h('div', { class: 'cols' },
        h('div', null, h('h2', null, 'Input'), jsonView(run.input === undefined ? null : run.input)),
        h('div', null, h('h2', null, 'Output'), run.output === null || run.output === undefined ? h('p', { class: 'sub' }, finished ? 'no output' : 'not yet') : jsonView(run.output)));
      const runLogs = run.logs && run.logs.length ? [h('h2', null, `Logs outside steps (${run.logs.length})`), logsView(run.logs)] : null;
      const children = kids.length ? [h('h2', { id: 'run-children' }, `Child runs (${kids.length})`), runTable(kids),
        h('p', null, h('a', { href: runsHash({ parent: run.id }) }, 'all children in the run list'))] : null;
      draw(h('div', { class: 'panel' }, head, facts), err,
        h('h2', null, `Steps (${(run.steps || []).length})`), wf, io, runLogs, children);
    };

    poll(my, async () => {
      let r, c;
      try {
        /* The record first: for an id that is no run id the children's
         * list is refused (400) too, and when that answer came first the
         * page showed it instead of "no run with id". */
        r = await api('/v1/runs/' + enc(id));
        c = await api('/v1/runs?parent=' + enc(id) + '&limit=100');
      } catch (e) {
        if (e.status === 404 && my === gen) {
          draw(h('div', { class: 'empty' }, e.message, '. ', h('a', { href: '#/runs' }, 'Back to the runs.')));
        }
        throw e;
      }
      if (my !== gen) return false;
      run = r;
      kids = (c && c.runs) || [];
      if (first) {
        first = false;
        /* The failed step is opened at once: its attempts and errors are what one came for. */
        const fs = r.error && r.error.step ? (r.steps || []).find((s) => s.id === r.error.step) : null;
        if (fs) open.add(stepKey(fs));
        if (r.version) {
          version(r.version).then((v) => { if (my === gen && v) { file = v.file; render(); } }).catch(() => {});
        }
      }
      const active = !FINISHED.has(r.status) || kids.some((k) => !FINISHED.has(k.status));
      const key = JSON.stringify([r, kids]);
      if (key !== lastKey || (active && redrawIdle(key))) { lastKey = key; render(); drew(); } else refreshAges();
      /* A finished run with finished children can no longer change. */
      return active;
    });
  }

  async function doCancel(run) {
    if (!window.confirm(`Cancel run ${run.id} of ${run.skill} (and its children)?`)) return;
    try {
      await api('/v1/runs/' + enc(run.id) + '/cancel', 'POST');
      flash(`Cancel requested for run ${run.id}.`);
      route();
    } catch (e) {
      if (e.status === 401) askToken(e); else showError(e);
    }
  }

  async function doRerun(run) {
    if (!window.confirm(`Start a new run of ${run.skill} with the same input as ${run.id}?`)) return;
    try {
      const r = await api('/v1/runs/' + enc(run.id) + '/rerun', 'POST');
      location.hash = '#/runs/' + enc(r.run_id);
      flash(`Rerun started: run ${r.run_id} (rerun of ${run.id}).`);
    } catch (e) {
      if (e.status === 401) askToken(e); else showError(e);
    }
  }

  /* ---- skills ------------------------------------------------------------------- */

  function triggerTags(triggers) {
    const list = Array.isArray(triggers) ? triggers : [];
    if (!list.length) return h('span', { class: 'sub' }, 'invoke only');
    return list.map((t) => h('span', { class: 'trig', title: JSON.stringify(t) },
      t.event ? 'event ' + t.event : t.cron ? 'cron ' + t.cron + (t.tz ? ' ' + t.tz : '') : JSON.stringify(t)));
  }

  function skillRow(s) {
    const versions = (s.versions || []).slice().reverse(); /* newest first */
    const e = s.error;
    return h('tr', { id: 'skill-' + s.id, dataset: { skill: s.id } },
      h('td', null, h('strong', null, s.id), s.description ? h('span', { class: 'sub' }, s.description) : null,
        s.file ? h('span', { class: 'sub mono' }, s.file) : null),
      h('td', null, s.version ? h('a', { href: '#/versions/' + enc(s.version), class: 'mono', title: s.version, dataset: { nav: '1', fk: 'skill:' + s.id } }, short(s.version)) : '—'),
      h('td', null, triggerTags(s.triggers), s.next_fire ? h('time', { class: 'sub next-fire', datetime: s.next_fire,
        title: s.next_fire }, 'next ' + fmtTime(s.next_fire) + ' (' + fmtAgo(s.next_fire) + ')') : null),
      h('td', null, h('ul', { class: 'versions' }, versions.map((v) => h('li', { dataset: { version: v.version } },
        h('a', { href: '#/versions/' + enc(v.version), class: 'mono', title: v.version }, short(v.version)),
        v.version === s.version ? h('span', { class: 'live-tag' }, 'live') : null, ' ',
        h('time', { datetime: v.loaded_at, title: v.loaded_at, class: 'sub' }, 'loaded ' + fmtTime(v.loaded_at)))))),
      h('td', { class: e ? 'skill-err' : '' }, e ? [h('div', { class: 'msg' }, e.message),
        h('span', { class: 'sub' }, [e.file ? e.file + (e.line != null ? ':' + e.line : '') : null, e.at ? fmtTime(e.at) + ' (' + fmtAgo(e.at) + ')' : null].filter(Boolean).join(' · '))]
        : h('span', { class: 'sub' }, 'none')),
      h('td', null, h('a', { href: '#/runs?skill=' + enc(s.id) }, 'runs'), ' · ',
        h('a', { href: '#/runs?skill=' + enc(s.id) + '&status=failed' }, 'failed')));
  }

  function skillsView() {
    const my = gen;
    document.title = 'Skills · moonloop';
    const count = h('span', { class: 'count' }, 'loading…');
    const box = h('div', { id: 'skills-box' });
    draw(h('div', { class: 'title-row' }, h('h1', null, 'Skills'), count), box);
    let lastKey = '';
    poll(my, async () => {
      const d = await api('/v1/skills');
      if (my !== gen) return false;
      const key = JSON.stringify(d);
      if (key === lastKey) return true;
      lastKey = key;
      const skills = d.skills || [];
      const broken = skills.filter((s) => s.error);
      count.textContent = skills.length + ' registered' + (broken.length ? ` · ${broken.length} with a load error` : '');
      box.replaceChildren(skills.length ? h('table', { class: 'skills' },
        h('thead', null, h('tr', null, h('th', null, 'Skill'), h('th', null, 'Live version'), h('th', null, 'Triggers'),
          h('th', null, 'Versions'), h('th', null, 'Last load error'), h('th', null, ''))),
        h('tbody', null, skills.map(skillRow)))
        : h('div', { class: 'empty' }, 'No skill is registered yet: put .lua files in the workspace folder of moonloop serve.'));
      return true;
    }, SKILLS_POLL_MS);
  }

  /* ---- a version's source -------------------------------------------------------- */

  function versionView(hash, params) {
    const my = gen;
    const line = parseInt(params.get('line') || '', 10);
    document.title = 'Source ' + short(hash) + ' · moonloop';
    draw(h('p', { class: 'count' }, 'Loading version ' + short(hash) + '…'));
    setLive('paused', 'source');
    version(hash).then((v) => {
      if (my !== gen) return;
      const lines = String(v.source || '').split('\n');
      if (lines.length > 1 && lines[lines.length - 1] === '') lines.pop();
      const pre = h('pre', { class: 'source', id: 'source', tabindex: '0' },
        lines.map((t, i) => h('span', { class: 'l' + (i + 1 === line ? ' hl' : ''), id: 'L' + (i + 1) }, t || ' ')));
      draw(h('div', { class: 'panel' },
        h('div', { class: 'run-head' }, h('h1', null, v.skill ? h('a', { href: '#/runs?skill=' + enc(v.skill) }, v.skill) : 'version'),
          h('span', { class: 'mono' }, v.file || ''), h('span', { class: 'spacer' }), h('a', { href: '#/skills' }, 'all skills')),
        h('p', { class: 'sub mono' }, 'version ' + v.version)), h('h2', null, `Source (${lines.length} lines)`), pre);
      if (line > 0) { const el = document.getElementById('L' + line); if (el) el.scrollIntoView({ block: 'center' }); }
    }).catch((e) => {
      if (my !== gen) return;
      if (e.status === 401) askToken(e);
      else draw(h('div', { class: 'empty' }, 'Cannot show version ' + hash + ': ' + e.message));
    });
  }

  /* ---- routing and keys ----------------------------------------------------------- */

  /* What the views of other files (health.js: window.moonloopViews) get. */
  function kit(my) {
    return { my, current: () => my === gen, h, add, api, draw, poll, enc, ms, fmtTime, fmtDur, fmtAgo,
      when, badge, runLink, short, jsonView, flash, showError, clearError, setLive, askToken, FINISHED };
  }
  const views = window.moonloopViews || {};

  function route() {
    gen++;
    clearTimeout(timer);
    timer = null;
    const raw = location.hash.replace(/^#/, '') || '/runs';
    const qi = raw.indexOf('?');
    const path = (qi >= 0 ? raw.slice(0, qi) : raw).split('/').filter(Boolean).map(decodeURIComponent);
    const params = new URLSearchParams(qi >= 0 ? raw.slice(qi + 1) : '');
    const section = path[0] === 'skills' || path[0] === 'versions' ? 'skills' : views[path[0]] ? path[0] : 'runs';
    for (const a of document.querySelectorAll('.top nav a')) a.toggleAttribute('aria-current', false);
    document.getElementById('nav-' + section).setAttribute('aria-current', 'page');
    if (views[path[0]]) views[path[0]](path.slice(1), params, kit(gen));
    else if (!path.length || (path[0] === 'runs' && path.length === 1)) runsView(params);
    else if (path[0] === 'runs') runView(path[1]);
    else if (path[0] === 'skills') skillsView();
    else if (path[0] === 'versions' && path[1]) versionView(path[1], params);
    else draw(h('div', { class: 'empty' }, 'Nothing here. ', h('a', { href: '#/runs' }, 'Go to the runs.')));
  }

  /* Move the focus to the next (dir 1) or previous (-1) row of the view. */
  function moveFocus(dir) {
    const items = [...main.querySelectorAll('[data-nav]')];
    if (!items.length) return;
    const i = items.indexOf(document.activeElement);
    const next = items[i < 0 ? (dir > 0 ? 0 : items.length - 1) : Math.min(Math.max(i + dir, 0), items.length - 1)];
    next.focus();
    next.scrollIntoView({ block: 'nearest' });
  }

  let gPending = false;
  document.addEventListener('keydown', (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const t = e.target;
    if (t && t.closest && t.closest('input, select, textarea')) {
      if (e.key === 'Escape') t.blur();
      return;
    }
    if (gPending) {
      gPending = false;
      if (e.key === 'r') location.hash = '#/runs';
      else if (e.key === 's') location.hash = '#/skills';
      else if (e.key === 'h') location.hash = '#/health';
      else if (e.key === 'e') location.hash = '#/events';
      return;
    }
    switch (e.key) {
      case 'g': gPending = true; setTimeout(() => { gPending = false; }, 1500); break;
      case '/': {
        const f = document.getElementById('f-skill');
        if (f) { e.preventDefault(); f.focus(); }
        break;
      }
      case 'j': moveFocus(1); break;
      case 'k': moveFocus(-1); break;
      case '.': route(); break;
      case 'Escape':
        if (/^#\/(runs\/|versions\/)/.test(location.hash)) {
          if (history.length > 1) history.back(); else location.hash = '#/runs';
        }
        break;
      default: break;
    }
  });

  window.addEventListener('hashchange', () => {
    /* A link to an anchor inside a view (#step-3, #run-children) is not a route. */
    if (!location.hash.startsWith('#/') && location.hash !== '') {
      scrollTo_(location.hash.slice(1));
      return;
    }
    route();
    main.focus({ preventScroll: true });
    window.scrollTo(0, 0);
  });

  route();
})();
