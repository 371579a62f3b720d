// Charts drawn as inline SVG (no library): sparklines and grouped bar charts.
// Every chart carries a <title> and an aria-label so it is readable without sight.

import { h, svg } from './dom.js';

export const SERIES_COLOURS = ['#0b5cad', '#b35900', '#1a7f37', '#8250df', '#a40e26', '#1b7c83',
  '#6e5600', '#bf3989'];

/** A sparkline of `values` (nulls are gaps) scaled to [0, max]. */
export function sparkline(values, { width = 120, height = 28, max = 1, label = '' } = {}) {
  const pts = [];
  const n = Math.max(values.length, 2);
  values.forEach((v, i) => {
    if (v === null || v === undefined) return;
    const x = (i / (n - 1)) * (width - 2) + 1;
    const y = height - 1 - (Math.min(Math.max(v, 0), max) / max) * (height - 2);
    pts.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  });
  const el = svg('svg', { class: 'spark', width, height, viewBox: `0 0 ${width} ${height}`,
    role: 'img', 'aria-label': label });
  el.append(svg('title', {}, label));
  el.append(svg('rect', { x: 0, y: 0, width, height, class: 'spark-bg' }));
  if (pts.length > 1) el.append(svg('polyline', { points: pts.join(' '), class: 'spark-line' }));
  else if (pts.length === 1) {
    const [x, y] = pts[0].split(',');
    el.append(svg('circle', { cx: x, cy: y, r: 1.5, class: 'spark-dot' }));
  }
  return el;
}

/**
 * Grouped (or stacked) bars. groups: [{label, values: [number per series]}];
 * series: [names]; fmt formats a value for labels.
 */
export function barChart(groups, series, { title, fmt = String, stacked = false,
  width = 640, height = 220 } = {}) {
  const padL = 56;
  const padB = 46;
  const padT = 10;
  const plotW = width - padL - 10;
  const plotH = height - padB - padT;
  const totals = groups.map((g) => (stacked ? g.values.reduce((a, b) => a + (b || 0), 0)
    : Math.max(0, ...g.values.map((v) => v || 0))));
  const max = Math.max(1e-9, ...totals);
  const digits = max < 0.1 ? 4 : max < 1 ? 3 : max < 10 ? 1 : 0;
  const axisFmt = (v) => v.toLocaleString('en', { maximumFractionDigits: digits });
  const el = svg('svg', { class: 'chart', viewBox: `0 0 ${width} ${height}`, role: 'img',
    'aria-label': title, preserveAspectRatio: 'xMinYMin meet' });
  el.append(svg('title', {}, title));
  for (let i = 0; i <= 4; i += 1) {
    const y = padT + plotH - (i / 4) * plotH;
    el.append(svg('line', { x1: padL, x2: width - 10, y1: y, y2: y, class: 'grid' }));
    el.append(svg('text', { x: padL - 6, y: y + 4, 'text-anchor': 'end', class: 'axis' },
      axisFmt((max * i) / 4)));
  }
  const slot = plotW / Math.max(groups.length, 1);
  const barW = stacked ? Math.max(2, slot * 0.7) : Math.max(2, (slot * 0.8) / series.length);
  groups.forEach((g, gi) => {
    let base = 0;
    g.values.forEach((v, si) => {
      const value = v || 0;
      const bh = (value / max) * plotH;
      const x = padL + gi * slot + slot * (stacked ? 0.15 : 0.1) + (stacked ? 0 : si * barW);
      const y = padT + plotH - bh - (stacked ? base : 0);
      const rect = svg('rect', { x: x.toFixed(1), y: y.toFixed(1), width: barW.toFixed(1),
        height: Math.max(0, bh).toFixed(1), fill: SERIES_COLOURS[si % SERIES_COLOURS.length],
        class: 'bar' });
      rect.append(svg('title', {}, `${g.label} · ${series[si]}: ${fmt(value)}`));
      el.append(rect);
      if (stacked) base += bh;
    });
    const every = Math.ceil(groups.length / 12);
    if (gi % every === 0) {
      el.append(svg('text', { x: padL + gi * slot + slot / 2, y: height - padB + 16,
        'text-anchor': 'middle', class: 'axis' }, g.label.length > 14 ? `${g.label.slice(0, 13)}…` : g.label));
    }
  });
  const fig = h('figure', { class: 'chart-box' }, h('figcaption', {}, title), el);
  if (series.length > 1) {
    fig.append(h('ul', { class: 'legend' }, series.map((s, i) => h('li', {},
      h('span', { class: 'swatch', style: { background: SERIES_COLOURS[i % SERIES_COLOURS.length] },
        'aria-hidden': 'true' }), s))));
  }
  return fig;
}
