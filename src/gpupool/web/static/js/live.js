// Live updates without reloads: the server-sent event stream and a telemetry poller.
//
// Live is an event target. It emits:
//   "job"       {job, time, from, to}  a job the user may see changed state
//   "cluster"   {kind, subject, message, time}  alerts and node changes
//   "telemetry" {parsed, devices}  a fresh /metrics sample (every TELEMETRY_MS or slower)
//   "status"    {state: "live" | "reconnecting" | "offline"}
//   "reconnect" the stream came back: views reload what they show
// History keeps the last HISTORY samples of each device for sparklines.

import { deviceTelemetry, parseMetrics } from './metrics.js';

export const TELEMETRY_MS = 3000;
export const HISTORY = 60;

export class Live extends EventTarget {
  constructor(api, { telemetry = true } = {}) {
    super();
    this.api = api;
    this.telemetryEnabled = telemetry;
    this.abort = new AbortController();
    this.history = new Map(); // uuid -> {util: [], temp: [], mem: []}
    this.latest = null;
    this.connectedOnce = false;
  }

  emit(name, detail) {
    this.dispatchEvent(new CustomEvent(name, { detail }));
  }

  on(name, fn) {
    const handler = (e) => fn(e.detail);
    this.addEventListener(name, handler);
    return () => this.removeEventListener(name, handler);
  }

  start() {
    this.runStream();
    if (this.telemetryEnabled) this.runTelemetry();
  }

  stop() {
    this.abort.abort();
  }

  async runStream() {
    let delay = 1000;
    const { signal } = this.abort;
    while (!signal.aborted) {
      try {
        await this.api.stream((name, data) => {
          if (name === 'open') {
            delay = 1000;
            this.emit('status', { state: 'live' });
            if (this.connectedOnce) this.emit('reconnect', null);
            this.connectedOnce = true;
          } else {
            this.emit(name, data);
          }
        }, signal);
      } catch (err) {
        if (signal.aborted || err.status === 401) return;
      }
      if (signal.aborted) return;
      this.emit('status', { state: 'reconnecting' });
      await sleep(delay, signal);
      delay = Math.min(delay * 2, 15000);
    }
  }

  // The poll backs off on big pools (at most a fifth of the time spent fetching) and pauses
  // while the tab is hidden, so an idle tab on a 1,000-GPU pool costs the server little.
  async runTelemetry() {
    const { signal } = this.abort;
    while (!signal.aborted) {
      if (document.hidden) {
        await new Promise((resolve) => {
          const wake = () => { document.removeEventListener('visibilitychange', wake); resolve(); };
          document.addEventListener('visibilitychange', wake);
          signal.addEventListener('abort', wake, { once: true });
        });
        continue;
      }
      const t0 = performance.now();
      await this.sampleTelemetry();
      await sleep(Math.max(TELEMETRY_MS, 5 * (performance.now() - t0)), signal);
    }
  }

  async sampleTelemetry() {
    try {
      const parsed = parseMetrics(await this.api.metricsText(this.abort.signal));
      const devices = deviceTelemetry(parsed);
      for (const d of devices.values()) {
        let hist = this.history.get(d.uuid);
        if (!hist) {
          hist = { util: [], temp: [], mem: [] };
          this.history.set(d.uuid, hist);
        }
        push(hist.util, d.util);
        push(hist.temp, d.temp);
        push(hist.mem, d.memTotalBytes ? (d.memUsedBytes ?? null) / d.memTotalBytes : null);
      }
      this.latest = { parsed, devices };
      this.emit('telemetry', this.latest);
    } catch {
      // the next tick tries again; views keep their last figures
    }
    return this.latest;
  }
}

function push(list, value) {
  list.push(value === undefined ? null : value);
  if (list.length > HISTORY) list.shift();
}

export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });
}
