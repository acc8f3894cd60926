#!/usr/bin/env bash
# Test of scripts/check_tree.sh: in throw-away git repositories it must pass a clean source tree
# and fail, naming the file, on each kind of compiled file (by magic bytes) and on a file > 1 MB.
set -euo pipefail
CHECK="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/check_tree.sh"
WORK=$(mktemp -d /tmp/rewind_check_tree_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
failures=0

# new_repo NAME: a git repository holding a small source tree, echoed as its path.
new_repo() {
  local dir="$WORK/$1"
  mkdir -p "$dir/src"
  printf '// a source file\nint main() { return 0; }\n' > "$dir/src/main.cpp"
  printf 'plain text with a space in its name\n' > "$dir/src/notes file.txt"
  head -c 1000000 /dev/zero | tr '\0' 'a' > "$dir/src/exactly_1mb.txt"
  ln -s main.cpp "$dir/src/link.cpp"
  git -C "$dir" init -q
  echo "$dir"
}

# expect_pass NAME DIR / expect_fail NAME DIR PATH: run the check and compare with the verdict.
expect_pass() {
  if out=$(bash "$CHECK" "$2" 2>&1); then echo "ok   $1"; else
    echo "FAIL $1: the check rejected a clean tree:"; echo "$out"; failures=$((failures + 1)); fi
}
expect_fail() {
  if out=$(bash "$CHECK" "$2" 2>&1); then
    echo "FAIL $1: the check passed"; failures=$((failures + 1))
  elif ! grep -qF "'$3'" <<< "$out"; then
    echo "FAIL $1: the message does not name '$3':"; echo "$out"; failures=$((failures + 1))
  else echo "ok   $1"; fi
}

# with_file NAME PATH HEX_BYTES: a fresh repository that also tracks PATH holding those bytes.
with_file() {
  local dir
  dir=$(new_repo "$1")
  mkdir -p "$(dirname "$dir/$2")"
  printf "$3" > "$dir/$2"
  printf 'padding after the magic bytes\n' >> "$dir/$2"
  git -C "$dir" add -A
  expect_fail "$1" "$dir" "$2"
}

clean=$(new_repo clean)
git -C "$clean" add -A
expect_pass "clean tree (a 1,000,000-byte text file is allowed)" "$clean"

with_file "ELF under a harmless name" "docs/readme.txt" '\x7fELF\x02\x01\x01'
with_file "ELF named -" "-" '\x7fELF\x02\x01\x01'
with_file "static library" "lib/libfoo.txt" '!<arch>\n'
with_file "CUDA fatbin" "kernels.bin" '\x50\xed\x55\xba\x01\x00\x10\x00'
with_file "Mach-O object" "a.o" '\xcf\xfa\xed\xfe'
with_file "SQLite store" "run.data" 'SQLite format 3\x00'

big=$(new_repo big)
head -c 1000001 /dev/zero | tr '\0' 'a' > "$big/big.txt"
git -C "$big" add -A
expect_fail "text file of 1,000,001 bytes" "$big" "big.txt"

untracked=$(new_repo untracked)
git -C "$untracked" add -A
printf '\x7fELF' > "$untracked/build_output"
expect_pass "an untracked binary is not the check's business" "$untracked"

((failures == 0)) || { echo "$failures case(s) failed"; exit 1; }
echo "all cases passed"
