// Opens rewind's HTML pages (the run page of `rewind view`, a bisect report.html) in a real
// headless Chromium at a phone and a laptop width, and fails on what a reader would hit: a
// console error, any request beyond the file itself, a page wider than the screen, missing
// verdict or culprit text, and axe-core violations of impact serious or critical.
//
//   node check_pages.mjs [--shots DIR] run:PATH/run.html report:PATH/report.html
// (--shots: a PNG of the top of each page at each width, DIR/KIND-WIDTH.png)
//
// A report page must have report.json beside it: its verdict status, every culprit (failing
// and fixing set) and its probe count must be visible text; a not-reproducible report must show
// the recorded curve with the predicate's threshold and the closest step; a narrowing's tree
// must nest probes and keep labels whole. Exit 0 when every check passes, 1 otherwise.
import { readFileSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { basename, dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { chromium } from 'playwright-core';

const require = createRequire(import.meta.url);
const axeSource = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
const kWidths = [390, 1280];
const kHeight = 800;

const args = process.argv.slice(2);
let shots = null;
const pages = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--shots') shots = args[++i];
  else {
    const [kind, ...rest] = args[i].split(':');
    if (!['run', 'report'].includes(kind) || !rest.length) {
      console.error(`check_pages: expected run:FILE or report:FILE, got '${args[i]}'`);
      process.exit(2);
    }
    pages.push({ kind, file: resolve(rest.join(':')) });
  }
}
if (!pages.length) {
  console.error('usage: node check_pages.mjs [--shots DIR] run:run.html report:report.html');
  process.exit(2);
}

// The text a page must show, besides what every page needs (a <main>, a lang, a title).
function expectedText(p) {
  if (p.kind === 'run')
    return ['training loss over steps', 'gradient norm over steps', 'learning rate over steps', 'Gradient norm peaks', 'Per-head monitors', 'rewind replay --store', 'rewind step --store'];
  const r = report(p);
  const want = ['Verdict'];
  const n = r.narrowing;
  if (n) {
    want.push(n.status === 'localized' ? 'localized' : n.status.replaceAll('-', ' '));
    for (const c of [...(n.failing_set || []), ...(n.fixing_set || [])]) want.push(c);
  }
  // One probe count with its breakdown, as report.json says it.
  if (r.probe_count) want.push(r.probe_count.text);
  else want.push('probe_count in report.json');
  // Not reproducible: the recorded curve, the threshold and the step where it came closest.
  if ((n && n.status === 'not-reproducible') || (r.time && r.time.status === 'not-reproducible')) {
    want.push('not reproducible', 'and the threshold of');
    if (!r.near_miss) want.push('near_miss in report.json');
    else if (r.near_miss.closest_step !== null) want.push(`Closest at step ${r.near_miss.closest_step}`);
  }
  return [...new Set(want)];
}

function report(p) {
  return JSON.parse(readFileSync(join(dirname(p.file), 'report.json'), 'utf8'));
}

// What the page structure must hold for its kind: charts with an accessible name, on the run
// page a layer x head heatmap, on a report with a narrowing a tree with a probe under another.
async function structure(page, kind, nested) {
  return page.evaluate(([kind, nested]) => {
    const problems = [];
    if (!document.documentElement.lang) problems.push('no lang attribute on <html>');
    if (!document.querySelector('main')) problems.push('no <main>');
    if (!document.querySelector('meta[name=viewport]')) problems.push('no viewport meta');
    const svgs = [...document.querySelectorAll('svg')];
    if (!svgs.length) problems.push('no chart');
    for (const s of svgs)
      if (!s.getAttribute('aria-label') && !s.querySelector('title')) problems.push('an svg without a title or aria-label');
    if (kind === 'run') {
      const heat = svgs.filter((s) => /per layer \(rows\) and head \(columns\)/.test(s.getAttribute('aria-label') || ''));
      if (!heat.length) problems.push('no layer x head heatmap');
      const charts = svgs.filter((s) => s.classList.contains('chart'));
      if (charts.length < 3) problems.push(`${charts.length} line charts, want loss, grad norm and lr`);
      for (const c of charts)
        if (!c.querySelector('polyline')) problems.push(`chart '${c.getAttribute('aria-label')}' draws no curve`);
    }
    if (kind === 'report') {
      for (const c of svgs.filter((s) => s.classList.contains('chart')))
        if (!c.querySelector('polyline')) problems.push(`chart '${c.getAttribute('aria-label')}' draws no curve`);
      for (const c of svgs.filter((s) => s.classList.contains('dots')))
        if (!c.querySelector('circle, path')) problems.push(`chart '${c.getAttribute('aria-label')}' marks no probe`);
      if (nested && !document.querySelector('.tree li li')) problems.push('the narrowing tree has no probe under another');
      for (const e of document.querySelectorAll('.tree code'))
        if (e.textContent.endsWith('...')) problems.push(`a tree label is cut: ${e.textContent}`);
    }
    return problems;
  }, [kind, nested]);
}

// Elements sticking out of the viewport, for the failure message.
async function overflowers(page) {
  return page.evaluate(() => {
    const w = window.innerWidth;
    const out = [];
    for (const e of document.querySelectorAll('body *')) {
      const r = e.getBoundingClientRect();
      if (r.right > w + 1 && out.length < 5) out.push(`${e.tagName.toLowerCase()}${e.className ? '.' + e.className : ''} (right ${Math.round(r.right)})`);
    }
    return out;
  });
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu'],
});
let failures = 0;
for (const p of pages) {
  const url = pathToFileURL(p.file).href;
  const want = expectedText(p);
  for (const width of kWidths) {
    const context = await browser.newContext({ viewport: { width, height: kHeight } });
    const page = await context.newPage();
    const errors = [];
    const requests = [];
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.route('**/*', (route) => {
      const u = route.request().url();
      if (u === url) return route.continue();
      requests.push(u);
      return route.abort();
    });
    const t0 = Date.now();
    await page.goto(url, { waitUntil: 'load' });
    const loadMs = Date.now() - t0;
    const problems = [];
    const { scrollWidth, innerWidth, text, bytes } = await page.evaluate(() => ({
      scrollWidth: document.documentElement.scrollWidth,
      innerWidth: window.innerWidth,
      text: document.body.innerText,
      bytes: document.documentElement.outerHTML.length,
    }));
    if (scrollWidth > innerWidth + 1)
      problems.push(`page is ${scrollWidth} px wide on a ${innerWidth} px screen: ${(await overflowers(page)).join(', ')}`);
    for (const w of want) if (!text.includes(w)) problems.push(`missing text '${w}'`);
    const nested = p.kind === 'report' && report(p).narrowing && report(p).narrowing.engine_probes > 2;
    problems.push(...(await structure(page, p.kind, nested)));
    if (errors.length) problems.push(`console errors: ${errors.join(' | ')}`);
    if (requests.length) problems.push(`requests beyond the file: ${requests.join(', ')}`);
    // axe-core injected as inline script text: no request.
    await page.addScriptTag({ content: axeSource });
    const axe = await page.evaluate(() => window.axe.run(document, { resultTypes: ['violations'] }));
    const bad = axe.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
    const minor = axe.violations.filter((v) => !bad.includes(v));
    for (const v of bad)
      problems.push(`axe ${v.impact} ${v.id}: ${v.help} (${v.nodes.length}x, e.g. ${v.nodes[0].target.join(' ')})`);
    if (shots) {
      mkdirSync(shots, { recursive: true });
      // The first page of a kind is KIND-WIDTH.png (the README's), later ones KIND-FOLDER-WIDTH.png.
      const first = pages.find((q) => q.kind === p.kind) === p;
      const tag = first ? p.kind : `${p.kind}-${basename(dirname(p.file))}`;
      await page.screenshot({ path: join(shots, `${tag}-${width}.png`) });
    }
    const name = `${p.kind} ${p.file.split('/').slice(-2).join('/')} @${width}x${kHeight}`;
    if (problems.length) {
      ++failures;
      console.log(`FAIL ${name}`);
      for (const q of problems) console.log(`     ${q}`);
    } else {
      console.log(`ok   ${name}: ${scrollWidth} px wide, ${Math.round(bytes / 1024)} KB, loaded in ${loadMs} ms, ` +
                  `0 console errors, 0 requests, ${want.length} texts found, axe: 0 serious/critical` +
                  (minor.length ? ` (${minor.map((v) => `${v.impact} ${v.id}`).join(', ')})` : ''));
    }
    await context.close();
  }
}
await browser.close();
process.exit(failures ? 1 : 0);
