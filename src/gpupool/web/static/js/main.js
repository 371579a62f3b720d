// The dashboard shell: sign-in, navigation by URL fragment, and the view registry.
//
// A view is a module exporting `title` and `render(ctx, root, params)`, which draws into
// `root` and returns a cleanup function (unsubscribe, stop timers). Routes map a fragment
// such as "#/jobs/abc123" to a view and its params. `ctx` carries the API client, the
// signed-in principal (from /v1/whoami), `can(permission)` and the Live event source.

import { Api, ApiError, storedToken, storeToken } from './api.js';
import { clear, h } from './dom.js';
import { Live } from './live.js';
import * as job from './views/job.js';
import * as jobs from './views/jobs.js';
import * as nodes from './views/nodes.js';
import * as overview from './views/overview.js';
import * as teams from './views/teams.js';
import * as usage from './views/usage.js';

const VIEWS = { overview, jobs, job, nodes, teams, usage };

const ROUTES = [
  { pattern: /^\/?$/, view: 'overview' },
  { pattern: /^\/overview$/, view: 'overview' },
  { pattern: /^\/jobs$/, view: 'jobs' },
  { pattern: /^\/jobs\/([^/]+)$/, view: 'job', params: ['id'] },
  { pattern: /^\/nodes$/, view: 'nodes' },
  { pattern: /^\/teams$/, view: 'teams' },
  { pattern: /^\/usage$/, view: 'usage' },
];

const $ = (id) => document.getElementById(id);
let ctx = null;
let cleanup = null;

function route() {
  const path = decodeURIComponent(location.hash.replace(/^#/, '')).split('?')[0];
  for (const r of ROUTES) {
    const m = r.pattern.exec(path);
    if (m) {
      const params = {};
      (r.params || []).forEach((name, i) => { params[name] = m[i + 1]; });
      return { view: r.view, params };
    }
  }
  return { view: null, params: { path } };
}

export function toast(message, kind = 'info') {
  const el = $('toast');
  el.textContent = message;
  el.dataset.kind = kind;
  el.classList.add('shown');
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => el.classList.remove('shown'), 6000);
}

function showSignIn(message = '') {
  if (ctx) ctx.live.stop();
  ctx = null;
  if (cleanup) cleanup();
  cleanup = null;
  clear($('view'));
  $('nav').hidden = true;
  $('session').hidden = true;
  $('signin').hidden = false;
  $('signin-error').textContent = message;
  document.title = 'Sign in · gpupool';
  $('token').focus();
}

async function signIn(token) {
  const api = new Api(token, () => {
    storeToken(null);
    showSignIn('The server refused the token (expired, revoked or unknown): sign in again.');
  });
  const me = await api.get('/v1/whoami');
  const perms = new Set(me.permissions);
  if (!perms.has('job:read') && !perms.has('node:read')) {
    throw new ApiError(403, `role ${me.role} has no dashboard views: use a person's token`);
  }
  storeToken(token);
  const can = (p) => perms.has(p);
  const live = new Live(api, { telemetry: can('node:read') });
  ctx = { api, me, can, live, clusterWide: can('job:read-any'), toast };
  $('signin').hidden = true;
  $('nav').hidden = false;
  $('session').hidden = false;
  $('who').textContent = `${me.user} · ${me.role}${me.tenant ? ` · ${me.tenant}` : ''}`;
  for (const a of $('nav').querySelectorAll('a[data-perm]')) {
    a.parentElement.hidden = !can(a.dataset.perm);
  }
  live.on('status', ({ state }) => {
    $('live').textContent = state;
    $('live').dataset.state = state;
  });
  live.start();
  render();
}

function render() {
  if (!ctx) return;
  if (cleanup) cleanup();
  cleanup = null;
  const { view, params } = route();
  const root = clear($('view'));
  for (const a of $('nav').querySelectorAll('a')) {
    const current = a.dataset.view === view || (view === 'job' && a.dataset.view === 'jobs');
    if (current) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const module = VIEWS[view];
  if (!module) {
    root.append(h('h1', {}, 'Not found'), h('p', {}, `There is no page ${params.path}. `,
      h('a', { href: '#/overview' }, 'Go to the overview')));
    return;
  }
  document.title = `${module.title} · gpupool`;
  try {
    cleanup = module.render(ctx, root, params) || null;
  } catch (err) {
    root.append(h('p', { class: 'error', role: 'alert' }, `This page failed: ${err.message}`));
  }
}

function boot() {
  $('signin-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const token = $('token').value.trim();
    if (!token) {
      $('signin-error').textContent = 'Paste an API token first.';
      return;
    }
    $('signin-error').textContent = '';
    try {
      await signIn(token);
      $('token').value = '';
    } catch (err) {
      const msg = err instanceof ApiError && err.status === 401
        ? 'The server refused this token (expired, revoked or mistyped).'
        : `Sign-in failed: ${err.message}`;
      showSignIn(msg);
    }
  });
  $('sign-out').addEventListener('click', () => {
    storeToken(null);
    showSignIn('Signed out.');
  });
  window.addEventListener('hashchange', () => {
    render();
    // After a page change, start keyboard and screen-reader users at the new content.
    if (ctx) $('main').focus({ preventScroll: true });
  });
  const token = storedToken();
  if (token) signIn(token).catch(() => showSignIn('Your session ended: sign in again.'));
  else showSignIn();
}

boot();
