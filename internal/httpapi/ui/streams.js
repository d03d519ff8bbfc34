// bgtask's dashboard: the page's event streams, held in a worker (dash.js says why).
// The page asks to open, listen to and close a stream; each event comes back
// as a message.
'use strict';
const sources = new Map();
const forward = (id, name) => (ev) => {
  // A failed connection is an error without data; the server's error event has some.
  postMessage({ id, type: name, data: ev.data, lastEventId: ev.lastEventId, readyState: sources.get(id)?.readyState });
};
onmessage = (e) => {
  const m = e.data;
  const s = sources.get(m.id);
  if (m.op === 'open' && !s) {
    const src = new EventSource(m.url);
    sources.set(m.id, src);
    src.listening = new Set(['message', 'error']);
    src.addEventListener('open', () => postMessage({ id: m.id, type: 'open', readyState: src.readyState }));
    src.addEventListener('message', forward(m.id, 'message'));
    src.addEventListener('error', forward(m.id, 'error'));
  } else if (m.op === 'listen' && s && !s.listening.has(m.name)) {
    s.listening.add(m.name);
    s.addEventListener(m.name, forward(m.id, m.name));
  } else if (m.op === 'close' && s) {
    s.close();
    sources.delete(m.id);
  }
};
