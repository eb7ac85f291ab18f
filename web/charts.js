/*
 * charts.js: the dashboard's charts, as plain SVG drawn here (no library).
 *
 * Why not a charting library: the charts are a handful of shapes (bars,
 * stacked bars, lines with gaps, vertical deploy markers, sparklines), so
 * this file stays smaller than uPlot alone, with nothing to vendor, update
 * or license; and SVG keeps every value in the page: each bar and point
 * carries its interval (data-t) and value (data-v, or one data-* per part)
 * and a <title> tooltip, which screen readers read and tests check, where
 * a canvas would hold only pixels. Colours come from health.css classes
 * (the page's CSP allows no inline style).
 *
 * Every chart takes the figures' series ([{t, ...}], one per interval, as
 * GET /v1/skills/{id}/stats answers) and draws one slot per interval.
 * Deploy markers are vertical lines at the time each version was loaded.
 */
'use strict';
(function () {
  const SVG = 'http://www.w3.org/2000/svg';

  function el(tag, attrs, ...kids) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v != null) e.setAttribute(k, String(v));
    for (const k of kids) if (k != null) e.append(k);
    return e;
  }

  function title(text) { return el('title', null, text); }

  /* "14:05" within a day's window, "Nov 29 14:05" beyond. */
  function tick(ms, span) {
    const d = new Date(ms);
    const hm = String(d.getHours()).padStart(2, '0') + ':' + String(d.getMinutes()).padStart(2, '0');
    if (span <= 86400000) return hm;
    return d.toLocaleString(undefined, { month: 'short', day: 'numeric' }) + ' ' + hm;
  }

  /* The frame shared by the charts: the plot's box, its x for an interval
   * and for a time, the y scale, axis labels. */
  function frame(series, opts, max) {
    const W = opts.width || 640, H = opts.height || 150;
    const L = 48, R = 8, T = 8, B = 20;
    const n = Math.max(series.length, 1);
    const bw = (W - L - R) / n;
    const t0 = Date.parse(series.length ? series[0].t : 0);
    const iv = opts.interval || 1;
    const top = max > 0 ? max : 1;
    const f = {
      W, H, L, R, T, B, bw, n, t0, iv, top,
      x: (i) => L + i * bw,
      xt: (ms) => L + ((ms - t0) / iv) * bw,
      y: (v) => T + (H - T - B) * (1 - Math.min(v, top) / top),
      svg: el('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart ' + (opts.cls || ''), role: 'img',
        'aria-label': opts.label || 'chart', 'data-max': max }),
    };
    const fmt = opts.fmt || String;
    f.svg.append(el('line', { x1: L, x2: W - R, y1: H - B, y2: H - B, class: 'axis' }),
      el('line', { x1: L, x2: W - R, y1: T, y2: T, class: 'grid' }),
      el('text', { x: L - 4, y: T + 4, class: 'ylabel', 'text-anchor': 'end' }, fmt(top)),
      el('text', { x: L - 4, y: H - B, class: 'ylabel', 'text-anchor': 'end' }, fmt(0)));
    if (series.length) {
      const span = iv * series.length;
      for (const i of [0, Math.floor(series.length / 2), series.length - 1]) {
        const anchor = i === 0 ? 'start' : i === series.length - 1 ? 'end' : 'middle';
        const x = i === series.length - 1 ? f.x(i + 1) : f.x(i);
        f.svg.append(el('text', { x, y: H - 5, class: 'xlabel', 'text-anchor': anchor }, tick(Date.parse(series[i].t), span)));
      }
    }
    return f;
  }

  /* Vertical lines where versions were loaded in the window. */
  function deploys(f, versions) {
    for (const v of versions || []) {
      const at = Date.parse(v.loaded_at);
      const x = f.xt(at);
      if (!(x >= f.L && x <= f.W - f.R)) continue;
      const short = String(v.version).slice(0, 12);
      f.svg.append(el('g', { class: 'deploy', 'data-version': v.version, 'data-loaded-at': v.loaded_at },
        title(`deploy: version ${short} loaded ${new Date(at).toLocaleString()}`),
        el('line', { x1: x, x2: x, y1: f.T, y2: f.H - f.B }),
        el('path', { d: `M${x - 4},${f.T} L${x + 4},${f.T} L${x},${f.T + 6} Z` })));
    }
  }

  function numbers(series, keys) {
    let max = 0;
    for (const p of series) for (const k of keys) if (typeof p[k] === 'number' && p[k] > max) max = p[k];
    return max;
  }

  /* Stacked bars: parts [{key, cls, label}] per interval; each interval a
   * <g class="slot"> with data-t and one data-KEY per part. */
  function stacked(series, parts, opts) {
    let max = 0;
    for (const p of series) max = Math.max(max, parts.reduce((s, q) => s + (p[q.key] || 0), 0));
    const f = frame(series, opts, max);
    series.forEach((p, i) => {
      const g = el('g', { class: 'slot', 'data-t': p.t });
      const lines = [];
      let base = 0;
      for (const q of parts) {
        const v = p[q.key] || 0;
        g.setAttribute('data-' + q.key, v);
        if (v) lines.push(`${q.label} ${v}`);
        if (!v) continue;
        const y0 = f.y(base), y1 = f.y(base + v);
        g.append(el('rect', { x: f.x(i) + 0.5, y: y1, width: Math.max(f.bw - 1, 1), height: Math.max(y0 - y1, 0.5), class: q.cls }));
        base += v;
      }
      g.prepend(title(`${new Date(Date.parse(p.t)).toLocaleString()}: ${lines.join(', ') || 'none'}`));
      g.append(el('rect', { x: f.x(i), y: f.T, width: f.bw, height: f.H - f.T - f.B, class: 'hit' }));
      f.svg.append(g);
    });
    deploys(f, opts.versions);
    return f.svg;
  }

  /* Bars of one figure: a <rect class="bar"> per interval with data-t and
   * data-v (empty data-v when the interval has no value). */
  function bars(series, key, opts) {
    const f = frame(series, opts, numbers(series, [key]));
    const fmt = opts.fmt || String;
    series.forEach((p, i) => {
      const v = p[key];
      const has = typeof v === 'number';
      const y = has ? f.y(v) : f.H - f.B;
      f.svg.append(el('rect', { x: f.x(i) + 0.5, y, width: Math.max(f.bw - 1, 1), height: Math.max(f.H - f.B - y, has && v > 0 ? 1 : 0),
        class: 'bar ' + (opts.barCls || ''), 'data-t': p.t, 'data-v': has ? v : '' },
      title(`${new Date(Date.parse(p.t)).toLocaleString()}: ${has ? fmt(v) : 'no value'}`)));
    });
    deploys(f, opts.versions);
    return f.svg;
  }

  /* Lines of several figures (keys [{key, cls, label}]), broken where an
   * interval has no value; a <circle class="pt"> per value with data-key,
   * data-t and data-v. */
  function lines(series, keys, opts) {
    const f = frame(series, opts, numbers(series, keys.map((k) => k.key)));
    const fmt = opts.fmt || String;
    for (const k of keys) {
      let d = '';
      let open = false;
      const pts = [];
      series.forEach((p, i) => {
        const v = p[k.key];
        if (typeof v !== 'number') { open = false; return; }
        const x = f.x(i) + f.bw / 2, y = f.y(v);
        d += (open ? 'L' : 'M') + x.toFixed(1) + ',' + y.toFixed(1);
        open = true;
        pts.push(el('circle', { cx: x, cy: y, r: 2.2, class: 'pt ' + k.cls, 'data-key': k.key, 'data-t': p.t, 'data-v': v },
          title(`${k.label} ${fmt(v)} at ${new Date(Date.parse(p.t)).toLocaleString()}`)));
      });
      f.svg.append(el('path', { d: d || 'M0,0', class: 'line ' + k.cls, 'data-key': k.key }), ...pts);
    }
    deploys(f, opts.versions);
    return f.svg;
  }

  /* A sparkline: small bars of key per interval, with failed (when
   * opts.over names it) drawn over them; data-values holds the list. */
  function spark(series, key, opts) {
    const o = opts || {};
    const W = o.width || 160, H = o.height || 32;
    const max = numbers(series, [key]);
    const bw = W / Math.max(series.length, 1);
    const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, class: 'spark', role: 'img', 'aria-label': o.label || key,
      'data-key': key, 'data-values': JSON.stringify(series.map((p) => p[key] ?? null)), 'data-max': max });
    series.forEach((p, i) => {
      const v = p[key] || 0;
      const h = max > 0 ? Math.max((v / max) * (H - 2), v > 0 ? 1.5 : 0) : 0;
      const g = el('g', { class: 'slot', 'data-t': p.t, 'data-v': v },
        title(`${new Date(Date.parse(p.t)).toLocaleString()}: ${v} ${o.unit || key}` +
          (o.over && p[o.over] ? `, ${p[o.over]} ${o.over}` : '')),
        el('rect', { x: i * bw + 0.3, y: H - h, width: Math.max(bw - 0.6, 0.6), height: h, class: 'bar' }));
      if (o.over && p[o.over]) {
        const fh = Math.max((p[o.over] / max) * (H - 2), 1.5);
        g.append(el('rect', { x: i * bw + 0.3, y: H - fh, width: Math.max(bw - 0.6, 0.6), height: fh, class: 'bar over' }));
      }
      svg.append(g);
    });
    return svg;
  }

  window.moonloopCharts = { stacked, bars, lines, spark };
})();
