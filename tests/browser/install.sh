#!/usr/bin/env bash
# Installs the browser test's npm packages (package-lock.json: playwright-core, axe-core) into
# tests/browser/node_modules (git-ignored) unless the locked versions are there already.
# Called by scripts/test.sh and by run.sh; needs node and npm (Debian: nodejs npm).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
locked() {
  node -e 'const d = require("./package.json").dependencies;
           for (const [n, v] of Object.entries(d))
             if (require("./node_modules/" + n + "/package.json").version !== v) process.exit(1);' 2>/dev/null
}
locked && exit 0
echo "== installing the browser test's npm packages into tests/browser/node_modules"
npm ci --no-audit --no-fund --loglevel=error
locked
