// Usage: GPU-hours and cost by team, by GPU type and over time, with a CSV download.
//
// Figures come from /v1/usage (accounted allocations: GPU-hours, utilisation, idle share,
// cost from the pool's price per GPU model). "Over time" asks for one report per bucket
// (hour or day) of the chosen window, grouped by team. The CSV holds the window's report
// grouped by team, user, pool and GPU model, one line per group.

import { barChart } from '../charts.js';
import { clear, field, fmtNum, fmtPct, h } from '../dom.js';

export const title = 'Usage';

const WINDOWS = {
  day: { label: 'last 24 hours, by hour', span: 86400, bucket: 3600 },
  week: { label: 'last 7 days, by day', span: 7 * 86400, bucket: 86400 },
  month: { label: 'last 30 days, by day', span: 30 * 86400, bucket: 86400 },
};

const CSV_COLUMNS = ['tenant', 'user', 'pool', 'gpu_model', 'gpu_hours', 'utilization_ratio',
  'idle_ratio', 'cost', 'jobs', 'milli_seconds', 'mib_seconds', 'busy_milli_seconds'];

/** CSV text (RFC 4180 quoting) of a usage report's lines. */
export function usageCsv(lines) {
  const quote = (v) => {
    const s = v === null || v === undefined ? '' : String(v);
    return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  };
  const rows = [CSV_COLUMNS.join(',')];
  for (const l of lines) {
    rows.push(CSV_COLUMNS.map((c) => quote(c in l.key ? l.key[c] : l[c])).join(','));
  }
  return `${rows.join('\r\n')}\r\n`;
}

async function inBatches(tasks, size = 6) {
  const out = [];
  for (let i = 0; i < tasks.length; i += size) out.push(...await Promise.all(tasks.slice(i, i + size).map((t) => t())));
  return out;
}

export function render(ctx, root) {
  const { api } = ctx;
  const select = h('select', { name: 'window' }, Object.entries(WINDOWS).map(([k, w]) => h('option', { value: k }, w.label)));
  const download = h('button', { type: 'button', id: 'csv' }, 'Download CSV');
  const status = h('p', { class: 'status', role: 'status', 'aria-live': 'polite' });
  const charts = h('div', { class: 'charts', id: 'usage-charts' });
  const table = h('div', { class: 'table-wrap' });
  root.append(h('h1', {}, 'Usage and cost'),
    h('form', { class: 'filters', onsubmit: (e) => e.preventDefault() }, field('Window', select), download),
    status, charts, table);
  let lastCsvLines = [];

  async function load() {
    const w = WINDOWS[select.value];
    const end = Date.now() / 1000;
    const start = end - w.span;
    status.textContent = 'Loading usage…';
    try {
      const [byTeam, byType, full] = await Promise.all([
        api.get('/v1/usage', { start, end, group_by: 'tenant' }),
        api.get('/v1/usage', { start, end, group_by: 'gpu_model' }),
        api.get('/v1/usage', { start, end, group_by: ['tenant', 'user', 'pool', 'gpu_model'] }),
      ]);
      const buckets = [];
      for (let t = start; t < end; t += w.bucket) buckets.push([t, Math.min(end, t + w.bucket)]);
      const series = await inBatches(buckets.map(([a, b]) => () => api.get('/v1/usage', { start: a, end: b, group_by: 'tenant' })));
      lastCsvLines = full.lines;
      const teams = [...new Set(series.flatMap((r) => r.lines.map((l) => l.key.tenant)))].sort();
      const label = (t) => {
        const d = new Date(t * 1000).toISOString();
        return w.bucket < 86400 ? d.slice(11, 16) : d.slice(5, 10);
      };
      clear(charts).append(
        barChart(byTeam.lines.map((l) => ({ label: l.key.tenant, values: [l.gpu_hours] })), ['GPU-hours'],
          { title: 'GPU-hours by team', fmt: (v) => fmtNum(v, 1) }),
        barChart(byTeam.lines.map((l) => ({ label: l.key.tenant, values: [l.cost] })), ['cost'],
          { title: 'Cost by team', fmt: (v) => fmtNum(v, 2) }),
        barChart(byType.lines.map((l) => ({ label: l.key.gpu_model, values: [l.gpu_hours, l.cost] })), ['GPU-hours', 'cost'],
          { title: 'GPU-hours and cost by GPU type', fmt: (v) => fmtNum(v, 1) }),
        barChart(series.map((r, i) => ({ label: label(buckets[i][0]),
          values: teams.map((t) => r.lines.find((l) => l.key.tenant === t)?.gpu_hours || 0) })),
        teams.length ? teams : ['GPU-hours'], { title: `GPU-hours over time (${w.label}), by team`, stacked: true, fmt: (v) => fmtNum(v, 1) }),
      );
      clear(table).append(h('table', { class: 'usage', id: 'usage-table' },
        h('caption', {}, 'By team: allocated GPU-hours, how much of it was used, and cost'),
        h('thead', {}, h('tr', {}, ['Team', 'GPU-hours', 'Used', 'Idle', 'Cost', 'Jobs'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, byTeam.lines.length ? byTeam.lines.map((l) => h('tr', {}, h('td', {}, l.key.tenant), h('td', {}, fmtNum(l.gpu_hours, 3)),
          h('td', {}, fmtPct(l.utilization_ratio)), h('td', {}, fmtPct(l.idle_ratio)), h('td', {}, fmtNum(l.cost, 2)), h('td', {}, String(l.jobs))))
          : h('tr', {}, h('td', { colspan: 6, class: 'muted' }, 'No usage in this window.')))));
      status.textContent = `Usage from ${new Date(start * 1000).toISOString().slice(0, 16)}Z to now.`;
    } catch (err) {
      status.textContent = `Could not load usage: ${err.message}`;
    }
  }

  download.addEventListener('click', () => {
    const blob = new Blob([usageCsv(lastCsvLines)], { type: 'text/csv' });
    const url = URL.createObjectURL(blob);
    const a = h('a', { href: url, download: `gpupool-usage-${select.value}.csv`, hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  });
  select.addEventListener('change', load);
  load();
  return null;
}
