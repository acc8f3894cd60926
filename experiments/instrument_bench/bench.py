"""What rewind.instrument and rewind.record(..., instrument=True) cost a training step, against the
same model in plain PyTorch, measured in one process: a nanoGPT-style GPT-2 small (written here,
F.scaled_dot_product_attention in its attention) and Hugging Face's GPT2LMHeadModel from a
GPT2Config (nothing downloaded), BF16 autocast, AdamW, gradient clipping, a fixed seed and
synthetic tokens. Modes: eager; compiled (torch.compile(model)); compiled_blocks (each block
compiled on its own, block.compile(), as torchtitan does).

Each (model, mode) starts every variant from one set of initial weights and one list of batches:
  plain         the model as written, PyTorch's defaults (nondeterministic algorithms allowed)
  plain_det     the same under torch.use_deterministic_algorithms(True), what rewind asks of a loop
  instrumented  rewind.instrument(model), deterministic algorithms (no recorder)
  recorded      rewind.record(store, model, opt, instrument=True): every step's loss, grad norm,
                batch, generators and parameter digest written to a store, per-head monitors on
                (the defaults); one checkpoint, at step 0 (a warm-up step), unless --checkpoint-every
A step is batch, forward, backward, clip_grad_norm_, optimizer step, zero_grad (and rec.batch /
rec.step); each is timed alone between two torch.cuda.synchronize() calls, the warm-up steps
(compiling, cuDNN/cuBLAS plans, the step-0 checkpoint) left out; the table gives medians. By
default one variant runs all its steps, then the next; --interleave builds and warms up every
variant first and then times their steps in turns (step i of each variant, in an order rotated
every step), so that a slow stretch of the machine falls on every variant alike.
Checks in the same run: a second instrumented run repeats the first one's losses bit for bit
(determinism), the recorded run has the instrumented run's losses (recording changes no bits),
and, compiled, dynamo's graph breaks and graphs of the plain and the instrumented runs (its
counters) and whether a frame hit dynamo's recompile limit (it then runs uncompiled).

    python3 bench.py --device cuda --out results.csv                  # GPT-2 small, both models, every mode
    python3 bench.py --tiny --device cpu --steps 3 --out /tmp/t.csv   # a smoke run on a CPU
    python3 bench.py --table a.csv b.csv                              # one table from several runs' CSVs
Needs the rewind package on PYTHONPATH (<build>/python) and, for the Hugging Face model, transformers.
"""
import argparse
import copy
import csv
import gc
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS: set before CUDA starts

import torch  # noqa: E402

from torch._dynamo.utils import counters  # noqa: E402

import rewind  # noqa: E402
from bench_models import SIZES, VOCAB, build  # noqa: E402  (beside this file)
from bench_profile import profile_steps, summary  # noqa: E402

VARIANTS = ("plain", "instrumented", "recorded", "plain_det")  # run in this order (most wanted first)
COLUMNS = ["model", "mode", "device", "torch", "batch", "seq", "steps", "warmup", "timing",
           *[f"{v}_{k}" for v in VARIANTS for k in ("ms", "p10_ms", "p90_ms", "first_step_s")],
           "instr_over_plain", "rec_over_plain", "instr_over_plain_det", "rec_over_instr",
           "det_steps", "deterministic", "recorded_same_losses",
           "breaks_plain", "breaks_instr", "graphs_plain", "graphs_instr", "recompile_limit_hits", "break_reasons",
           "errors"]
MODES = ("eager", "compiled", "compiled_blocks")


# --- one variant -------------------------------------------------------------------------------
class RecompileLog(logging.Handler):
    """Counts dynamo's "hit config.recompile_limit" warnings: past it a frame runs uncompiled."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.hits = 0

    def emit(self, record):
        if "hit config." in record.getMessage():
            self.hits += 1


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def set_deterministic(on, fill_uninitialized):
    torch.use_deterministic_algorithms(on)
    if hasattr(torch.utils, "deterministic"):  # torch >= 2.1: deterministic mode NaN-fills every new tensor
        torch.utils.deterministic.fill_uninitialized_memory = on and fill_uninitialized


def compiled_form(model, mode, backend):
    """What the loop calls: the model, torch.compile(model), or the model with each block compiled."""
    if mode == "compiled":
        return torch.compile(model, backend=backend)
    if mode == "compiled_blocks":
        for block in model.transformer.h:  # nanoGPT's and Hugging Face GPT-2's block list
            block.compile(backend=backend)
    return model


class Variant:
    """One variant's model, optimizer and (recorded) recorder from `base`'s weights, stepped one
    step at a time: run_variant steps it alone, --interleave steps every variant in turn."""

    def __init__(self, a, base, loss_fn, variant, batches, store_dir, mode):
        self.device = torch.device(a.device)
        self.variant, self.batches, self.loss_fn = variant, batches, loss_fn
        self.fill = a.fill_uninitialized
        set_deterministic(variant != "plain", self.fill)
        self.model = copy.deepcopy(base)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
        self.rec = None
        if variant == "instrumented":
            rewind.instrument(self.model)
        elif variant == "recorded":
            path = os.path.join(store_dir, f"{a.model_tag}_{mode}_{time.time_ns()}.db")
            self.rec = rewind.record(path, self.model, self.opt, checkpoint_every=a.checkpoint_every or 10 ** 9,
                                     instrument=True, config={"bench": "instrument_bench", "model": a.model_tag})
        self.run = compiled_form(self.model, mode, a.backend)
        self.params = list(self.model.parameters())

    def step(self, i):
        """Step i (batch i), timed between two synchronizations: (seconds, the loss tensor)."""
        set_deterministic(self.variant != "plain", self.fill)  # another variant may have run last
        rec = self.rec
        sync(self.device)
        t0 = time.perf_counter()
        x, y = rec.batch(lambda: self.batches[i]) if rec else self.batches[i]
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = self.loss_fn(self.run, x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if rec:
            rec.step(loss=loss, grad_norm=norm)
        sync(self.device)
        return time.perf_counter() - t0, loss.detach()

    def close(self):
        if self.rec:
            self.rec.close()
            self.rec = None


def dynamo_info(log, breaks_before, graphs_before):
    """What dynamo did since the counters read (breaks_before, graphs_before): breaks, graphs,
    their reasons and the recompile-limit hits `log` saw."""
    reasons = []
    for text, n in counters["graph_break"].items():
        if n <= breaks_before.get(text, 0):
            continue
        text = re.sub(r" at 0x[0-9a-f]+", "", " ".join(str(text).split()))
        head, _, explanation = text.partition(" Explanation: ")
        where = re.search(r"<function (\S+)", explanation)  # the function it stopped at
        text = (f"{head}: {where.group(1).rstrip('>`')}" if where else head)[:160]
        if text not in reasons:
            reasons.append(text)
    breaks = sum(counters["graph_break"].values()) - sum(breaks_before.values())
    return {"recompile_limit_hits": log.hits, "breaks": breaks,
            "graphs": counters["stats"]["unique_graphs"] - graphs_before, "reasons": reasons}


def note_dynamo(row, mode, variant, info):
    """The compiled plain and instrumented runs' graphs and breaks (dynamo_info) into the row."""
    if mode == "eager" or variant not in ("plain", "instrumented"):
        return
    tag = "plain" if variant == "plain" else "instr"
    row[f"breaks_{tag}"], row[f"graphs_{tag}"] = info["breaks"], info["graphs"]
    if variant == "instrumented":
        row["recompile_limit_hits"] = info["recompile_limit_hits"]
        row["break_reasons"] = " | ".join(info["reasons"][:3])


def run_variant(a, base, loss_fn, variant, batches, steps, store_dir, mode):
    """Runs `steps` steps of one variant from `base`'s weights; (per-step seconds, loss tensors,
    info: dynamo's graph breaks, graphs and recompile-limit hits while it ran)."""
    torch._dynamo.reset()  # each variant compiles afresh (inductor's on-disk caches stay)
    counters.clear()
    log = RecompileLog()
    logging.getLogger("torch._dynamo").addHandler(log)
    v = None
    times, losses = [], []
    try:
        v = Variant(a, base, loss_fn, variant, batches, store_dir, mode)
        for i in range(steps):
            t, loss = v.step(i)
            times.append(t)
            losses.append(loss)
    finally:
        logging.getLogger("torch._dynamo").removeHandler(log)
        if v:
            v.close()
    return times, losses, dynamo_info(log, {}, 0)


def loss_bits(losses):
    return torch.stack([t.float() for t in losses]).cpu().view(torch.int32).tolist()


def one_line(e):
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def first_difference(u, w):
    """The first step whose loss bits differ, as the table says it."""
    i = next((i for i, (p, q) in enumerate(zip(u, w)) if p != q), None)
    return "yes" if i is None and len(u) == len(w) else f"no (step {i if i is not None else min(len(u), len(w))})"


def summarize(row, times, losses, errors):
    """Medians, percentiles and ratios of what has run so far, into the row."""
    for v, t in times.items():
        q = sorted(t)
        row[f"{v}_ms"] = f"{1e3 * statistics.median(q):.3f}"
        row[f"{v}_p10_ms"] = f"{1e3 * q[int(0.1 * (len(q) - 1))]:.3f}"
        row[f"{v}_p90_ms"] = f"{1e3 * q[int(0.9 * (len(q) - 1))]:.3f}"
    for name, num, den in (("instr_over_plain", "instrumented", "plain"), ("rec_over_plain", "recorded", "plain"),
                           ("instr_over_plain_det", "instrumented", "plain_det"),
                           ("rec_over_instr", "recorded", "instrumented")):
        if row.get(f"{num}_ms") and row.get(f"{den}_ms"):
            row[name] = f"{float(row[f'{num}_ms']) / float(row[f'{den}_ms']):.3f}"
    if "instrumented" in losses and "recorded" in losses:  # recording changes no bits
        row["recorded_same_losses"] = first_difference(loss_bits(losses["instrumented"]), loss_bits(losses["recorded"]))
    row["errors"] = "; ".join(errors)


def check_determinism(a, base, loss_fn, batches, det_steps, store_dir, mode, row, losses, errors):
    """A second instrumented run from the same weights and batches: the first run's loss bits,
    step by step."""
    try:
        _, again, _ = run_variant(a, base, loss_fn, "instrumented", batches, det_steps, store_dir, mode)
        row["deterministic"] = first_difference(loss_bits(losses["instrumented"][:det_steps]), loss_bits(again))
    except Exception as e:
        row["deterministic"] = "error"
        errors.append(f"determinism: {one_line(e)}")
    finally:
        free(torch.device(a.device))
    row["errors"] = "; ".join(errors)


class MonitorSwitch:
    """rewind's per-head monitors are one process-wide switch (rewind._C.set_monitoring) that the
    recorder sets for its own next step. Interleaved, the instrumented variant would run with the
    recorded one's monitors: this keeps the value the recorder last set, gives it back before the
    recorded variant's step and switches the monitors off before every other variant's step, as
    each runs alone."""

    def __init__(self):
        self.c = getattr(rewind, "_C", None)
        self.real = getattr(self.c, "set_monitoring", None)
        self.recorder_on = False
        if self.real:
            self.c.set_monitoring = self.remember

    def remember(self, on):
        self.recorder_on = bool(on)
        self.real(on)

    def before(self, variant):
        if self.real:
            self.real(self.recorder_on if variant == "recorded" else False)

    def close(self):
        if self.real:
            self.c.set_monitoring = self.real


def interleaved(a, base, loss_fn, batches, store_dir, mode, row, times, losses, errors, save=lambda row: None):
    """Every variant at once: each one's model built and warmed up (compiled) in turn, then the
    timed steps in turns, step i of every variant before step i + 1 of any, the variants' order
    rotated each step, so that a slow stretch of the machine falls on all of them alike."""
    device = torch.device(a.device)
    torch._dynamo.reset()
    counters.clear()
    live = {}
    monitors = MonitorSwitch()
    try:
        for v in (v for v in VARIANTS if v in a.variants):
            log = RecompileLog()
            logging.getLogger("torch._dynamo").addHandler(log)
            breaks_before = dict(counters["graph_break"])
            graphs_before = counters["stats"]["unique_graphs"]
            try:
                live[v] = Variant(a, base, loss_fn, v, batches, store_dir, mode)
                losses[v] = []
                for i in range(a.warmup):
                    monitors.before(v)
                    t, loss = live[v].step(i)
                    losses[v].append(loss)
                    if i == 0:
                        row[f"{v}_first_step_s"] = f"{t:.2f}"
            except Exception as e:
                errors.append(f"{v}: {one_line(e)}")
                print(f"  {a.model_tag} {mode} {v}: {one_line(e)}", file=sys.stderr, flush=True)
                live.pop(v, None)
                losses.pop(v, None)
                continue
            finally:
                logging.getLogger("torch._dynamo").removeHandler(log)
            note_dynamo(row, mode, v, dynamo_info(log, breaks_before, graphs_before))
        order = list(live)
        for i in range(a.warmup, a.warmup + a.steps):
            k = i % len(order)
            for v in order[k:] + order[:k]:
                monitors.before(v)
                t, loss = live[v].step(i)
                times.setdefault(v, []).append(t)
                losses[v].append(loss)
            if (i - a.warmup) % 5 == 4:  # a run killed at its time limit keeps what it timed
                summarize(row, times, losses, errors)
                save(row)
        if a.profile:
            summarize(row, times, losses, errors)
            save(row)
            profiles = {v: profile_steps(live[v], a.warmup + a.steps, a.profile, lambda v=v: monitors.before(v))
                        for v in order}
            text = summary(row["model"], mode, profiles)
            print(text, file=sys.stderr, flush=True)
            if a.out:
                with open(os.path.splitext(a.out)[0] + "_profile.txt", "a") as f:
                    f.write(text + "\n\n")
    except Exception as e:
        errors.append(f"interleaved steps: {one_line(e)}")
    finally:
        for v in live.values():
            v.close()
        live.clear()
        monitors.close()
        free(device)
    for v, t in times.items():
        print(f"  {a.model_tag} {mode} {v}: median {1e3 * statistics.median(t):.2f} ms (interleaved)",
              file=sys.stderr, flush=True)
    summarize(row, times, losses, errors)


def measure(a, kind, mode, store_dir, save=lambda row: None):
    """One row of the table: every variant of `kind` in `mode`, the determinism and graph-break
    checks; a variant that fails is an error in the row, the others still run. save(row) after
    each variant (a run killed by a time limit keeps what it measured)."""
    *_, block, batch = SIZES[a.size]
    device = torch.device(a.device)
    a.model_tag = kind
    row = {"model": "gpt2-124M nanoGPT" if kind == "nanogpt" and a.size == "full" else
           "gpt2-124M HF" if a.size == "full" else f"tiny {kind}",
           "mode": mode, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "batch": batch, "seq": block, "steps": a.steps, "warmup": a.warmup,
           "timing": "interleaved" if a.interleave else "sequential"}
    errors = []
    try:
        base, loss_fn = build(kind, a.size)
    except Exception as e:  # e.g. no transformers
        row["errors"] = f"build: {one_line(e)}"
        save(row)
        return row
    base = base.to(device).train()
    vocab = VOCAB[a.size][kind]
    total = a.warmup + a.steps
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(total):  # synthetic tokens, the same for every variant
        t = torch.randint(vocab, (batch, block + 1), generator=g)
        batches.append((t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)))
    det_steps = min(a.det_steps, total)
    row["det_steps"] = det_steps
    times, losses = {}, {}
    if a.interleave:
        interleaved(a, base, loss_fn, batches, store_dir, mode, row, times, losses, errors, save)
        if "instrumented" in losses:
            check_determinism(a, base, loss_fn, batches, det_steps, store_dir, mode, row, losses, errors)
        save(row)
        return row
    for r in range(a.rounds):
        for v in VARIANTS:
            if v not in a.variants:
                continue
            try:
                t, l, info = run_variant(a, base, loss_fn, v, batches, total, store_dir, mode)
            except Exception as e:
                errors.append(f"{v}: {one_line(e)}")
                print(f"  {kind} {mode} {v}: {one_line(e)}", file=sys.stderr, flush=True)
                row["errors"] = "; ".join(errors)
                save(row)
                continue
            finally:
                free(device)
            if r == 0:
                row[f"{v}_first_step_s"] = f"{t[0]:.2f}"
                losses[v] = l
                note_dynamo(row, mode, v, info)
            times.setdefault(v, []).extend(t[a.warmup:])
            print(f"  {kind} {mode} {v} round {r}: median {1e3 * statistics.median(t[a.warmup:]):.2f} ms "
                  f"(first step {t[0]:.2f} s)", file=sys.stderr, flush=True)
            summarize(row, times, losses, errors)
            if r == 0 and v == "instrumented":
                check_determinism(a, base, loss_fn, batches, det_steps, store_dir, mode, row, losses, errors)
            save(row)
    row["errors"] = "; ".join(errors)
    save(row)
    return row


# --- output ------------------------------------------------------------------------------------
def table(rows):
    """The text table: medians in ms, ratios, the checks."""
    head = ["model", "mode", "plain ms", "plain+det ms", "instr ms", "rec ms", "instr/plain", "rec/plain",
            "instr/plain+det", "deterministic", "rec==instr", "breaks plain/instr"]
    lines = [head]
    for r in rows:
        breaks = f"{r.get('breaks_plain', '')}/{r.get('breaks_instr', '')}" if r.get("breaks_instr", "") != "" else "-"
        lines.append([r["model"], r["mode"], r.get("plain_ms", ""), r.get("plain_det_ms", ""),
                      r.get("instrumented_ms", ""), r.get("recorded_ms", ""), r.get("instr_over_plain", ""),
                      r.get("rec_over_plain", ""), r.get("instr_over_plain_det", ""), r.get("deterministic", ""),
                      r.get("recorded_same_losses", ""), breaks])
    lines = [[str(c) if c not in (None, "") else "-" for c in line] for line in lines]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    first = rows[0] if rows else {}
    turns = ("the variants' steps in turns (--interleave)" if first.get("timing") == "interleaved"
             else "one variant's steps after another's")
    out.append(f"(ms: median of the timed steps, each timed alone between torch.cuda.synchronize() calls on a GPU, {turns}; "
               f"batch {first.get('batch')} x "
               f"{first.get('seq')}, {first.get('steps')} timed steps after {first.get('warmup')} warm-up; "
               f"{first.get('device')}, torch {first.get('torch')})")
    for r in rows:
        notes = []
        if r.get("recompile_limit_hits") not in (None, "", 0, "0"):
            notes.append(f"dynamo hit its recompile limit {r['recompile_limit_hits']} time(s) in the instrumented run")
        if r.get("breaks_instr", "") != "":
            notes.append(f"graphs plain/instrumented {r.get('graphs_plain', '-')}/{r.get('graphs_instr', '-')}; "
                         f"instrumented breaks at: {r.get('break_reasons') or '-'}")
        if r.get("errors"):
            notes.append(f"errors: {r['errors']}")
        for n in notes:
            out.append(f"{r['model']} {r['mode']}: {n}")
    return "\n".join(out)


def write(rows, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    text = table(rows)
    with open(os.path.splitext(path)[0] + ".txt", "w") as f:
        f.write(text + "\n")
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="2 layers, width 64, 32 tokens, batch 2 (a CPU smoke run)")
    ap.add_argument("--models", default="nanogpt,hf", help="comma-separated: nanogpt, hf")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES))
    ap.add_argument("--rows", default=None, metavar="MODEL:MODE,...",
                    help="these (model, mode) rows instead of every --models x --modes, e.g. nanogpt:eager,hf:eager")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=20, help="timed steps a variant (and round)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 5; tiny: 1)")
    ap.add_argument("--rounds", type=int, default=1, help="run the variants' sequence this many times")
    ap.add_argument("--interleave", action="store_true",
                    help="build every variant first, then time their steps in turns (step i of each, the "
                         "order rotated every step) instead of one variant's steps after another's")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="with --interleave: N more steps of each variant under torch.profiler after the timed "
                         "ones, their kernels' time per step into <out>_profile.txt (bench_profile.py)")
    ap.add_argument("--det-steps", type=int, default=10, help="steps of the second instrumented run")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="the recorded run's checkpoints (0: step 0 only)")
    ap.add_argument("--backend", default="inductor", help="torch.compile's backend")
    ap.add_argument("--batch", type=int, default=None, help="override the size's batch")
    ap.add_argument("--fill-uninitialized", action="store_true",
                    help="keep deterministic mode's NaN fill of new tensors (torch >= 2.1; off by default, as in "
                         "rewind's other benchmarks)")
    ap.add_argument("--store-dir", default=None, help="where the recorded runs' stores go (default: a temporary "
                                                      "folder, removed at the end)")
    ap.add_argument("--out", default=None, help="CSV path (the table goes beside it as .txt)")
    ap.add_argument("--table", nargs="+", metavar="CSV", help="print one table from these CSVs and exit")
    a = ap.parse_args(argv)
    if a.table:
        rows = []
        for p in a.table:
            with open(p, newline="") as f:
                rows += list(csv.DictReader(f))
        text = write(rows, a.out) if a.out else table(rows)
        print(text)
        return 0
    a.size = "tiny" if a.tiny else "full"
    if a.batch:
        SIZES[a.size] = SIZES[a.size][:4] + (a.batch,)
    if a.warmup is None:
        a.warmup = 1 if a.tiny else 5
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if a.rows:
        pairs = [r.strip().partition(":") for r in a.rows.split(",") if r.strip()]
        a.pairs = [(m, mode) for m, _, mode in pairs]
    else:
        a.pairs = [(m.strip(), mode.strip()) for m in a.models.split(",") if m.strip()
                   for mode in a.modes.split(",") if mode.strip()]
    bad = ([v for v in a.variants if v not in VARIANTS] + [mode for _, mode in a.pairs if mode not in MODES]
           + [m for m, _ in a.pairs if m not in ("nanogpt", "hf")])
    if bad or a.steps < 1 or a.warmup < 0:
        ap.error(f"unknown variant(s), mode(s) or model(s) {bad}" if bad else "--steps must be >= 1 and --warmup >= 0")
    torch.backends.cuda.matmul.allow_tf32 = False
    if a.tiny and a.device == "cpu":  # one thread: a tiny model's steps are not slowed by OpenMP
        torch.set_num_threads(1)      # barriers waiting on a core another process holds
    store_dir = a.store_dir or tempfile.mkdtemp(prefix="instrument_bench_")
    os.makedirs(store_dir, exist_ok=True)
    rows = []
    try:
        for kind, mode in a.pairs:
            t0 = time.perf_counter()
            print(f"== {kind} {mode}", file=sys.stderr, flush=True)
            rows.append({})

            def save(row):  # the CSV rewritten after every variant: a killed run keeps what it measured
                rows[-1] = row
                if a.out:
                    write(rows, a.out)
            measure(a, kind, mode, store_dir, save)
            print(f"== {kind} {mode}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        if not a.store_dir:
            shutil.rmtree(store_dir, ignore_errors=True)
    print(write(rows, a.out) if a.out else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
