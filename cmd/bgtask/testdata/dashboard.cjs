// The dashboard in a real browser (TestDashboardInABrowser): log in by the
// one-time link, register a task from the API and watch it appear in the list
// without a reload, open it and watch its output grow to its wake-up, cancel
// another from its page, and save a screenshot of each page in SHOTS.
'use strict';
const { chromium } = require('playwright-core');
const { URL: base, TOKEN, LINK, SHOTS, CHROMIUM, TASK_CWD } = process.env;
const step = (what) => console.log('step: ' + what);

async function api(method, path, body) {
  const resp = await fetch(base + path, {
    method, body: body && JSON.stringify(body),
    headers: { Authorization: 'Bearer ' + TOKEN, 'Content-Type': 'application/json' },
  });
  const text = await resp.text();
  if (!resp.ok) throw new Error(`${method} ${path}: ${resp.status} ${text}`);
  return JSON.parse(text);
}

async function main() {
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, colorScheme: 'light' });
  const page = await context.newPage();
  const problems = [];
  page.on('console', (m) => { if (m.type() === 'error') problems.push('console: ' + m.text() + ' ' + m.location().url); });
  page.on('response', (r) => { if (r.status() >= 400) problems.push(`${r.status()} ${r.request().method()} ${r.url()}`); });
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('requestfailed', (r) => {
    // A stream, or a refresh that a navigation cut short, is no failure.
    if (r.failure().errorText !== 'net::ERR_ABORTED') problems.push('request failed: ' + r.url() + ' ' + r.failure().errorText);
  });
  const shot = (name) => page.screenshot({ path: `${SHOTS}/${name}.png` });
  try {
    await run(page, shot);
  } catch (e) {
    await shot('failed').catch(() => {});
    console.error('at ' + page.url() + ':\n' + (await page.$eval('main', (m) => m.innerText).catch(() => '')));
    throw e;
  }
  await browser.close();
  if (problems.length) throw new Error('the browser reported:\n' + problems.join('\n'));
}

// checkFacts fails unless every wide row of a task's facts starts at the first
// column, however many rows came before it.
async function checkFacts(page) {
  const bad = await page.$$eval('dl.facts dd.wide', (dds) => {
    const first = document.querySelector('dl.facts dt').getBoundingClientRect().left;
    return dds.map((dd) => dd.previousElementSibling).filter((dt) => Math.abs(dt.getBoundingClientRect().left - first) > 1).map((dt) => dt.textContent);
  });
  if (bad.length) throw new Error('wide rows out of the first column: ' + bad.join(', '));
}

async function run(page, shot) {

  step('log in');
  await page.goto(LINK);
  await page.waitForSelector('#live.on', { timeout: 15000 }); // the list's event stream is open
  await page.evaluate(() => { window.bgtaskNoReload = true; });

  step('register from the API; the list shows it live');
  await api('PUT', '/v1/targets/agent-7', { state: 'idle' });
  const script = 'for i in $(seq 1 30); do echo "compiling unit $i of 30"; sleep 0.1; done; echo "warning: 2 tests skipped" >&2; echo done';
  const { id } = await api('POST', '/v1/tasks', { command: script, cwd: TASK_CWD, target: 'agent-7', kind: 'build',
    prompt: 'The build finished: read its output and fix what failed.' });
  await page.waitForSelector(`tr[data-id="${id}"]`, { timeout: 15000 });
  if (!(await page.evaluate(() => window.bgtaskNoReload))) throw new Error('the list reloaded the page');
  await page.waitForSelector(`tr[data-id="${id}"] .state-fired`, { timeout: 30000 });
  for (let i = 0; i < 3; i++) await api('POST', '/v1/tasks', { command: `sleep 0.${i + 1}; echo test shard ${i}`, cwd: TASK_CWD, kind: 'test' });
  const failing = await api('POST', '/v1/tasks', { command: 'go test ./parser/ 2>&1 || { echo "FAIL: TestParse" >&2; exit 1; }', cwd: TASK_CWD, kind: 'test', target: 'agent-7' });
  await page.waitForSelector(`tr[data-id="${failing.id}"] .status-failed`, { timeout: 30000 });
  const long = await api('POST', '/v1/tasks', { command: 'for i in $(seq 900); do date; sleep 0.2; done', cwd: TASK_CWD, target: 'agent-7' });
  await page.waitForSelector(`tr[data-id="${long.id}"] .state-running`, { timeout: 30000 });
  await shot('tasks');

  step('filter the list: the filter goes into the URL');
  await page.fill('input[name=kind]', 'test');
  await page.press('input[name=kind]', 'Enter');
  await page.waitForURL(/[?&]kind=test/, { timeout: 15000 });
  const kinds = await page.$$eval('tr[data-id]', (rows) => rows.map((r) => r.dataset.id));
  if (kinds.length !== 4 || !kinds.includes(failing.id)) throw new Error('kind=test lists ' + kinds.join(', '));

  step('open a task: its output grows while it runs');
  const grow = await api('POST', '/v1/tasks', { command: 'for i in $(seq 1 40); do echo "step $i"; sleep 0.1; done', cwd: TASK_CWD });
  await page.goto(`${base}/tasks/${grow.id}`);
  await page.waitForFunction(() => /step 3\b/.test(document.getElementById('output').textContent), null, { timeout: 15000 });
  const early = await page.$eval('#output', (e) => e.textContent.length);
  await page.waitForFunction((n) => document.getElementById('output').textContent.length > n, early, { timeout: 15000 });
  await page.waitForSelector('#output.ended', { timeout: 30000 });
  const out = await page.$eval('#output', (e) => e.textContent);
  if (!out.includes('step 40')) throw new Error('the output tail ends early: ' + out.slice(-200));
  await checkFacts(page);

  step('the first task: its timeline to fired and its wake-up');
  await page.goto(`${base}/tasks/${id}`);
  await page.waitForSelector('.ev-fired', { timeout: 15000 });
  await page.waitForSelector('#output.ended', { timeout: 15000 });
  for (const type of ['armed', 'spawned', 'tick', 'exited', 'completion-persisted', 'fired']) {
    if (!(await page.$(`.ev-${type}`))) throw new Error('the timeline has no ' + type);
  }
  await page.waitForSelector('.wakeup .prompt');
  await checkFacts(page);
  await shot('task');
  await page.emulateMedia({ colorScheme: 'dark' });
  await shot('task-dark');
  await page.emulateMedia({ colorScheme: 'light' });

  step('cancel the long task from its page');
  await page.goto(`${base}/tasks/${long.id}`);
  await page.waitForFunction(() => document.getElementById('output').textContent.length > 0, null, { timeout: 15000 });
  let asked = '';
  page.once('dialog', (d) => { asked = d.message(); d.accept(); });
  await page.click('#cancel');
  if (!asked.startsWith('Cancel this task?')) throw new Error('cancel did not ask first: ' + asked);
  await page.waitForSelector('h1 .state-cancelled', { timeout: 15000 });
  await page.waitForSelector('.ev-cancelled', { timeout: 15000 });
  await page.waitForSelector('#output.ended', { timeout: 15000 }); // the page again, its output read again
  if (!(await page.$eval('#output', (e) => e.textContent.length))) throw new Error('no output on the cancelled task');
  await checkFacts(page);
  await shot('task-cancelled');
  const t = await api('GET', `/v1/tasks/${long.id}`);
  if (t.state !== 'cancelled') throw new Error('the API says the cancelled task is ' + t.state);

  step('workers and targets');
  await api('PUT', '/v1/targets/reviewer', { state: 'busy', ttl: '30m' });
  await page.goto(`${base}/workers`);
  await page.waitForSelector('table.workers tbody tr td code');
  await shot('workers');
  await page.goto(`${base}/targets`);
  await page.waitForSelector('table.targets .state-busy');
  const unread = await page.$$eval('table.targets tbody tr', (rows) => rows.map((r) => r.innerText.replace(/\s+/g, ' ')));
  if (!unread.some((r) => r.startsWith('agent-7 idle') && r.includes(' 2 in the inbox'))) throw new Error('agent-7 has not its 2 wake-ups: ' + unread);
  await shot('targets');
  await page.goto(`${base}/audit`);
  await page.click('#run-audit');
  await page.waitForSelector('.tile.good', { timeout: 30000 }); // no violation
  await shot('audit');

  console.log(JSON.stringify({ ok: true, first: id, cancelled: long.id }));
}

main().catch((e) => { console.error(e.stack || String(e)); process.exit(1); });
