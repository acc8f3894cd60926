# Sourced by this folder's scripts that take BUILD OUT: checks the two arguments and sets HERE
# (this folder), BUILD and OUT (absolute; OUT made) and PY (PYTHON, default python3).
[[ $# -eq 2 ]] || { echo "usage: $0 BUILD OUT" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=$(cd "$1" && pwd)
mkdir -p "$2"
OUT=$(cd "$2" && pwd)
PY=${PYTHON:-python3}
