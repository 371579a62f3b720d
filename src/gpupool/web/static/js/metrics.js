// Parsing the Prometheus text of /metrics into per-device telemetry and per-pool figures.
//
// Words: "allocated" is compute given to slices (gpupool_gpu_compute_allocated_ratio, 1 = a
// whole GPU); "used" is utilisation from telemetry; "idle" is allocated but not used;
// "free" is not allocated. mem_share_ratio is memory promised to slices over physical memory.

const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

/** Map name -> [{labels, value}] for every sample line. */
export function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = LINE.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) {
      for (const lm of m[3].matchAll(LABEL)) {
        labels[lm[1]] = lm[2].replace(/\\"/g, '"').replace(/\\n/g, '\n').replace(/\\\\/g, '\\');
      }
    }
    const value = Number(m[4]);
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value });
  }
  return out;
}

const DEVICE_FIELDS = {
  gpupool_gpu_utilization_ratio: 'util',
  gpupool_gpu_memory_used_bytes: 'memUsedBytes',
  gpupool_gpu_memory_allocated_bytes: 'memAllocBytes',
  gpupool_gpu_memory_total_bytes: 'memTotalBytes',
  gpupool_gpu_compute_allocated_ratio: 'computeAlloc',
  gpupool_gpu_temperature_celsius: 'temp',
  gpupool_gpu_power_watts: 'power',
  gpupool_gpu_healthy: 'healthy',
};

/** Map device uuid -> {node, model, pool, util, temp, power, computeAlloc, mem*Bytes, healthy}. */
export function deviceTelemetry(parsed) {
  const devices = new Map();
  for (const [name, key] of Object.entries(DEVICE_FIELDS)) {
    for (const { labels, value } of parsed.get(name) || []) {
      const uuid = labels.device;
      if (!uuid) continue;
      if (!devices.has(uuid)) {
        devices.set(uuid, { uuid, node: labels.node, model: labels.model, pool: labels.pool });
      }
      devices.get(uuid)[key] = value;
    }
  }
  return devices;
}

/** Per pool: {gpus, allocated, used, idle, free, memShare, queue} in GPUs (floats). */
export function poolFigures(parsed, devices) {
  const pools = new Map();
  const pool = (name) => {
    if (!pools.has(name)) {
      pools.set(name, { name, gpus: 0, allocated: 0, used: 0, idle: 0, free: 0, memShare: null,
        queue: 0, hot: 0, unhealthy: 0 });
    }
    return pools.get(name);
  };
  for (const d of devices.values()) {
    const p = pool(d.pool || 'default');
    const alloc = d.computeAlloc || 0;
    const used = d.util || 0;
    p.gpus += 1;
    p.allocated += alloc;
    p.used += used;
    p.idle += Math.max(0, alloc - used);
    p.free += Math.max(0, 1 - alloc);
    if (d.healthy === 0) p.unhealthy += 1;
  }
  for (const { labels, value } of parsed.get('gpupool_mem_share_ratio') || []) {
    pool(labels.pool).memShare = value;
  }
  for (const { labels, value } of parsed.get('gpupool_scheduler_queue') || []) {
    pool(labels.pool).queue += value;
  }
  return pools;
}

/** {temperature: n, health: n}: devices with an alert in force. */
export function alertsInForce(parsed) {
  const out = {};
  for (const { labels, value } of parsed.get('gpupool_alerts') || []) out[labels.kind] = value;
  return out;
}
