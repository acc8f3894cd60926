#!/usr/bin/env bash
# The browser test (ctest browser_pages): records the demo's tiny run (synthetic data, 40 steps,
# a fault in L1.H2 from step 22), bisects it with --report (and twice where it is not
# reproducible), writes its run page with `rewind view`, and checks the four pages in Debian's
# chromium at 390 and 1280 px (check_pages.py). Exit 77, which ctest reports as skipped, when
# chromium is missing or the pip packages (install.sh) cannot be installed.
#   bash tests/browser/run.sh build/rewind [SHOTS_DIR]   # SHOTS_DIR: PNGs of the pages
set -euo pipefail
REWIND="$(realpath "${1:?usage: run.sh REWIND_BIN [SHOTS_DIR]}")"
SHOTS="${2:+$(realpath -m "$2")}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
skip() { echo "SKIPPED: $*"; exit 77; }
[[ -x "$CHROMIUM" ]] || skip "no chromium at $CHROMIUM (apt-get install chromium)"
command -v python3 >/dev/null || skip "no python3"
bash "$HERE/install.sh" || skip "the pip packages of tests/browser (install.sh) cannot be installed"

WORK="$(mktemp -d /tmp/rewind_browser_XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"  # the pages name the store as run.db, as in the demo
"$REWIND" data synth -o data.bin --tokens 300000 --vocab 64 >/dev/null
"$REWIND" train --data data.bin --steps 40 --vocab-size 64 --learning-rate 0.01 \
  --checkpoint-every 10 --record run.db --plan-from '22:L1.H2.delta=fault(strength=1e30)' \
  --log-every 1000 >/dev/null
code=0
"$REWIND" bisect --store run.db --find-window --fail 'nan || spike(loss, 1.4)' --jobs 2 \
  --quiet --report report >/dev/null || code=$?
[[ $code -eq 4 ]] || { echo "bisect exited $code, expected 4 (failure localized)"; exit 1; }
# Two not-reproducible reports: a window before the fault (its recorded-plan replay passes) and
# a predicate the recording never meets (the time search finds no failure step).
"$REWIND" bisect --store run.db --window 0:19 --fail 'nan || spike(loss, 1.4)' --quiet \
  --report report_window >/dev/null || { echo "bisect of 0:19 exited $?, expected 0 (not reproducible)"; exit 1; }
"$REWIND" bisect --store run.db --find-window --fail 'loss > 100 && !nan' --quiet \
  --report report_never >/dev/null || { echo "bisect with loss > 100 exited $?, expected 0 (not reproducible)"; exit 1; }
"$REWIND" view run.db -o run.html
grep -q "href='report/report.html'" run.html || { echo "run page does not link the bisect report"; exit 1; }
cd "$HERE"
python3 check_pages.py ${SHOTS:+--shots "$SHOTS"} "run:$WORK/run.html" "report:$WORK/report/report.html" \
  "report:$WORK/report_window/report.html" "report:$WORK/report_never/report.html"
