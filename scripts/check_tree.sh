#!/usr/bin/env bash
# Fails when the git tree tracks something that is not source: a compiled file (recognised by its
# magic bytes, not its name) or any file over 1 MB; small SQLite stores under fuzz/ are the store
# fuzzer's seeds and allowed. scripts/test.sh runs it before the build.
# Usage: bash scripts/check_tree.sh [REPO_DIR]   (default: this repository)
set -euo pipefail
REPO=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
MAX_BYTES=1000000
cd "$REPO"
if ! git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  echo "check_tree: $REPO is not a git checkout (or git is missing); nothing to check"
  exit 0
fi

# The kind of compiled file whose first bytes (as hex) are $1, or nothing for any other file.
compiled_kind() {
  case $1 in
    7f454c46*) echo "ELF file (executable, shared library, object file or CUDA cubin)" ;;
    213c617263683e0a*) echo "ar archive (static library)" ;;
    50ed55ba*) echo "CUDA fatbin" ;;
    feedface* | feedfacf* | cefaedfe* | cffaedfe*) echo "Mach-O binary" ;;
    4243c0de*) echo "LLVM bitcode" ;;
    53514c69746520666f726d6174203300*) echo "SQLite database (a store or a probe cache)" ;;
  esac
}

bad=0
while IFS= read -r -d '' path; do
  file=./$path   # so that a file named '-' is not read as stdin
  [[ -f $file && ! -L $file ]] || continue   # symlinks, submodules, files deleted locally
  size=$(stat -c %s "$file")
  if ((size > MAX_BYTES)); then
    echo "check_tree: error: '$path' is $size bytes, over the 1 MB limit for tracked files"
    bad=1
  fi
  kind=$(compiled_kind "$(head -c 16 "$file" | od -An -v -tx1 | tr -d ' \n')")
  # Small stores are inputs of the store fuzzer (seeds and crash regressions), not build outputs.
  [[ $kind == SQLite* && $path == fuzz/* ]] && kind=""
  if [[ -n $kind ]]; then
    echo "check_tree: error: '$path' is a compiled file: $kind"
    bad=1
  fi
done < <(git ls-files -z)

if ((bad)); then
  echo "check_tree: remove these files from git (git rm --cached PATH) and add build outputs to .gitignore"
  exit 1
fi
echo "check_tree: no compiled files and nothing over 1 MB among $(git ls-files | wc -l) tracked files"
