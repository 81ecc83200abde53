// Small SVG charts for the console, drawn with DOM calls (no markup strings, no library):
// BulkheadCharts.line(points, opts), .spark(values, opts) and .bars(items, opts) return an
// <svg> element. Labels are text nodes, so untrusted names render as text.
'use strict';
window.BulkheadCharts = (function () {
  const NS = 'http://www.w3.org/2000/svg';
  function node(tag, attrs, text) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }
  function clock(ms) {
    const d = new Date(ms);
    return String(d.getHours()).padStart(2, '0') + ':' + String(d.getMinutes()).padStart(2, '0');
  }

  // points: [{t: ms, v: number}], opts: {width, height, max?, format(v), cls, label}
  function line(points, opts) {
    const w = opts.width || 420, h = opts.height || 140, left = 64, bottom = 18, top = 8, right = 8;
    const svg = node('svg', { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: 'img', 'aria-label': opts.label || 'chart' });
    const pw = w - left - right, ph = h - top - bottom;
    const max = opts.max || niceMax(Math.max(0, ...points.map((p) => p.v)));
    const fmt = opts.format || ((v) => String(v));
    for (let i = 0; i <= 4; i++) {
      const y = top + ph - (ph * i) / 4;
      svg.append(node('line', { x1: left, x2: w - right, y1: y, y2: y, class: 'grid' }));
      svg.append(node('text', { x: left - 4, y: y + 3, 'text-anchor': 'end' }, fmt((max * i) / 4)));
    }
    if (points.length === 0) {
      svg.append(node('text', { x: left + pw / 2, y: top + ph / 2, 'text-anchor': 'middle' }, 'no samples yet'));
      return svg;
    }
    const t0 = points[0].t, t1 = Math.max(points[points.length - 1].t, t0 + 1);
    const x = (t) => left + ((t - t0) / (t1 - t0)) * pw;
    const y = (v) => top + ph - (Math.min(v, max) / max) * ph;
    svg.append(node('text', { x: left, y: h - 4 }, clock(t0)));
    svg.append(node('text', { x: w - right, y: h - 4, 'text-anchor': 'end' }, clock(t1)));
    const d = points.map((p, i) => (i ? 'L' : 'M') + x(p.t).toFixed(1) + ' ' + y(p.v).toFixed(1)).join(' ');
    svg.append(node('path', { d, class: opts.cls || 'series-cpu' }));
    return svg;
  }

  // A tiny line without axes: values in [0, max].
  function spark(values, opts) {
    const w = opts.width || 80, h = opts.height || 18, max = opts.max || niceMax(Math.max(0, ...values));
    const svg = node('svg', { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: 'img', 'aria-label': opts.label || 'trend' });
    if (values.length < 2) return svg;
    const d = values.map((v, i) => (i ? 'L' : 'M') + ((i * w) / (values.length - 1)).toFixed(1) + ' ' +
      (h - 1 - (Math.min(v, max) / max) * (h - 2)).toFixed(1)).join(' ');
    svg.append(node('path', { d, class: opts.cls || 'series-cpu' }));
    return svg;
  }

  // items: [{label, value}], horizontal bars, opts: {width, format, cls, label}
  function bars(items, opts) {
    const w = opts.width || 640, row = 20, labelW = 170, valueW = 90;
    const h = Math.max(row, items.length * row) + 4;
    const svg = node('svg', { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: 'img', 'aria-label': opts.label || 'bars' });
    const max = niceMax(Math.max(0, ...items.map((i) => i.value)));
    const fmt = opts.format || ((v) => String(v));
    items.forEach((it, i) => {
      const y = i * row + 2;
      svg.append(node('text', { x: 0, y: y + 13 }, it.label.length > 26 ? it.label.slice(0, 25) + '…' : it.label));
      const bw = ((w - labelW - valueW) * it.value) / max;
      svg.append(node('rect', { x: labelW, y: y + 3, width: Math.max(bw, 1).toFixed(1), height: row - 6, class: opts.cls || 'bar' }));
      svg.append(node('text', { x: labelW + Math.max(bw, 1) + 4, y: y + 13 }, fmt(it.value)));
    });
    return svg;
  }

  return { line, spark, bars };
})();
