// The browser's end of BenchmarkEventDeliveryToABrowser: log in by the one-time
// LINK, open an EventSource on /v1/events from one of the server's own pages,
// and print, for each message, its task id and when it arrived by the page's
// clock (performance.timeOrigin + performance.now(), in ms of the Unix epoch)
// beside Date.now(), on stdout: "got ID MS DATE". "ready" once the stream is
// open; the run ends when stdin closes.
'use strict';
const { chromium } = require('playwright-core');
const { LINK, CHROMIUM } = process.env;

async function main() {
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
  const context = await browser.newContext();
  const page = await context.newPage();
  page.on('console', (m) => {
    if (m.type() === 'log') process.stdout.write(m.text() + '\n');
    else process.stderr.write(m.type() + ': ' + m.text() + '\n');
  });
  page.on('pageerror', (e) => process.stderr.write('page error: ' + e.message + '\n'));
  await page.route('**/favicon.ico', (r) => r.fulfill({ status: 204 })); // what a JSON page asks for besides
  // The session cookie, into the page's cookie jar, without the dashboard's
  // own stream.
  const login = await context.request.get(LINK, { maxRedirects: 0 });
  if (login.status() !== 303) throw new Error('the login link: ' + login.status());
  await page.goto(new URL('/v1/openapi.json', LINK).href); // a page of the server's with no stream of its own
  await page.evaluate(() => new Promise((resolve, reject) => {
    const es = new EventSource('/v1/events');
    es.onmessage = (e) => {
      const at = performance.timeOrigin + performance.now();
      console.log('got ' + JSON.parse(e.data).task_id + ' ' + at.toFixed(3) + ' ' + Date.now());
    };
    es.onopen = () => resolve();
    es.onerror = () => reject(new Error('the event stream failed'));
  }));
  console.log('ready');
  process.stdin.resume();
  await new Promise((resolve) => process.stdin.on('end', resolve));
  await browser.close();
}

main().catch((e) => { console.error(e); process.exit(1); });
