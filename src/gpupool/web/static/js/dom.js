// Small DOM and formatting helpers shared by every view.
//
// h(tag, attrs, ...children) builds an element; attrs starting with "on" add listeners,
// `dataset` and `style` take objects, other keys become attributes (false/null are skipped).
// Amounts arrive from the API as integers: milli-GPU (1000 = one GPU) and MiB.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else if (key === 'dataset') {
      Object.assign(el.dataset, value);
    } else if (key === 'style' && typeof value === 'object') {
      Object.assign(el.style, value);
    } else if (key === 'text') {
      el.textContent = value;
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) el.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** "0.5", "2", "1.25": a milli-GPU amount as GPUs. */
export function fmtGpus(milli) {
  if (milli === null || milli === undefined) return '–';
  const gpus = milli / 1000;
  return Number.isInteger(gpus) ? String(gpus) : gpus.toFixed(3).replace(/0+$/, '');
}

/** "40 GiB", "512 MiB": a MiB amount. */
export function fmtMem(mib) {
  if (mib === null || mib === undefined) return '–';
  if (mib >= 1024) {
    const gib = mib / 1024;
    return `${Number.isInteger(gib) ? gib : gib.toFixed(1)} GiB`;
  }
  return `${mib} MiB`;
}

export function fmtPct(ratio) {
  if (ratio === null || ratio === undefined || Number.isNaN(ratio)) return '–';
  return `${Math.round(ratio * 100)}%`;
}

export function fmtNum(x, digits = 2) {
  if (x === null || x === undefined || Number.isNaN(x)) return '–';
  return x.toLocaleString('en', { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

export function fmtTime(epoch) {
  if (!epoch) return '–';
  const d = new Date(epoch * 1000);
  return d.toISOString().replace('T', ' ').slice(0, 19) + 'Z';
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return '–';
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function fmtAgo(epoch, now = Date.now() / 1000) {
  if (!epoch) return 'never';
  return `${fmtDuration(now - epoch)} ago`;
}

/** A labelled form field: <label for=id>text</label><input id=id ...>. */
export function field(labelText, control) {
  const id = control.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  control.id = id;
  return h('div', { class: 'field' }, h('label', { for: id }, labelText), control);
}

export function badge(state) {
  return h('span', { class: `badge state-${String(state).toLowerCase()}` }, state);
}

/** A definition list from [term, value] pairs (values may be nodes). */
export function dl(pairs) {
  return h('dl', { class: 'facts' }, pairs.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}
