"""Opens rewind's HTML pages (the run page of `rewind view`, a bisect report.html) in a real
headless Chromium at a phone and a laptop width, and fails on what a reader would hit: a
console error, any request beyond the file itself, a page wider than the screen, missing
verdict or culprit text, and axe-core violations of impact serious or critical.

  python3 check_pages.py [--shots DIR] run:PATH/run.html report:PATH/report.html
(--shots: a PNG of the top of each page at each width, DIR/KIND-WIDTH.png)

A report page must have report.json beside it: its verdict status, every culprit (failing
and fixing set) and its probe count must be visible text; a not-reproducible report must show
the recorded curve with the predicate's threshold and the closest step; a narrowing's tree
must nest probes and keep labels whole. Exit 0 when every check passes, 1 otherwise.

Chromium is the one CHROMIUM names (default /usr/bin/chromium), driven by PyPI's playwright;
axe-core is the axe.min.js that PyPI's axe-playwright-python ships (tests/browser/install.sh).
"""
import json
import math
import os
import sys
import time
from importlib.resources import files
from pathlib import Path

from playwright.sync_api import sync_playwright

AXE_SOURCE = (files("axe_playwright_python") / "axe.min.js").read_text(encoding="utf-8")
WIDTHS = [390, 1280]
HEIGHT = 800


def parse_args(args):
    shots = None
    pages = []
    i = 0
    while i < len(args):
        if args[i] == "--shots":
            i += 1
            shots = args[i] if i < len(args) else None
        else:
            kind, _, rest = args[i].partition(":")
            if kind not in ("run", "report") or not rest:
                print(f"check_pages: expected run:FILE or report:FILE, got '{args[i]}'", file=sys.stderr)
                sys.exit(2)
            pages.append({"kind": kind, "file": os.path.abspath(rest)})
        i += 1
    if not pages:
        print("usage: python3 check_pages.py [--shots DIR] run:run.html report:report.html", file=sys.stderr)
        sys.exit(2)
    return shots, pages


def report(p):
    with open(os.path.join(os.path.dirname(p["file"]), "report.json"), encoding="utf-8") as f:
        return json.load(f)


def expected_text(p):
    """The text a page must show, besides what every page needs (a <main>, a lang, a title)."""
    if p["kind"] == "run":
        return ["training loss over steps", "gradient norm over steps", "learning rate over steps",
                "Gradient norm peaks", "Per-head monitors", "rewind replay --store", "rewind step --store"]
    r = report(p)
    want = ["Verdict"]
    n = r.get("narrowing")
    if n:
        want.append("localized" if n["status"] == "localized" else n["status"].replace("-", " "))
        want.extend((n.get("failing_set") or []) + (n.get("fixing_set") or []))
    # The verdict's claim about its horizon, where it makes one.
    if (r.get("horizon") or {}).get("claim"):
        want.extend(["Claim.", r["horizon"]["claim"]])
    # One probe count with its breakdown, as report.json says it.
    if r.get("probe_count"):
        want.append(r["probe_count"]["text"])
    else:
        want.append("probe_count in report.json")
    # Not reproducible: the recorded curve, the threshold and the step where it came closest.
    t = r.get("time")
    if (n and n["status"] == "not-reproducible") or (t and t.get("status") == "not-reproducible"):
        want += ["not reproducible", "and the threshold of"]
        near = r.get("near_miss")
        if not near:
            want.append("near_miss in report.json")
        elif near.get("closest_step") is not None:
            want.append(f"Closest at step {near['closest_step']}")
    return list(dict.fromkeys(want))


# What the page structure must hold for its kind: charts with an accessible name, on the run
# page a layer x head heatmap, on a report with a narrowing a tree with a probe under another.
STRUCTURE_JS = r"""([kind, nested]) => {
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
}"""

# Elements sticking out of the viewport, for the failure message.
OVERFLOWERS_JS = r"""() => {
  const w = window.innerWidth;
  const out = [];
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (r.right > w + 1 && out.length < 5) out.push(`${e.tagName.toLowerCase()}${e.className ? '.' + e.className : ''} (right ${Math.round(r.right)})`);
  }
  return out;
}"""

MEASURE_JS = r"""() => ({
  scrollWidth: document.documentElement.scrollWidth,
  innerWidth: window.innerWidth,
  text: document.body.innerText,
  bytes: document.documentElement.outerHTML.length,
})"""

AXE_RUN_JS = "() => window.axe.run(document, { resultTypes: ['violations'] })"


def js_round(x):
    """Math.round: halves go up, so the KB figure reads as the Node port printed it."""
    return math.floor(x + 0.5)


def target_text(target):
    """An axe node target as Array.join(' ') writes it (a frame or shadow path joins with ',')."""
    return " ".join(t if isinstance(t, str) else ",".join(map(str, t)) for t in target)


def check_page(browser, p, pages, width, shots):
    """The problems of one page at one width, and the figures of its ok line."""
    url = Path(p["file"]).as_uri()
    want = expected_text(p)
    context = browser.new_context(viewport={"width": width, "height": HEIGHT})
    page = context.new_page()
    errors = []
    requests = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"{e.name}: {e.message}" if e.name else e.message))

    def route(r):
        u = r.request.url
        if u == url:
            r.continue_()
        else:
            requests.append(u)
            r.abort()

    page.route("**/*", route)
    t0 = time.monotonic()
    page.goto(url, wait_until="load")
    load_ms = js_round((time.monotonic() - t0) * 1000)
    problems = []
    m = page.evaluate(MEASURE_JS)
    if m["scrollWidth"] > m["innerWidth"] + 1:
        problems.append(f"page is {m['scrollWidth']} px wide on a {m['innerWidth']} px screen: "
                        + ", ".join(page.evaluate(OVERFLOWERS_JS)))
    problems += [f"missing text '{w}'" for w in want if w not in m["text"]]
    narrowing = report(p).get("narrowing") if p["kind"] == "report" else None
    nested = bool(narrowing) and (narrowing.get("engine_probes") or 0) > 2
    problems += page.evaluate(STRUCTURE_JS, [p["kind"], nested])
    if errors:
        problems.append("console errors: " + " | ".join(errors))
    if requests:
        problems.append("requests beyond the file: " + ", ".join(requests))
    # axe-core injected as inline script text: no request.
    page.add_script_tag(content=AXE_SOURCE)
    axe = page.evaluate(AXE_RUN_JS)
    bad = [v for v in axe["violations"] if v["impact"] in ("serious", "critical")]
    minor = [v for v in axe["violations"] if v["impact"] not in ("serious", "critical")]
    for v in bad:
        problems.append(f"axe {v['impact']} {v['id']}: {v['help']} "
                        f"({len(v['nodes'])}x, e.g. {target_text(v['nodes'][0]['target'])})")
    if shots:
        os.makedirs(shots, exist_ok=True)
        # The first page of a kind is KIND-WIDTH.png (the README's), later ones KIND-FOLDER-WIDTH.png.
        first = next(q for q in pages if q["kind"] == p["kind"]) is p
        tag = p["kind"] if first else f"{p['kind']}-{os.path.basename(os.path.dirname(p['file']))}"
        page.screenshot(path=os.path.join(shots, f"{tag}-{width}.png"))
    context.close()
    ok = (f"{m['scrollWidth']} px wide, {js_round(m['bytes'] / 1024)} KB, loaded in {load_ms} ms, "
          f"0 console errors, 0 requests, {len(want)} texts found, axe: 0 serious/critical")
    if minor:
        ok += " (" + ", ".join(f"{v['impact'] or 'null'} {v['id']}" for v in minor) + ")"
    return problems, ok


def main():
    shots, pages = parse_args(sys.argv[1:])
    failures = 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=os.environ.get("CHROMIUM") or "/usr/bin/chromium",
                                     args=["--no-sandbox", "--disable-gpu"])
        for p in pages:
            for width in WIDTHS:
                problems, ok = check_page(browser, p, pages, width, shots)
                name = f"{p['kind']} {'/'.join(p['file'].split('/')[-2:])} @{width}x{HEIGHT}"
                if problems:
                    failures += 1
                    print(f"FAIL {name}", flush=True)
                    for q in problems:
                        print(f"     {q}", flush=True)
                else:
                    print(f"ok   {name}: {ok}", flush=True)
        browser.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
