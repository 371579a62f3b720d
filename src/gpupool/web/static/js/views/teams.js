// Teams: each tenant's quota per pool (guaranteed and limit) against what its running jobs
// hold, whether it is borrowing idle capacity above its guarantee, and its fair-share standing.
//
// "In use" sums gpu_milli × replicas of the team's RUNNING jobs visible to the caller.
// Fair-share standing is the scheduler's factor 2^(-usage share / fair-share share) and its
// decayed usage, as the server reports them on each tenant (fair_share_factor,
// decayed_usage_milli_s); against an older server without them it is approximated from the
// last 7 days of accounted GPU-hours.

import { clear, fmtGpus, fmtMem, fmtNum, fmtPct, h } from '../dom.js';

export const title = 'Teams';
const WEEK_S = 7 * 86400;

export function standing(usageShare, fairShare) {
  if (!fairShare) return 0;
  return 2 ** (-usageShare / fairShare);
}

export function render(ctx, root) {
  const { api, live, can } = ctx;
  const box = h('div', { id: 'teams', class: 'cards' }, h('p', { class: 'muted' }, 'Loading teams…'));
  root.append(h('h1', {}, 'Teams'), h('p', { class: 'muted' },
    'In use: running jobs. Borrowing: use above the guarantee, reclaimable by teams within theirs.'), box);

  async function load() {
    const tenants = await api.get('/v1/tenants');
    const detailed = await Promise.all(tenants.map((t) => api.get(`/v1/tenants/${encodeURIComponent(t.name)}`).catch(() => t)));
    const running = await api.allJobs({ state: 'RUNNING' });
    const use = new Map(); // "tenant|pool" -> {milli, mib}
    for (const j of running) {
      const k = `${j.tenant}|${j.pool}`;
      const u = use.get(k) || { milli: 0, mib: 0 };
      u.milli += j.gpu_milli * j.replicas;
      u.mib += (j.gpu_memory_mib || 0) * j.replicas;
      use.set(k, u);
    }
    let hours = new Map();
    if (can('usage:read')) {
      const now = Date.now() / 1000;
      const report = await api.get('/v1/usage', { start: now - WEEK_S, end: now, group_by: 'tenant' }).catch(() => null);
      hours = new Map((report?.lines || []).map((l) => [l.key.tenant, l.gpu_hours]));
    }
    const totalHours = [...hours.values()].reduce((a, b) => a + b, 0);
    const totalShare = detailed.reduce((a, t) => a + t.fair_share, 0);
    clear(box);
    for (const t of detailed) {
      const usageShare = totalHours ? (hours.get(t.name) || 0) / totalHours : 0;
      const shareOfShares = totalShare ? t.fair_share / totalShare : 0;
      const quotaRows = (t.quotas || []).map((q) => {
        const u = use.get(`${t.name}|${q.pool}`) || { milli: 0, mib: 0 };
        const limit = q.limit_milli;
        const borrowing = Math.max(0, u.milli - q.guaranteed_milli);
        const scale = Math.max(limit || 0, q.guaranteed_milli, u.milli, 1);
        return h('tr', { dataset: { pool: q.pool } },
          h('td', {}, q.pool),
          h('td', {}, `${fmtGpus(q.guaranteed_milli)} GPU`),
          h('td', {}, limit === null ? 'none' : `${fmtGpus(limit)} GPU`),
          h('td', { class: 'use' }, `${fmtGpus(u.milli)} GPU`,
            h('div', { class: 'quota-bar', role: 'img', 'aria-label': `${fmtGpus(u.milli)} of ${limit === null ? 'unlimited' : fmtGpus(limit)} GPU, guarantee ${fmtGpus(q.guaranteed_milli)}` },
              h('span', { class: 'fill', style: { width: `${(u.milli / scale) * 100}%` } }),
              h('span', { class: 'mark', style: { left: `${(q.guaranteed_milli / scale) * 100}%` } }))),
          h('td', {}, borrowing ? `yes, ${fmtGpus(borrowing)} GPU` : 'no'),
          h('td', {}, q.limit_memory_mib === null ? '–' : fmtMem(q.limit_memory_mib)));
      });
      box.append(h('article', { class: 'card team', dataset: { tenant: t.name } },
        h('h2', {}, t.display_name || t.name, t.display_name ? h('span', { class: 'muted' }, ` ${t.name}`) : null),
        h('dl', { class: 'figures' },
          h('dt', {}, 'Fair share'), h('dd', {}, `${fmtNum(t.fair_share)} (${fmtPct(shareOfShares)} of all)`),
          h('dt', {}, 'Usage, 7 days'), h('dd', {}, `${fmtNum(hours.get(t.name) || 0, 3)} GPU-h (${fmtPct(usageShare)})`),
          typeof t.decayed_usage_milli_s === 'number'
            ? [h('dt', {}, 'Decayed usage'), h('dd', { class: 'decayed' }, `${fmtNum(t.decayed_usage_milli_s / 3.6e6, 3)} GPU-h (half-life 7 days)`)]
            : null,
          h('dt', {}, 'Standing'), h('dd', { class: 'standing' }, fmtNum(typeof t.fair_share_factor === 'number' ? t.fair_share_factor : standing(usageShare, shareOfShares), 2))),
        quotaRows.length ? h('table', { class: 'quotas' },
          h('caption', { class: 'visually-hidden' }, `Quotas of ${t.name}`),
          h('thead', {}, h('tr', {}, ['Pool', 'Guaranteed', 'Limit', 'In use', 'Borrowing', 'Memory limit'].map((c) => h('th', { scope: 'col' }, c)))),
          h('tbody', {}, quotaRows)) : h('p', { class: 'muted' }, 'No quota set: the team may use idle capacity only up to the pool’s limits.')));
    }
  }

  let timer = null;
  const soon = () => { if (!timer) timer = setTimeout(() => { timer = null; load().catch(() => {}); }, 500); };
  const offs = [live.on('job', soon), live.on('reconnect', soon)];
  load().catch((err) => clear(box).append(h('p', { class: 'error' }, `Could not load teams: ${err.message}`)));
  return () => { offs.forEach((off) => off()); if (timer) clearTimeout(timer); };
}
