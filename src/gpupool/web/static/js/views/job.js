// One job: its slice and isolation mode, priority factors, why it waits and when it should
// start, its events, a live log tail, and the actions the signed-in role may take on it:
// cancel, hold or release a pending job, requeue one that ended without finishing.
//
// Both streams are shown: the last LOG_LINES lines of stdout and of stderr (a traceback is
// not hidden), each read from GET /v1/jobs/{id}/logs?stream=S&tail=N every LOG_MS while the
// job runs. "Download" fetches the whole kept log page by page (?offset=, the X-Log-Next
// header) as the bytes the job wrote, and says when the server had already dropped the
// oldest bytes (X-Log-First > 0). A server without the endpoint gets a note, not an error.

import { ApiError } from '../api.js';
import { badge, clear, dl, fmtDuration, fmtGpus, fmtMem, fmtNum, fmtTime, h } from '../dom.js';
import { sliceText } from './jobs.js';

export const title = 'Job';

export const TERMINAL = new Set(['COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'PREEMPTED',
  'NODE_FAIL', 'OUT_OF_MEMORY', 'BOOT_FAIL']);

const LOG_MS = 2000;
const PENDING_MS = 5000;
const LOG_LINES = 200;

const ISOLATION = {
  exclusive: 'whole devices, no other job on them',
  mps: 'NVIDIA MPS: hard compute share and memory limit',
  soft: 'framework memory caps plus a memory watchdog (no hard compute limit)',
  mig: 'a MIG instance: hardware-partitioned compute and memory',
  auto: 'the strongest mode the node offers',
};

/** Ended without finishing its work: the states POST /v1/jobs/{id}/requeue accepts. */
export const REQUEUABLE = new Set(['FAILED', 'PREEMPTED', 'NODE_FAIL', 'BOOT_FAIL']);

/** Whether the principal may change job `j` at all (cancel, hold, requeue: the same right). */
function mayChange(ctx, j) {
  if (ctx.can('job:cancel-any')) return true;
  if (ctx.can('job:cancel-tenant') && ctx.me.tenant === j.tenant) return true;
  return ctx.can('job:cancel-own') && ctx.me.user === j.user;
}

/** Whether the principal `me` may cancel job `j` (the API checks again). */
export function canCancel(ctx, j) {
  return !TERMINAL.has(j.state) && mayChange(ctx, j);
}

/** The hold / release / requeue action the principal may take on `j` now, or null. */
export function queueAction(ctx, j) {
  if (!mayChange(ctx, j)) return null;
  if (j.state === 'PENDING') return j.held ? 'release' : 'hold';
  return REQUEUABLE.has(j.state) ? 'requeue' : null;
}

const ACTION_LABEL = { hold: 'Hold', release: 'Release', requeue: 'Requeue' };
const ACTION_DONE = {
  hold: 'Held: it stays in the queue and does not start until released.',
  release: 'Released: it is considered again from the next scheduling cycle.',
  requeue: 'Requeued: it is pending again.',
};

const STREAMS = [
  { name: 'stdout', label: 'Standard output (stdout)' },
  { name: 'stderr', label: 'Standard error (stderr)' },
];

/** One stream's box: heading, download button, note and the tail itself. */
function logPanel({ name, label }, onDownload) {
  const pre = h('pre', { class: 'log', id: `log-${name}`, tabindex: '0', 'aria-label': `${label}, last lines` }, '');
  const note = h('p', { class: 'muted', id: `log-${name}-note`, role: 'status' });
  const button = h('button', { type: 'button', class: 'secondary', id: `download-${name}`, onclick: onDownload },
    `Download all of ${name}`);
  const box = h('div', { class: 'log-stream' }, h('h3', {}, label), button, note, pre);
  return {
    name,
    box,
    note,
    show(text) {
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = text || `(nothing on ${name} yet)`;
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    },
  };
}

export function render(ctx, root, { id }) {
  const { api, live } = ctx;
  const head = h('div', { class: 'job-head' });
  const facts = h('section', { 'aria-labelledby': 'facts-h' });
  const factors = h('section', { 'aria-labelledby': 'factors-h' });
  const events = h('section', { 'aria-labelledby': 'events-h' });
  const logNote = h('p', { class: 'muted', id: 'log-note' });
  const streams = STREAMS.map((s) => logPanel(s, () => download(s.name)));
  const logs = h('section', { 'aria-labelledby': 'log-h' }, h('h2', { id: 'log-h' }, 'Output'), logNote,
    h('div', { class: 'log-streams' }, streams.map((p) => p.box)));
  const status = h('p', { class: 'status', role: 'status', 'aria-live': 'polite' });
  root.append(h('p', {}, h('a', { href: '#/jobs' }, '← All jobs')), head, status, facts, factors, events, logs);

  let job = null;
  let logTimer = null;
  let pendingTimer = null;
  let logsMissing = false;
  let disposed = false;

  function drawHead() {
    const actions = h('div', { class: 'actions' });
    if (canCancel(ctx, job)) {
      const cancel = h('button', { type: 'button', class: 'danger', id: 'cancel' }, 'Cancel job');
      cancel.addEventListener('click', () => {
        clear(actions).append(
          h('span', {}, `Cancel ${job.name}? `),
          h('button', { type: 'button', class: 'danger', id: 'confirm-cancel', onclick: doCancel }, 'Yes, cancel it'),
          h('button', { type: 'button', class: 'secondary', onclick: drawHead }, 'Keep it'),
        );
        actions.querySelector('#confirm-cancel').focus();
      });
      actions.append(cancel);
    }
    const action = queueAction(ctx, job);
    if (action) {
      actions.append(h('button', { type: 'button', class: 'secondary', id: action, onclick: () => doAction(action) },
        ACTION_LABEL[action]));
    }
    clear(head).append(h('h1', {}, `${job.name} `, h('span', { class: 'muted' }, job.id)),
      h('p', {}, badge(job.state), ` ${job.state_code}`), actions);
  }

  async function doCancel() {
    status.textContent = 'Cancelling…';
    try {
      job = await api.post(`/v1/jobs/${encodeURIComponent(id)}/cancel`, { reason: 'cancelled from the dashboard' });
      status.textContent = `Cancel requested: the job is ${job.state}.`;
      await load();
    } catch (err) {
      status.textContent = `Cancel failed: ${err.message}`;
      drawHead();
    }
  }

  async function doAction(action) {
    status.textContent = `${ACTION_LABEL[action]}…`;
    try {
      job = await api.post(`/v1/jobs/${encodeURIComponent(id)}/${action}`);
      status.textContent = ACTION_DONE[action];
      await load();
    } catch (err) {
      status.textContent = `${ACTION_LABEL[action]} failed: ${err.message}`;
      drawHead();
    }
  }

  function drawFacts() {
    const j = job;
    const pending = j.state === 'PENDING';
    const slices = Array.isArray(j.slices) ? j.slices.map((s) => `${s.device_uuid || s.device}: ${fmtGpus(s.milli)} GPU, ${fmtMem(s.memory_mib)}`).join('; ') : null;
    clear(facts).append(h('h2', { id: 'facts-h' }, 'Details'), dl([
      ['Team', j.tenant], ['User', j.user], ['Pool', j.pool],
      ['Slice', sliceText(j)],
      ['GPU types', j.gpu_types.length ? j.gpu_types.join(', ') : 'any'],
      ['Nodes', j.nodes.length ? j.nodes.join(', ') : '–'],
      slices ? ['Devices', slices] : null,
      ['Isolation', j.isolation ? `${j.isolation} — ${ISOLATION[j.isolation] || ''}` : 'decided at start'],
      j.container ? ['Image', h('code', {}, [j.container.image, j.container.engine && `engine ${j.container.engine}`,
        j.container.workdir && `workdir ${j.container.workdir}`, ...j.container.mounts.map((m) => `mount ${m}`),
        ...Object.keys(j.container.env).sort().map((k) => `env ${k}`)].filter(Boolean).join('; '))] : null,
      ['Priority', `${j.priority_class} (${j.priority})`],
      ['Preemptible', j.preemptible ? 'yes' : 'no'],
      pending ? ['Held', j.held ? 'yes: it starts only once released' : 'no'] : null,
      pending ? ['Why pending', j.pending_reason || j.reason || 'waiting for the scheduler'] : null,
      pending ? ['Estimated start', j.estimated_start ? fmtTime(j.estimated_start) : 'unknown'] : null,
      ['Submitted', fmtTime(j.submit_time)],
      ['Started', fmtTime(j.start_time)],
      ['Ended', fmtTime(j.end_time)],
      ['Time limit', j.time_limit_s ? fmtDuration(j.time_limit_s) : 'pool default'],
      ['Restarts', String(j.restart_count)],
      ['Exit', j.exit_code === null ? (j.signal || '–') : `code ${j.exit_code}${j.signal ? `, ${j.signal}` : ''}`],
      ['Reason', j.reason || '–'],
      ['Command', h('code', {}, j.script ? j.script : j.command.join(' '))],
    ].filter(Boolean)));
  }

  function drawFactors() {
    clear(factors).append(h('h2', { id: 'factors-h' }, 'Priority factors'));
    if (!job.priority_factors) {
      factors.append(h('p', { class: 'muted' }, 'Not scored yet (the scheduler scores pending and running jobs each cycle).'));
      return;
    }
    const total = job.priority_factors.reduce((a, f) => a + f.contribution, 0);
    factors.append(h('table', { class: 'factors' },
      h('thead', {}, h('tr', {}, ['Factor', 'Weight', 'Value', 'Contribution', 'Meaning'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, job.priority_factors.map((f) => h('tr', {}, h('td', {}, f.name), h('td', {}, fmtNum(f.weight)),
        h('td', {}, fmtNum(f.value, 3)), h('td', {}, fmtNum(f.contribution, 3)), h('td', {}, f.meaning)))),
      h('tfoot', {}, h('tr', {}, h('th', { scope: 'row', colspan: 3 }, 'Total'), h('td', {}, fmtNum(total, 3)), h('td')))));
  }

  async function drawEvents() {
    const list = await api.get(`/v1/jobs/${encodeURIComponent(id)}/events`);
    clear(events).append(h('h2', { id: 'events-h' }, 'Events'), h('table', { class: 'events', id: 'job-events' },
      h('thead', {}, h('tr', {}, ['Time', 'From', 'To', 'Reason'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, list.map((e) => h('tr', {}, h('td', {}, fmtTime(e.time)), h('td', {}, e.source),
        h('td', {}, e.target), h('td', {}, e.reason || ''))))));
  }

  async function tailLog() {
    logTimer = null;
    if (disposed || logsMissing) return;
    try {
      for (const panel of streams) {
        const text = await api.get(`/v1/jobs/${encodeURIComponent(id)}/logs`, { stream: panel.name, tail: LOG_LINES });
        panel.show(typeof text === 'string' ? text : (text.text ?? JSON.stringify(text)));
      }
      logNote.textContent = TERMINAL.has(job.state)
        ? `The job has ended: the last ${LOG_LINES} lines of each stream; download a stream for all of it.`
        : `The last ${LOG_LINES} lines of each stream, refreshed every ${LOG_MS / 1000} s.`;
    } catch (err) {
      if (err instanceof ApiError && err.status === 404 && /endpoint/.test(err.message)) {
        logsMissing = true;
        streams.forEach((p) => { p.box.hidden = true; });
        logNote.textContent = 'This server does not serve job logs yet (no /v1/jobs/{id}/logs); read them on the node or with gpupool logs.';
        return;
      }
      logNote.textContent = `Log not available: ${err.message}`;
    }
    if (!disposed && !TERMINAL.has(job.state)) logTimer = setTimeout(tailLog, LOG_MS);
  }

  /** Fetch every kept byte of one stream, page by page, and save it as a file. */
  async function download(stream) {
    const panel = streams.find((p) => p.name === stream);
    panel.note.textContent = 'Downloading…';
    const parts = [];
    let offset = 0;
    let first = 0;
    try {
      for (;;) {
        const q = new URLSearchParams({ stream, offset: String(offset) });
        const res = await fetch(`/v1/jobs/${encodeURIComponent(id)}/logs?${q}`, { headers: api.headers({ Accept: 'text/plain' }) });
        if (!res.ok) throw new Error(`${res.status} ${res.statusText}`);
        const bytes = new Uint8Array(await res.arrayBuffer());
        if (offset === 0) first = Number(res.headers.get('X-Log-First') || 0);
        const next = Number(res.headers.get('X-Log-Next') || offset + bytes.length);
        if (bytes.length) parts.push(bytes);
        if (!bytes.length || next <= offset) break;
        offset = next;
      }
    } catch (err) {
      panel.note.textContent = `Download failed: ${err.message}`;
      return;
    }
    const url = URL.createObjectURL(new Blob(parts, { type: 'text/plain' }));
    const a = h('a', { href: url, download: `${id}.${stream}.log`, hidden: '' });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
    const size = parts.reduce((n, p) => n + p.length, 0);
    panel.note.textContent = first > 0
      ? `Saved ${fmtNum(size)} bytes; the server no longer kept the first ${fmtNum(first)} bytes (it keeps the newest log_keep_bytes).`
      : `Saved the whole ${stream}: ${fmtNum(size)} bytes.`;
  }

  async function load() {
    try {
      job = await api.get(`/v1/jobs/${encodeURIComponent(id)}`);
    } catch (err) {
      clear(head).append(h('h1', {}, 'Job not found'));
      status.textContent = err.status === 404
        ? `There is no job ${id} that you can see.` : `Could not load the job: ${err.message}`;
      return;
    }
    document.title = `${job.name} · Job · gpupool`;
    drawHead();
    drawFacts();
    drawFactors();
    await drawEvents().catch(() => {});
    if (!logTimer) tailLog();
    // The scheduler revises why a job waits and its estimated start every cycle without a
    // state change (so without a stream event): re-read a pending job now and then.
    clearTimeout(pendingTimer);
    if (!disposed && job.state === 'PENDING') pendingTimer = setTimeout(load, PENDING_MS);
  }

  const offs = [
    live.on('job', (e) => { if (e.job === id) load(); }),
    live.on('reconnect', () => load()),
  ];
  load();
  return () => {
    disposed = true;
    offs.forEach((off) => off());
    clearTimeout(logTimer);
    clearTimeout(pendingTimer);
  };
}
