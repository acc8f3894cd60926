#!/usr/bin/env bash
# Installs the browser test's PyPI packages, pinned here, for the python3 on PATH (the one
# run.sh runs check_pages.py with) unless those versions are importable already. Called by
# scripts/test.sh and by run.sh. Playwright drives Debian's chromium (run.sh), so no browser is
# ever downloaded: `playwright install` is not run. axe-playwright-python is there for the
# axe.min.js it ships.
set -euo pipefail
PINS=(playwright==1.65.2 axe-playwright-python==0.1.8)
pinned() {
  python3 - "${PINS[@]}" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
import playwright.sync_api, axe_playwright_python
sys.exit(any(version(name) != want for name, want in (pin.split("==") for pin in sys.argv[1:])))
PY
}
pinned && exit 0
echo "== installing the browser test's pip packages: ${PINS[*]}"
PIP_ROOT_USER_ACTION=ignore python3 -m pip install --no-input --disable-pip-version-check -q "${PINS[@]}"
pinned
