#!/usr/bin/env python3
"""Reads rewind stores and bisect reports for experiments/real_failure/run.sh (stdlib only).

  analyze.py last-step DB                  the last recorded step (exit 1: no store)
  analyze.py series DB CSV                 step,loss,grad_norm,lr of every step; where candidate
                                           predicates first fire; a table every 250 steps
  analyze.py window REPORT                 "FROM TO" of the bisected window
  analyze.py fixing-plan REPORT REF        the fixing set as a plan: each element at REF's setting
  analyze.py set-plan REPORT REF failing|layers|stable   the failing set, its layers, or the
                                           stabilized softmax in the fixing set's heads
  analyze.py monitors DB REPORT CSV SVG    per-head monitors, guilty heads against the others
  analyze.py lead CSV FAIL [RATIO]         from that CSV: when the guilty heads stand out
  analyze.py plot SVG NAME:CSV ...         loss and gradient norm of several runs
  analyze.py confirm FAIL [--history CSV] NAME:CSV ...   per run: where the predicate first holds,
                                           grad norms; --history: the trailing median also sees that
                                           run's steps before each branch's first (its fork point)
  analyze.py at STEP,... NAME:CSV ...      loss / grad norm of each run at those steps
  analyze.py every K OUT NAME:CSV ...      one CSV of every K-th step of several runs, side by side
  analyze.py hold-fork REPORT SRC DST      the hold verdict's `rewind train --fork` command, on SRC into DST
  analyze.py hold-field REPORT KEY         one field of the report's horizon
  analyze.py hold-compare REPORT CSV       the fork's last 500 steps against the reference branch's
  analyze.py lasting [--history CSV] NAME:CSV ...   per run: the hold verdict's lasting-break
                                           predicate's first step, grad norm and loss at its end
"""
import csv, json, math, os, re, sqlite3, statistics, struct, sys


def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def connect(db):
    if not os.path.exists(db):
        sys.exit(1)
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True)


def last_run(c):
    return c.execute("select max(id) from runs").fetchone()[0]


def steps(db):
    c = connect(db)
    run = last_run(c)
    rows = c.execute("select step, loss_bits, grad_norm_bits, lr from steps where run=? order by step", (run,))
    return [(s, f32(l), f32(g), lr) for s, l, g, lr in rows]


def rmedian_first(gn, first_step, k, n):
    """First step t (after a step where it was false) with gn[t] > k * median(gn[t-n:t])."""
    was_false = False
    for i in range(n, len(gn)):
        g = gn[i] if math.isfinite(gn[i]) else math.inf
        med = statistics.median(x if math.isfinite(x) else math.inf for x in gn[i - n:i])
        holds = g > k * med
        if holds and was_false:
            return first_step + i
        was_false = was_false or not holds
    return None


def cmd_series(db, out):
    rows = steps(db)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss", "grad_norm", "lr"])
        for s, l, g, lr in rows:
            w.writerow([s, f"{l:.6g}", f"{g:.6g}", f"{lr:.6g}"])
    if not rows:
        print("no steps"); return
    first = rows[0][0]
    gn = [r[2] for r in rows]
    print(f"{db}: steps {first}..{rows[-1][0]}")
    for n in (250, 500, 1000):
        print(f"  'grad_norm > 10 * rmedian(grad_norm, {n})' first turns true at step {rmedian_first(gn, first, 10, n)}")
    for thr in (2, 5, 10):
        t = next((s for s, l, g, lr in rows if s > first + 2500 and not (g <= thr)), None)
        print(f"  grad_norm > {thr} (after the warmup) first at step {t}")
    nan = next((s for s, l, g, lr in rows if not math.isfinite(l)), None)
    print(f"  first non-finite loss: {nan}")
    print("  step    loss   grad_norm  (mean of the 50 steps up to it)")
    for s0 in range(first, rows[-1][0] + 1, 250):
        win = [r for r in rows if s0 - 49 <= r[0] <= s0]
        if win:
            ml = sum(r[1] for r in win) / len(win)
            mg = sum(r[2] for r in win) / len(win)
            print(f"  {s0:5d}  {ml:6.3f}  {mg:9.3f}")


def report(path):
    with open(path) as f:
        return json.load(f)


def cmd_window(path):
    r = report(path)
    if "narrowing" in r:
        a, b = r["narrowing"]["window"]
    elif r.get("time", {}).get("status") == "window":
        a, b = r["time"]["c_star"], r["time"]["fail_step"]
    else:
        sys.exit(1)
    print(a, b)


def element_plan(e, ref):
    """Element 'L2.H3.qk' / 'L2.H3' / 'L2.attn' / 'L2.mlp' at the settings REF gives it."""
    m = re.fullmatch(r"L(\d+)(?:\.H(\d+))?(?:\.(\w+))?", e)
    if not m:
        return []
    layer, head, op = m.group(1), m.group(2), m.group(3)
    out = []
    for a in ref.split(";"):
        a = a.strip()
        mm = re.fullmatch(r"L[^.]+\.H[^.]+\.(\w+)=(.+)", a)
        if not mm:
            continue
        rop, mode = mm.groups()
        if head is None and op not in (None, "attn"):
            continue  # a module: not an attention setting
        if op not in (None, "attn") and op != rop:
            continue
        hs = head if head is not None else "*"
        out.append(f"L{layer}.H{hs}.{rop}={mode}")
    return out


def cmd_fixing_plan(path, ref):
    r = report(path)
    fix = r.get("narrowing", {}).get("fixing_set", [])
    parts = [p for e in fix for p in element_plan(e, ref)]
    print(";".join(parts) if parts else ref)


def cmd_set_plan(path, ref, which):
    """failing: the failing set at REF; layers: every head of its layers at REF; stable: the
    fixing set's heads with the stabilized softmax."""
    r = report(path)
    heads = sorted(guilty_heads(r))
    if which == "failing":
        parts = [p for e in r.get("narrowing", {}).get("failing_set", []) for p in element_plan(e, ref)]
    elif which == "layers":
        parts = [p for l in sorted({l for l, _ in heads}) for p in element_plan(f"L{l}.attn", ref)]
    else:
        fix = r.get("narrowing", {}).get("fixing_set", [])
        hs = sorted({m.groups() for m in (re.match(r"L(\d+)\.H(\d+)", e) for e in fix) if m})
        parts = [f"L{l}.H{h}.softmax=stable(beta=2)" for l, h in hs]
    print(";".join(parts))


def guilty_heads(r):
    n = r.get("narrowing", {})
    heads = set()
    for e in n.get("fixing_set", []) + n.get("failing_set", []):
        m = re.match(r"L(\d+)\.H(\d+)", e)
        if m:
            heads.add((int(m.group(1)), int(m.group(2))))
        else:
            m = re.match(r"L(\d+)\.attn", e)
            if m:
                heads.update((int(m.group(1)), h) for h in range(r["model"]["n_head"]))
    return heads


def cmd_lead(path, fail, ratio=3.0):
    """From monitors.csv: per monitor, the first sampled step from which the guilty heads' mean
    stays above `ratio` x the other heads' mean up to the failure step (the lead time)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for key in ("pbar_one", "repmax_rate", "wq_sn", "max_logit"):
        pts = [(int(r["step"]), float(r["guilty_mean"]), float(r["others_mean"])) for r in rows if r["monitor"] == key]
        pts = [p for p in pts if p[0] <= fail]
        lead = None
        for s_, g, o in pts:
            if g > ratio * o:
                lead = s_ if lead is None else lead
            else:
                lead = None
        at = next(((g, o) for s_, g, o in reversed(pts)), (math.nan, math.nan))
        lt = f"lead time {fail - lead} steps" if lead is not None else "does not stand out"
        print(f"  {key:12s}: guilty mean > {ratio:g}x the others' mean from step {lead} to the failure at {fail}: {lt} "
              f"(at step {pts[-1][0] if pts else '-'}: {at[0]:.4g} vs {at[1]:.4g})")


def cmd_monitors(db, rpath, out_csv, out_svg, every=50):
    r = report(rpath)
    guilty = guilty_heads(r)
    c = connect(db)
    run = last_run(c)
    keys = ("pbar_one", "repmax_rate", "wq_sn", "max_logit")
    data = {}  # (key, layer, head) -> {step: value}
    for step, key, value in c.execute(
            "select step, key, value from metrics where run=? and step % ? = 0 and key like 'L%'", (run, every)):
        m = re.fullmatch(r"L(\d+)\.H(\d+)\.(\w+)", key)
        if m and m.group(3) in keys:
            data.setdefault((m.group(3), int(m.group(1)), int(m.group(2))), {})[step] = value
    steps_ = sorted({s for d in data.values() for s in d})
    fail = r.get("time", {}).get("fail_step")
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "monitor", "guilty_mean", "others_mean", "others_p99", "guilty_max_head"])
        lines = {}
        for key in keys:
            lead = None
            for s in steps_:
                g = [d[s] for (k, l, h), d in data.items() if k == key and (l, h) in guilty and s in d]
                o = sorted(d[s] for (k, l, h), d in data.items() if k == key and (l, h) not in guilty and s in d)
                if not g or not o:
                    continue
                p99 = o[min(len(o) - 1, int(0.99 * len(o)))]
                gm, om = sum(g) / len(g), sum(o) / len(o)
                w.writerow([s, key, f"{gm:.6g}", f"{om:.6g}", f"{p99:.6g}", f"{max(g):.6g}"])
                lines.setdefault(key, []).append((s, gm, om, max(g), p99))
                # Stands out: a guilty head above every other head's 99th percentile, from here on.
                if max(g) > p99 and lead is None:
                    lead = s
                elif max(g) <= p99:
                    lead = None
            lt = f"{fail - lead} steps before the failure step {fail}" if (lead is not None and fail) else "-"
            print(f"  {key:12s}: guilty heads stand out (max over them > 99th percentile of the {len(o) if steps_ else 0} others, "
                  f"to the end) from step {lead}: lead time {lt}")
    print(f"  guilty heads: {sorted(guilty)}")
    if fail:
        cmd_lead(out_csv, fail)
    svg_panels(out_svg, [(f"{k}: guilty heads (max, mean) vs the others (mean, p99)",
                          [("guilty max", [(x[0], x[3]) for x in pts]),
                           ("guilty mean", [(x[0], x[1]) for x in pts]),
                           ("others mean", [(x[0], x[2]) for x in pts]),
                           ("others p99", [(x[0], x[4]) for x in pts])], False, fail)
                         for k, pts in lines.items()])


COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def svg_panels(path, panels, width=900, height=260):
    """panels: [(title, [(label, [(x, y)])], log_y, marker_x)] -> one SVG, panels stacked."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height * len(panels)}" '
           f'font-family="sans-serif" font-size="12" role="img">']
    for i, (title, series, log_y, mark) in enumerate(panels):
        y0 = i * height
        pts = [(x, y) for _, s in series for x, y in s if math.isfinite(y) and (y > 0 or not log_y)]
        if not pts:
            continue
        fy = (lambda v: math.log10(v)) if log_y else (lambda v: v)
        xs = [p[0] for p in pts]; ys = [fy(p[1]) for p in pts]
        x_lo, x_hi, y_lo, y_hi = min(xs), max(xs), min(ys), max(ys)
        if y_hi == y_lo: y_hi = y_lo + 1
        L, R, T, B = 70, width - 170, y0 + 28, y0 + height - 30
        px = lambda x: L + (x - x_lo) / max(1, x_hi - x_lo) * (R - L)
        py = lambda v: B - (fy(v) - y_lo) / (y_hi - y_lo) * (B - T)
        out.append(f'<text x="{L}" y="{y0 + 16}" font-weight="bold">{title}</text>')
        out.append(f'<rect x="{L}" y="{T}" width="{R - L}" height="{B - T}" fill="none" stroke="#999"/>')
        for k in range(5):
            v = y_lo + (y_hi - y_lo) * k / 4
            lab = f"{10 ** v:.3g}" if log_y else f"{v:.3g}"
            out.append(f'<text x="{L - 6}" y="{B - (B - T) * k / 4 + 4:.1f}" text-anchor="end">{lab}</text>')
        for k in range(5):
            x = x_lo + (x_hi - x_lo) * k / 4
            out.append(f'<text x="{px(x):.1f}" y="{B + 16}" text-anchor="middle">{x:.0f}</text>')
        if mark is not None and x_lo <= mark <= x_hi:
            out.append(f'<line x1="{px(mark):.1f}" y1="{T}" x2="{px(mark):.1f}" y2="{B}" stroke="#000" stroke-dasharray="4 3"/>')
        for j, (label, s) in enumerate(series):
            s = [(x, y) for x, y in s if math.isfinite(y) and (y > 0 or not log_y)]
            if not s:
                continue
            col = COLORS[j % len(COLORS)]
            d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s)
            out.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.2" points="{d}"/>')
            out.append(f'<text x="{R + 8}" y="{T + 14 + 16 * j}" fill="{col}">{label}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def read_csv(path, every=10):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = list(csv.DictReader(f))
    out = []
    for k in range(0, len(rows), every):  # the mean of each `every` steps, so the curve is readable
        chunk = rows[k:k + every]
        vals = lambda key: [float(r[key]) for r in chunk]
        loss, gn = vals("loss"), vals("grad_norm")
        fin = lambda v: [x for x in v if math.isfinite(x)]
        out.append((int(chunk[-1]["step"]), sum(fin(loss)) / max(1, len(fin(loss))) if fin(loss) else math.nan,
                    sum(fin(gn)) / max(1, len(fin(gn))) if fin(gn) else math.nan))
    return out


def load_rows(path):
    with open(path) as f:
        return [(int(r["step"]), float(r["loss"]), float(r["grad_norm"])) for r in csv.DictReader(f)]


def history_of(specs):
    """(the rows of a leading `--history CSV`, the specs after it); no rows without one."""
    if specs and specs[0] == "--history":
        return (load_rows(specs[1]) if os.path.exists(specs[1]) else []), specs[2:]
    return [], specs


def cmd_confirm(fail, specs):
    """Each NAME:CSV run from its first step: does the failure stay away (FAIL = the failure step)?
    With --history CSV first, the predicate's trailing median also sees that run's steps before
    each branch's first step (the recorded run a branch forked from), so a branch's first 500
    steps are judged too; the other columns are the branch's own."""
    hist, specs = history_of(specs)
    print(f"{'run':44s} {'predicate first true':>20s} {'max grad norm':>14s} {'steps > 2':>10s} "
          f"{'median grad norm, last 500':>27s} {'mean loss, last 500':>20s}")
    for name, path in (x.split(":", 1) for x in specs):
        if not os.path.exists(path):
            continue
        rows = load_rows(path)
        if not rows:
            continue
        before = [r for r in hist if r[0] < rows[0][0]]
        series = before + rows
        gn = [g for _, _, g in series]
        first = rmedian_first(gn, series[0][0], 10, 500)
        after = [g for s_, _, g in rows if s_ >= fail]
        tail = rows[-500:]
        print(f"{name:44s} {str(first):>20s} {max(after) if after else math.nan:14.3f} "
              f"{sum(1 for g in after if not g <= 2):10d} {statistics.median(g for _, _, g in tail):27.3f} "
              f"{sum(l for _, l, _ in tail) / len(tail):20.3f}")


def cmd_at(steps_, specs):
    want = [int(x) for x in steps_.split(",")]
    print(f"{'run':44s} " + " ".join(f"{'step ' + str(s) + ': loss / gn':>24s}" for s in want))
    for name, path in (x.split(":", 1) for x in specs):
        if not os.path.exists(path):
            continue
        by = {s_: (l, g) for s_, l, g in load_rows(path)}
        cells = [f"{by[s_][0]:.4f} / {by[s_][1]:.5g}" if s_ in by else "-" for s_ in want]
        print(f"{name:44s} " + " ".join(f"{c:>24s}" for c in cells))


def cmd_every(k, out, specs):
    runs = [(n, {s_: (l, g) for s_, l, g in load_rows(p)}) for n, p in (x.split(":", 1) for x in specs)
            if os.path.exists(p)]
    all_steps = sorted({s_ for _, d in runs for s_ in d if s_ % k == 0})
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step"] + [f"{n}_{c}" for n, _ in runs for c in ("loss", "grad_norm")])
        for s_ in all_steps:
            w.writerow([s_] + [v for _, d in runs for v in ((f"{d[s_][0]:.6g}", f"{d[s_][1]:.6g}") if s_ in d else ("", ""))])
    print(f"{out}: every {k}th step of {', '.join(n for n, _ in runs)} ({len(all_steps)} rows)")


def cmd_plot(path, specs):
    runs = [(name, read_csv(p)) for name, p in (s.split(":", 1) for s in specs)]
    runs = [(n, r) for n, r in runs if r]
    svg_panels(path, [("loss (mean of 10 steps)", [(n, [(s, l) for s, l, g in r]) for n, r in runs], False, None),
                      ("gradient norm before clipping (mean of 10 steps, log scale)",
                       [(n, [(s, g) for s, l, g in r]) for n, r in runs], True, None)])
    print(f"plot: {path} ({', '.join(n for n, _ in runs)})")


def cmd_hold_fork(path, src, dst):
    cmd = report(path).get("horizon", {}).get("fork_command", "")
    if not cmd:
        sys.exit(1)
    plan = re.search(r"--plan '([^']*)'", cmd).group(1)
    at = re.search(r"--at (\d+)", cmd).group(1)
    steps_ = re.search(r"--steps (\d+)", cmd).group(1)
    print(f"rewind train --fork {src} --at {at} --plan '{plan}' --record {dst} --steps {steps_} --checkpoint-every 100000")


def lasting_breaks(gn, short=50, long=1000, k=4.0):
    """Steps where the trailing median of `short` steps first exceeds k x that of `long` steps."""
    out, was = [], False
    for i in range(long, len(gn)):
        s = statistics.median(x if math.isfinite(x) else math.inf for x in gn[i - short:i])
        l = statistics.median(x if math.isfinite(x) else math.inf for x in gn[i - long:i])
        holds = s > k * l
        if holds and not was:
            out.append(i)
        was = holds
    return out


def cmd_lasting(specs):
    """Each NAME:CSV run: where the hold verdict's lasting-break predicate first turns true
    (rmedian(grad_norm, 50) > 4 * rmedian(grad_norm, 1000), the medians over the steps before each
    step), judged from the run's first step on. With --history CSV first, the steps of that run
    (the recording a branch forked from) before each branch's first step are the medians' history."""
    hist, specs = history_of(specs)
    print(f"{'run':28s} {'steps':>12s} {'lasting break first at':>23s} {'median grad norm, last 500':>27s} "
          f"{'mean loss, last 100':>20s}")
    for name, path in (x.split(":", 1) for x in specs):
        rows = load_rows(path) if os.path.exists(path) else []
        if not rows:
            print(f"{name:28s} no steps")
            continue
        series = [r for r in hist if r[0] < rows[0][0]] + rows
        first = rows[0][0]
        breaks = [series[0][0] + i for i in lasting_breaks([g for _, _, g in series])]
        breaks = [b for b in breaks if b >= first]
        tail = rows[-500:]
        print(f"{name:28s} {f'{first}-{rows[-1][0]}':>12s} {str(breaks[0]) if breaks else 'none':>23s} "
              f"{statistics.median(g for _, _, g in tail):27.3f} {sum(l for _, l, _ in rows[-100:]) / len(rows[-100:]):20.4f}")


def cmd_hold_compare(path, csv_path):
    r = report(path)
    h = r["horizon"]
    ref = next(b for b in h["branches"] if b["name"] == "reference")
    ref_gn = [math.inf if x is None else x for x in r["probes"][ref["probe"]]["grad_norm"]]
    fork = [g for s, _, g in load_rows(csv_path) if s >= h["from"]]
    for name, gn in (("reference (bisect probe)", ref_gn), ("fixing set (independent fork)", fork)):
        spikes = sum(1 for x in gn if x > 10 * statistics.median(gn))
        print(f"{name:32s} steps {len(gn):5d}  lasting breaks {len(lasting_breaks(gn))}  steps > 10x median {spikes}  "
              f"max {max(gn):.3f}  median last 500 {statistics.median(gn[-500:]):.3f}")
    ratio = statistics.median(fork[-500:]) / statistics.median(ref_gn[-500:])
    print(f"median grad norm, last 500 steps: fork / reference = {ratio:.2f} (target <= 1.5)")


def main(a):
    if len(a) < 2:
        sys.exit(__doc__)
    cmd = a[1]
    if cmd == "last-step":
        c = connect(a[2])
        last = c.execute("select max(step) from steps where run=?", (last_run(c),)).fetchone()[0]
        print(-1 if last is None else last)
    elif cmd == "series": cmd_series(a[2], a[3])
    elif cmd == "window": cmd_window(a[2])
    elif cmd == "fixing-plan": cmd_fixing_plan(a[2], a[3])
    elif cmd == "set-plan": cmd_set_plan(a[2], a[3], a[4])
    elif cmd == "monitors": cmd_monitors(a[2], a[3], a[4], a[5])
    elif cmd == "lead": cmd_lead(a[2], int(a[3]), float(a[4]) if len(a) > 4 else 3.0)
    elif cmd == "plot": cmd_plot(a[2], a[3:])
    elif cmd == "confirm": cmd_confirm(int(a[2]), a[3:])
    elif cmd == "at": cmd_at(a[2], a[3:])
    elif cmd == "every": cmd_every(int(a[2]), a[3], a[4:])
    elif cmd == "hold-fork": cmd_hold_fork(a[2], a[3], a[4])
    elif cmd == "hold-field": print(report(a[2])["horizon"][a[3]])
    elif cmd == "hold-compare": cmd_hold_compare(a[2], a[3])
    elif cmd == "lasting": cmd_lasting(a[2:])
    else: sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
