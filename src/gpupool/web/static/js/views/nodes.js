// Nodes and GPUs: node state (up, draining, down), last heartbeat, device health, and
// telemetry sparklines (utilisation, memory used, temperature) over the last few minutes.
//
// Sparklines come from the samples this tab has taken of /metrics since sign-in (the server
// keeps the latest sample per device only). Drain and resume need the node:manage permission.

import { HISTORY, TELEMETRY_MS } from '../live.js';
import { sparkline } from '../charts.js';
import { badge, clear, fmtAgo, fmtMem, fmtPct, h } from '../dom.js';

export const title = 'Nodes';

export function render(ctx, root) {
  const { api, live, can } = ctx;
  const box = h('div', { id: 'nodes' }, h('p', { class: 'muted' }, 'Loading nodes…'));
  const status = h('p', { class: 'status', role: 'status', 'aria-live': 'polite' });
  root.append(h('h1', {}, 'Nodes and GPUs'),
    h('p', { class: 'muted' }, `Sparklines: the last ${(HISTORY * TELEMETRY_MS) / 60000} minutes seen by this page.`),
    status, box);
  const cells = new Map(); // uuid -> {util, mem, temp, now}
  let nodes = [];

  async function setState(node, state) {
    try {
      await api.post(`/v1/nodes/${encodeURIComponent(node)}/state`, { state });
      status.textContent = `${node} is now ${state}.`;
      await load();
    } catch (err) {
      status.textContent = `Could not set ${node} to ${state}: ${err.message}`;
    }
  }

  function draw() {
    cells.clear();
    const frag = document.createDocumentFragment();
    for (const n of nodes) {
      const actions = [];
      if (can('node:manage') && n.state === 'up') {
        actions.push(h('button', { type: 'button', class: 'secondary', onclick: () => setState(n.name, 'draining') }, `Drain ${n.name}`));
      } else if (can('node:manage') && n.state === 'draining') {
        actions.push(h('button', { type: 'button', class: 'secondary', onclick: () => setState(n.name, 'up') }, `Resume ${n.name}`));
      }
      const rows = n.devices.map((d) => {
        const util = h('td', { class: 'spark-cell' });
        const mem = h('td', { class: 'spark-cell' });
        const temp = h('td', { class: 'spark-cell' });
        cells.set(d.uuid, { util, mem, temp, device: d });
        return h('tr', { dataset: { uuid: d.uuid } }, h('td', {}, String(d.index)), h('td', {}, d.model),
          h('td', {}, fmtMem(d.memory_mib)), h('td', {}, d.pool), h('td', {}, badge(d.health)), util, mem, temp);
      });
      frag.append(h('article', { class: 'card node', dataset: { node: n.name } },
        h('h2', {}, n.name, ' ', h('span', { class: `badge node-state-${n.state}` }, n.state)),
        h('p', { class: 'muted' }, `heartbeat ${fmtAgo(n.last_heartbeat)} · agent ${n.agent_version} · isolation ${n.isolation_modes.join(', ') || '–'} · ${n.address || 'no address'}`),
        actions.length ? h('div', { class: 'actions' }, actions) : null,
        h('table', { class: 'devices' },
          h('caption', { class: 'visually-hidden' }, `GPUs of ${n.name}`),
          h('thead', {}, h('tr', {}, ['#', 'Model', 'Memory', 'Pool', 'Health', 'Utilisation', 'Memory used', 'Temperature']
            .map((c) => h('th', { scope: 'col' }, c)))),
          h('tbody', {}, rows))));
    }
    if (!nodes.length) frag.append(h('p', { class: 'muted' }, 'No nodes have registered: start `gpupool agent` on a GPU node.'));
    clear(box).append(frag);
    redraw();
  }

  function redraw() {
    const latest = live.latest?.devices;
    for (const [uuid, c] of cells) {
      const hist = live.history.get(uuid) || { util: [], mem: [], temp: [] };
      const t = latest?.get(uuid);
      const memText = t && t.memTotalBytes ? fmtPct((t.memUsedBytes || 0) / t.memTotalBytes) : '–';
      const tempText = t && t.temp !== undefined ? `${Math.round(t.temp)} °C` : '–';
      clear(c.util).append(sparkline(hist.util, { label: `utilisation, now ${fmtPct(t?.util)}` }), h('span', {}, fmtPct(t?.util)));
      clear(c.mem).append(sparkline(hist.mem, { label: `memory used, now ${memText}` }), h('span', {}, memText));
      clear(c.temp).append(sparkline(hist.temp, { max: 100, label: `temperature, now ${tempText}` }), h('span', {}, tempText));
    }
  }

  async function load() {
    try {
      nodes = await api.get('/v1/nodes');
      draw();
    } catch (err) {
      clear(box).append(h('p', { class: 'error' }, `Could not load nodes: ${err.message}`));
    }
  }

  const offs = [
    live.on('telemetry', redraw),
    live.on('cluster', (e) => { if (e.kind.startsWith('node') || e.kind.startsWith('alert')) load(); }),
    live.on('reconnect', load),
  ];
  load();
  return () => offs.forEach((off) => off());
}
