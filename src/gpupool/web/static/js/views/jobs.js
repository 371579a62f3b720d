// Jobs: a filterable, sortable table that updates live.
//
// Filters go to the server (/v1/jobs?state=&tenant=&user=&pool=&name=); sorting is done here
// on the loaded rows. A job event from the stream fetches that job and inserts, updates or
// removes its row (when it no longer matches the filters), without reloading the page.

import { badge, clear, field, fmtAgo, fmtGpus, fmtMem, fmtTime, h } from '../dom.js';

export const title = 'Jobs';

/** Above this many changed jobs in one batch, the list is read again instead. */
const MAX_SINGLE_REFRESH = 20;

export const STATES = ['PENDING', 'RUNNING', 'COMPLETING', 'COMPLETED', 'FAILED', 'CANCELLED',
  'TIMEOUT', 'PREEMPTED', 'NODE_FAIL', 'OUT_OF_MEMORY', 'REQUEUED'];

const COLUMNS = [
  { key: 'id', label: 'ID', value: (j) => j.id },
  { key: 'name', label: 'Name', value: (j) => j.name },
  { key: 'tenant', label: 'Team', value: (j) => j.tenant },
  { key: 'user', label: 'User', value: (j) => j.user },
  { key: 'pool', label: 'Pool', value: (j) => j.pool },
  { key: 'state', label: 'State', value: (j) => j.state },
  { key: 'slice', label: 'GPU slice', value: (j) => j.gpu_milli * j.replicas },
  { key: 'priority', label: 'Priority', value: (j) => j.priority },
  { key: 'submit', label: 'Submitted', value: (j) => j.submit_time },
  { key: 'reason', label: 'Reason / start', value: (j) => j.pending_reason || j.reason || '' },
];

export function sliceText(j) {
  const mem = j.gpu_memory_mib === null ? 'share' : fmtMem(j.gpu_memory_mib);
  const per = `${fmtGpus(j.gpu_milli)} GPU, ${mem}`;
  return j.replicas > 1 ? `${j.replicas} × ${per}` : per;
}

function reasonText(j) {
  if (j.state === 'PENDING') {
    const start = j.estimated_start ? ` · start ≈ ${fmtTime(j.estimated_start)}` : '';
    return `${j.pending_reason || j.reason || 'waiting'}${start}`;
  }
  return j.reason || '';
}

export function render(ctx, root) {
  const { api, live, clusterWide } = ctx;
  const filters = { state: '', tenant: '', user: '', pool: '', name: '' };
  let sort = { key: 'submit', dir: -1 };
  let rows = new Map();
  let cursor = null;

  const stateSel = h('select', { name: 'state' }, h('option', { value: '' }, 'any state'),
    STATES.map((s) => h('option', { value: s }, s)));
  const inputs = {
    state: stateSel,
    tenant: h('input', { name: 'tenant', type: 'text', autocomplete: 'off' }),
    user: h('input', { name: 'user', type: 'text', autocomplete: 'off' }),
    pool: h('input', { name: 'pool', type: 'text', autocomplete: 'off' }),
    name: h('input', { name: 'name', type: 'text', autocomplete: 'off' }),
  };
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter jobs' },
    field('State', stateSel),
    clusterWide ? field('Team', inputs.tenant) : null,
    field('User', inputs.user),
    field('Pool', inputs.pool),
    field('Name', inputs.name),
    h('button', { type: 'submit' }, 'Apply filters'),
    h('button', { type: 'reset', class: 'secondary' }, 'Clear'));
  const count = h('p', { class: 'muted', id: 'jobs-count', 'aria-live': 'polite' }, 'Loading…');
  const thead = h('thead');
  const tbody = h('tbody', { id: 'jobs-body' });
  const more = h('button', { type: 'button', class: 'secondary', hidden: true }, 'Load more jobs');
  root.append(h('h1', {}, 'Jobs'), form, count,
    h('div', { class: 'table-wrap' }, h('table', { class: 'jobs', id: 'jobs-table' },
      h('caption', { class: 'visually-hidden' }, 'Jobs; column buttons sort'), thead, tbody)), more);

  function header() {
    clear(thead).append(h('tr', {}, COLUMNS.map((c) => {
      const active = sort.key === c.key;
      return h('th', { scope: 'col', 'aria-sort': active ? (sort.dir > 0 ? 'ascending' : 'descending') : 'none' },
        h('button', { type: 'button', class: 'sort', dataset: { key: c.key },
          onclick: () => { sort = { key: c.key, dir: active ? -sort.dir : 1 }; draw(); } },
        c.label, active ? (sort.dir > 0 ? ' ▲' : ' ▼') : ''));
    })));
  }

  function rowOf(j) {
    return h('tr', { dataset: { job: j.id, state: j.state } },
      h('td', {}, h('a', { href: `#/jobs/${encodeURIComponent(j.id)}` }, j.id)),
      h('td', {}, j.name), h('td', {}, j.tenant), h('td', {}, j.user), h('td', {}, j.pool),
      h('td', {}, badge(j.state)), h('td', {}, sliceText(j)),
      h('td', {}, `${j.priority_class} (${j.priority})`),
      h('td', { title: fmtTime(j.submit_time) }, fmtAgo(j.submit_time)),
      h('td', { class: 'reason' }, reasonText(j)));
  }

  function draw() {
    header();
    const col = COLUMNS.find((c) => c.key === sort.key);
    const list = [...rows.values()].sort((a, b) => {
      const va = col.value(a);
      const vb = col.value(b);
      const cmp = typeof va === 'number' && typeof vb === 'number' ? va - vb : String(va).localeCompare(String(vb));
      return cmp * sort.dir || a.id.localeCompare(b.id);
    });
    const frag = document.createDocumentFragment();
    for (const j of list) frag.append(rowOf(j));
    clear(tbody).append(frag);
    if (!list.length) tbody.append(h('tr', {}, h('td', { colspan: COLUMNS.length, class: 'muted' }, 'No jobs match.')));
    count.textContent = `${list.length} job${list.length === 1 ? '' : 's'}${cursor ? ' (more on the server)' : ''}`;
    more.hidden = !cursor;
  }

  function params() {
    return { state: filters.state || null, tenant: clusterWide ? filters.tenant : null,
      user: filters.user, pool: filters.pool, name: filters.name, limit: 200 };
  }

  function matches(j) {
    return (!filters.state || j.state === filters.state)
      && (!filters.tenant || !clusterWide || j.tenant === filters.tenant)
      && (!filters.user || j.user === filters.user)
      && (!filters.pool || j.pool === filters.pool)
      && (!filters.name || j.name === filters.name);
  }

  async function load(append = false) {
    try {
      const page = await api.get('/v1/jobs', { ...params(), cursor: append ? cursor : null });
      if (!append) rows = new Map();
      for (const j of page.jobs) rows.set(j.id, j);
      cursor = page.next_cursor;
      draw();
    } catch (err) {
      count.textContent = `Could not load jobs: ${err.message}`;
    }
  }

  const pendingIds = new Set();
  let timer = null;
  async function refreshChanged() {
    timer = null;
    const ids = [...pendingIds];
    pendingIds.clear();
    if (ids.length > MAX_SINGLE_REFRESH) {
      await load(); // a burst (a big submit, a node going down): one list read beats N gets
      return;
    }
    await Promise.all(ids.map(async (id) => {
      try {
        const j = await api.get(`/v1/jobs/${encodeURIComponent(id)}`);
        if (matches(j)) rows.set(j.id, j);
        else rows.delete(j.id);
      } catch {
        rows.delete(id);
      }
    }));
    draw();
  }

  form.addEventListener('submit', (e) => {
    e.preventDefault();
    for (const [k, el] of Object.entries(inputs)) filters[k] = el.value.trim();
    load();
  });
  form.addEventListener('reset', () => {
    for (const k of Object.keys(filters)) filters[k] = '';
    setTimeout(load, 0);
  });
  more.addEventListener('click', () => load(true));

  const offs = [
    live.on('job', (e) => {
      pendingIds.add(e.job);
      if (!timer) timer = setTimeout(refreshChanged, 150);
    }),
    live.on('reconnect', () => load()),
  ];
  header();
  load();
  return () => { offs.forEach((off) => off()); if (timer) clearTimeout(timer); };
}
