// The public API, as the signed-in user: JSON over fetch, errors from problem+json, and the
// server-sent event stream.
//
// EventSource cannot send an Authorization header, so the stream is read with fetch and
// parsed here (the format is "event: NAME\ndata: JSON\n\n"). The token lives in
// sessionStorage only (this tab), never in a cookie or localStorage.

const TOKEN_KEY = 'gpupool.token';

export class ApiError extends Error {
  constructor(status, detail, path) {
    super(detail);
    this.status = status;
    this.path = path;
  }
}

export function storedToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function storeToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

async function problem(res, path) {
  let detail = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    if (body && typeof body.detail === 'string') detail = body.detail;
    if (body && Array.isArray(body.errors) && body.errors.length) {
      detail += ': ' + body.errors.map((e) => `${e.field || ''} ${e.message || ''}`.trim()).join('; ');
    }
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(res.status, detail, path);
}

export class Api {
  constructor(token, onUnauthorized = () => {}) {
    this.token = token;
    this.onUnauthorized = onUnauthorized;
  }

  headers(extra = {}) {
    return { Authorization: `Bearer ${this.token}`, Accept: 'application/json', ...extra };
  }

  async request(method, path, { params, body, signal } = {}) {
    let url = path;
    if (params) {
      const q = new URLSearchParams();
      for (const [key, value] of Object.entries(params)) {
        if (value === null || value === undefined || value === '') continue;
        for (const v of Array.isArray(value) ? value : [value]) q.append(key, String(v));
      }
      const qs = q.toString();
      if (qs) url += `?${qs}`;
    }
    const init = { method, headers: this.headers(), signal };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const res = await fetch(url, init);
    if (res.status === 401) {
      const err = await problem(res, path);
      this.onUnauthorized(err);
      throw err;
    }
    if (!res.ok) throw await problem(res, path);
    if (res.status === 204) return null;
    const type = res.headers.get('content-type') || '';
    return type.includes('json') ? res.json() : res.text();
  }

  get(path, params, signal) {
    return this.request('GET', path, { params, signal });
  }

  post(path, body) {
    return this.request('POST', path, { body });
  }

  /** Every page of /v1/jobs matching params (bounded by maxJobs). */
  async allJobs(params = {}, maxJobs = 5000) {
    const jobs = [];
    let cursor = null;
    do {
      const page = await this.get('/v1/jobs', { ...params, limit: 1000, cursor });
      jobs.push(...page.jobs);
      cursor = page.next_cursor;
    } while (cursor && jobs.length < maxJobs);
    return jobs;
  }

  /** Prometheus text from /metrics (device telemetry, pool ratios, queues). */
  async metricsText(signal) {
    const res = await fetch('/metrics', { signal, headers: { Accept: 'text/plain' } });
    if (!res.ok) throw await problem(res, '/metrics');
    return res.text();
  }

  /**
   * Read /v1/events/stream until `signal` aborts; calls onMessage(eventName, data).
   * Resolves when the server closes the stream; rejects on network errors.
   */
  async stream(onMessage, signal) {
    const res = await fetch('/v1/events/stream', {
      headers: this.headers({ Accept: 'text/event-stream' }),
      signal,
    });
    if (res.status === 401) {
      const err = await problem(res, '/v1/events/stream');
      this.onUnauthorized(err);
      throw err;
    }
    if (!res.ok || !res.body) throw await problem(res, '/v1/events/stream');
    onMessage('open', null);
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let name = 'message';
        const data = [];
        for (const line of block.split('\n')) {
          if (line.startsWith(':')) continue;
          if (line.startsWith('event:')) name = line.slice(6).trim();
          else if (line.startsWith('data:')) data.push(line.slice(5).trimStart());
        }
        if (!data.length) continue;
        try {
          onMessage(name, JSON.parse(data.join('\n')));
        } catch {
          // a malformed message is skipped; the next poll brings fresh state
        }
      }
    }
  }
}
