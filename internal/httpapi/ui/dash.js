// bgtask's dashboard: the little that htmx does not do. No inline script or
// eval anywhere (the Content-Security-Policy allows this server's files only).
'use strict';

// The event streams are held by a worker, not by the page: a browser counts a
// page's own open stream as a load that never ends, and a headless one asked
// for the page once its loads end (chromium --dump-dom --virtual-time-budget)
// would wait forever. StreamSource is an EventSource to htmx's SSE extension
// and to the output tail; without workers it is the browser's own.
const streams = typeof Worker === 'function' ? new Worker('/ui/streams.js') : null;
const sourcesById = new Map();
let lastSourceId = 0;
if (streams) {
  streams.onmessage = (e) => sourcesById.get(e.data.id)?.receive(e.data);
}
class StreamSource extends EventTarget {
  constructor(url) {
    super();
    this.url = new URL(url, location.href).href;
    this.readyState = 0;
    this.onopen = this.onmessage = this.onerror = null;
    this.id = ++lastSourceId;
    sourcesById.set(this.id, this);
    streams.postMessage({ op: 'open', id: this.id, url: this.url });
  }
  addEventListener(name, listener, options) {
    streams.postMessage({ op: 'listen', id: this.id, name });
    super.addEventListener(name, listener, options);
  }
  close() {
    this.readyState = 2;
    sourcesById.delete(this.id);
    streams.postMessage({ op: 'close', id: this.id });
  }
  receive(m) {
    if (m.readyState !== undefined) this.readyState = m.readyState;
    const ev = m.data === undefined ? new Event(m.type) : new MessageEvent(m.type, { data: m.data, lastEventId: m.lastEventId });
    const handler = this['on' + m.type];
    if (typeof handler === 'function') handler.call(this, ev);
    this.dispatchEvent(ev);
  }
}
const openStream = (url) => (streams ? new StreamSource(url) : new EventSource(url));
if (window.htmx) htmx.createEventSource = openStream; // read by the SSE extension when it connects

// A live part (data-coalesce) fetches itself again at most twice a second
// however many events arrive, and always after the last of a burst; events of
// the types in data-skip (ticks, on the list) change nothing it shows.
const coalesceMs = 500;
document.addEventListener('htmx:confirm', (e) => {
  const elt = e.detail.elt;
  if (!elt.hasAttribute('data-coalesce')) return;
  e.preventDefault();
  const skip = (elt.getAttribute('data-skip') || '').split(' ');
  const msg = e.detail.triggeringEvent && e.detail.triggeringEvent.detail;
  if (msg && typeof msg.data === 'string' && skip.length) {
    try {
      if (skip.includes(JSON.parse(msg.data).type)) return;
    } catch (_) { /* not an event: refresh */ }
  }
  if (elt.bgtaskPending) return;
  elt.bgtaskPending = setTimeout(() => {
    elt.bgtaskPending = null;
    e.detail.issueRequest(true);
  }, coalesceMs);
});

// The timeline's open entries stay open across a refresh.
document.addEventListener('htmx:beforeSwap', (e) => {
  e.detail.target.bgtaskOpen = [...e.detail.target.querySelectorAll('details[open]')].map((d) => d.closest('[data-seq]')?.dataset.seq);
});
document.addEventListener('htmx:afterSwap', (e) => {
  for (const seq of e.detail.target.bgtaskOpen || []) {
    e.detail.target.querySelector(`[data-seq="${seq}"] details`)?.setAttribute('open', '');
  }
});

// The live badge: lit while the page's event stream is open.
const live = (on) => document.getElementById('live')?.classList.toggle('on', on);
document.addEventListener('htmx:sseOpen', () => live(true));
document.addEventListener('htmx:sseError', () => live(false));

// A button that ends something asks first (data-confirm on its form).
document.addEventListener('submit', (e) => {
  const question = e.target.getAttribute('data-confirm');
  if (question && !window.confirm(question)) e.preventDefault();
});

// A filter applies as soon as it is chosen.
document.addEventListener('change', (e) => {
  if (e.target.matches('[data-autosubmit]')) e.target.form.requestSubmit();
});

// The output tail: the task's log stream, followed until its end event. Chunks
// are text nodes (never HTML); the pane keeps the last maxOutput characters and
// follows the bottom unless the reader scrolled up.
const maxOutput = 512 * 1024;
function followOutput(pre) {
  const state = document.getElementById('output-state');
  const src = openStream(pre.dataset.logs);
  let size = 0;
  src.addEventListener('open', () => { state.textContent = 'following'; live(true); });
  src.addEventListener('message', (e) => {
    const chunk = JSON.parse(e.data);
    if (!chunk.data) return;
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    const span = document.createElement('span');
    span.className = chunk.stream;
    span.textContent = chunk.data;
    pre.appendChild(span);
    size += chunk.data.length;
    while (size > maxOutput && pre.firstChild) {
      size -= pre.firstChild.textContent.length;
      pre.removeChild(pre.firstChild);
    }
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  });
  src.addEventListener('end', () => {
    src.close();
    state.textContent = pre.childNodes.length ? 'ended' : 'ended, no output';
    pre.classList.add('ended');
  });
  src.addEventListener('error', (e) => {
    if (e.data) { // the server's error event: the reason, then no retry
      src.close();
      state.textContent = JSON.parse(e.data).error.message;
    } else if (src.readyState !== EventSource.CLOSED) {
      state.textContent = 'reconnecting…';
    }
  });
}
document.addEventListener('DOMContentLoaded', () => {
  document.querySelectorAll('pre[data-logs]').forEach(followOutput);
});
