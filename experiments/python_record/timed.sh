# Sourced by this folder's scripts: timed_run DIR LOG NAME CMD... runs CMD with its output in
# DIR/NAME.txt and appends "== NAME: exit RC, wall S s" to LOG (and prints it); a failing CMD
# does not end the calling script (set -e).
timed_run() {
  local dir=$1 log=$2 name=$3 t0 t1 rc
  shift 3
  t0=$(date +%s.%N)
  set +e
  "$@" > "$dir/$name.txt" 2>&1
  rc=$?
  set -e
  t1=$(date +%s.%N)
  echo "== $name: exit $rc, wall $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s" | tee -a "$log"
}
