// Overview: per pool allocated vs used vs idle, memory share and queue; alerts; and a grid of
// every GPU coloured by utilisation, with its slices drawn as segments and its temperature.
//
// The grid is plain DOM built once (one <li> per device) and updated in place on each
// telemetry sample, touching only what changed, so a 1,000-GPU pool stays cheap to redraw.
// A device's slices come from /v1/devices when the server lists them per job (`slices`);
// otherwise the device's allocated compute from /metrics is drawn as one segment.

import { alertsInForce, poolFigures } from '../metrics.js';
import { clear, fmtAgo, fmtGpus, fmtNum, fmtPct, h } from '../dom.js';

export const title = 'Overview';

const UTIL_BUCKETS = 6;

export function utilBucket(util) {
  if (util === null || util === undefined) return 'none';
  return String(Math.min(UTIL_BUCKETS - 1, Math.floor(util * UTIL_BUCKETS)));
}

function shortModel(model) {
  return (model || '').replace(/^NVIDIA\s+/, '').replace(/^Tesla\s+/, '').replace(/-SXM\d-/, '-');
}

export function render(ctx, root) {
  const { api, live, can } = ctx;
  const poolsBox = h('div', { class: 'cards', id: 'pools' });
  const alertsBox = h('ul', { class: 'alerts', id: 'alerts' });
  const gridBox = h('div', { id: 'gpu-grid', class: 'grid-box' });
  const summary = h('p', { class: 'muted', id: 'grid-summary' }, 'Loading devices…');
  root.append(
    h('h1', {}, 'Overview'),
    h('section', { 'aria-labelledby': 'pools-h' }, h('h2', { id: 'pools-h' }, 'Pools'), poolsBox),
    h('section', { 'aria-labelledby': 'alerts-h' }, h('h2', { id: 'alerts-h' }, 'Alerts'), alertsBox),
    h('section', { 'aria-labelledby': 'grid-h' },
      h('h2', { id: 'grid-h' }, 'GPUs'), summary, legend(), gridBox),
  );

  const tiles = new Map(); // uuid -> {el, seg, foot, state}
  let inventory = [];
  let disposed = false;

  async function loadInventory() {
    if (!can('node:read')) {
      summary.textContent = 'Your role does not show devices.';
      return;
    }
    const nodes = await api.get('/v1/nodes');
    let devices = null;
    try {
      devices = await api.get('/v1/devices');
    } catch {
      devices = null;
    }
    const byUuid = new Map((devices || []).map((d) => [d.uuid, d]));
    inventory = nodes.map((n) => ({
      ...n, devices: n.devices.map((d) => ({ ...d, ...(byUuid.get(d.uuid) || {}) })),
    }));
    buildGrid();
    if (live.latest) update(live.latest);
  }

  function buildGrid() {
    const t0 = performance.now();
    tiles.clear();
    const frag = document.createDocumentFragment();
    let count = 0;
    for (const node of inventory) {
      const list = h('ul', { class: 'gpu-grid', 'aria-label': `GPUs of ${node.name}` });
      for (const d of node.devices) {
        count += 1;
        const seg = h('div', { class: 'slices', 'aria-hidden': 'true' });
        const foot = h('span', { class: 'gpu-foot' }, '–');
        const el = h('li', {
          class: 'gpu', dataset: { uuid: d.uuid, node: d.node, pool: d.pool, util: 'none' },
          title: d.uuid,
        }, h('span', { class: 'gpu-head' }, `${d.index} · ${shortModel(d.model)}`), seg, foot);
        tiles.set(d.uuid, { el, seg, foot, device: d, key: '' });
        list.append(el);
      }
      frag.append(h('div', { class: `node-group node-${node.state}` },
        h('h3', {}, node.name, ' ', h('span', { class: `badge node-state-${node.state}` }, node.state)),
        list));
    }
    clear(gridBox).append(frag);
    summary.textContent = `${count} GPU${count === 1 ? '' : 's'} on ${inventory.length} node${inventory.length === 1 ? '' : 's'}`;
    performance.measure('gpupool:grid-build', { start: t0 }); // user timing, for devtools and benchmarks
  }

  function slicesOf(d, t) {
    if (Array.isArray(d.slices)) {
      return d.slices.map((s) => ({ milli: s.milli, job: s.job_id || s.job || '' }));
    }
    const milli = Math.round((t?.computeAlloc || 0) * 1000);
    return milli > 0 ? [{ milli, job: '' }] : [];
  }

  function updateTile(tile, t) {
    const d = tile.device;
    const slices = slicesOf(d, t);
    const util = t?.util;
    const temp = t?.temp;
    const alloc = slices.reduce((a, s) => a + s.milli, 0);
    const healthy = t ? t.healthy !== 0 : d.health === 'healthy';
    const key = `${util}|${temp}|${healthy}|${slices.map((s) => `${s.job}:${s.milli}`).join(',')}`;
    if (key === tile.key) return;
    tile.key = key;
    tile.el.dataset.util = utilBucket(util);
    tile.el.dataset.allocMilli = String(alloc);
    tile.el.classList.toggle('unhealthy', !healthy);
    clear(tile.seg);
    slices.forEach((s, i) => {
      tile.seg.append(h('span', {
        class: `slice s${i % 4}`, style: { width: `${Math.min(100, s.milli / 10)}%` },
        dataset: { milli: String(s.milli), job: s.job }, title: s.job ? `${s.job}: ${fmtGpus(s.milli)} GPU` : `${fmtGpus(s.milli)} GPU allocated`,
      }));
    });
    const tempText = temp === null || temp === undefined ? '' : ` · ${Math.round(temp)}°C`;
    tile.foot.textContent = `${fmtPct(util)}${tempText}`;
    tile.el.setAttribute('aria-label', `GPU ${d.index} on ${d.node}, ${d.model}: utilisation ${fmtPct(util)}, `
      + `${fmtGpus(alloc)} GPU allocated in ${slices.length} slice${slices.length === 1 ? '' : 's'}`
      + `${temp !== null && temp !== undefined ? `, ${Math.round(temp)} °C` : ''}${healthy ? '' : ', unhealthy'}`);
  }

  function update({ parsed, devices }) {
    const t0 = performance.now();
    for (const [uuid, tile] of tiles) updateTile(tile, devices.get(uuid));
    renderPools(parsed, devices);
    const inForce = alertsInForce(parsed);
    const force = alertsBox.querySelector('.in-force');
    const text = `In force: ${inForce.temperature || 0} hot, ${inForce.health || 0} unhealthy device(s)`;
    if (force) force.textContent = text;
    else alertsBox.prepend(h('li', { class: 'in-force' }, text));
    performance.measure('gpupool:grid-update', { start: t0 });
  }

  function renderPools(parsed, devices) {
    const figures = poolFigures(parsed, devices);
    clear(poolsBox);
    for (const p of [...figures.values()].sort((a, b) => a.name.localeCompare(b.name))) {
      const total = Math.max(p.gpus, 1e-9);
      const bar = h('div', { class: 'stack', role: 'img',
        'aria-label': `${p.name}: ${fmtNum(p.used)} used, ${fmtNum(p.idle)} idle, ${fmtNum(p.free)} free of ${p.gpus} GPUs` },
      h('span', { class: 'part used', style: { width: `${(p.used / total) * 100}%` } }),
      h('span', { class: 'part idle', style: { width: `${(p.idle / total) * 100}%` } }));
      poolsBox.append(h('article', { class: 'card pool', dataset: { pool: p.name } },
        h('h3', {}, p.name),
        bar,
        h('dl', { class: 'figures' },
          h('dt', {}, 'GPUs'), h('dd', {}, String(p.gpus)),
          h('dt', {}, 'Allocated'), h('dd', { class: 'allocated' }, fmtNum(p.allocated)),
          h('dt', {}, 'Used'), h('dd', {}, fmtNum(p.used)),
          h('dt', {}, 'Idle (allocated, unused)'), h('dd', {}, fmtNum(p.idle)),
          h('dt', {}, 'Free'), h('dd', {}, fmtNum(p.free)),
          h('dt', {}, 'Memory share'), h('dd', { class: 'mem-share' }, p.memShare === null ? '–' : fmtPct(p.memShare)),
          h('dt', {}, 'Queue'), h('dd', { class: 'queue' }, `${p.queue} pending`),
          p.unhealthy ? [h('dt', {}, 'Unhealthy'), h('dd', {}, String(p.unhealthy))] : null)));
    }
    if (!figures.size) poolsBox.append(h('p', { class: 'muted' }, 'No devices registered yet: start an agent.'));
  }

  async function loadAlerts() {
    if (!can('node:read')) return;
    const events = await api.get('/v1/events', { kind: 'alert', limit: 20 });
    for (const e of events.reverse()) addAlert(e);
    if (!alertsBox.querySelector('.alert')) {
      alertsBox.append(h('li', { class: 'muted none' }, 'No alerts raised.'));
    }
  }

  function addAlert(e) {
    alertsBox.querySelector('.none')?.remove();
    const item = h('li', { class: 'alert' }, h('strong', {}, e.kind), ` ${e.message} `,
      h('span', { class: 'muted' }, fmtAgo(e.time)));
    const force = alertsBox.querySelector('.in-force');
    if (force) force.after(item);
    else alertsBox.prepend(item);
    while (alertsBox.querySelectorAll('.alert').length > 20) alertsBox.querySelector('.alert:last-child')?.remove();
  }

  // With per-job slices from /v1/devices, a job event re-reads them (debounced) in place.
  let sliceTimer = null;
  async function refreshSlices() {
    sliceTimer = null;
    const devices = await api.get('/v1/devices');
    for (const d of devices) {
      const tile = tiles.get(d.uuid);
      if (tile && Array.isArray(d.slices)) tile.device = { ...tile.device, slices: d.slices };
    }
    if (live.latest) update(live.latest);
  }
  const serverListsSlices = () => [...tiles.values()].some((t) => Array.isArray(t.device.slices));

  const offs = [
    live.on('telemetry', (sample) => { if (!disposed) update(sample); }),
    live.on('job', () => {
      live.sampleTelemetry();
      if (serverListsSlices() && !sliceTimer) {
        sliceTimer = setTimeout(() => refreshSlices().catch(() => {}), 300);
      }
    }),
    live.on('cluster', (e) => {
      if (e.kind.startsWith('alert')) addAlert(e);
      if (e.kind.startsWith('node') || e.kind.startsWith('device')) loadInventory().catch(() => {});
    }),
    live.on('reconnect', () => loadInventory().catch(() => {})),
  ];
  loadInventory().catch((err) => { summary.textContent = `Could not load devices: ${err.message}`; });
  loadAlerts().catch(() => {});
  if (live.latest) renderPools(live.latest.parsed, live.latest.devices);
  return () => { disposed = true; offs.forEach((off) => off()); clearTimeout(sliceTimer); };
}

function legend() {
  const items = [];
  for (let i = 0; i < UTIL_BUCKETS; i += 1) {
    const lo = Math.round((i / UTIL_BUCKETS) * 100);
    const hi = Math.round(((i + 1) / UTIL_BUCKETS) * 100);
    items.push(h('li', {}, h('span', { class: 'swatch gpu-swatch', dataset: { util: String(i) }, 'aria-hidden': 'true' }), `${lo}–${hi}%`));
  }
  return h('ul', { class: 'legend', 'aria-label': 'Utilisation colours' }, items,
    h('li', {}, h('span', { class: 'swatch slice-swatch', 'aria-hidden': 'true' }), 'slice (allocated share)'));
}
