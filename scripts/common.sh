# Shared by scripts/demo.sh and scripts/test.sh: install what is missing, configure, build.
# Debian bookworm, run as root (or with sudo available). Idempotent.
set -euo pipefail

REWIND_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$REWIND_ROOT/build}"
DEB_PACKAGES=(build-essential cmake ninja-build pkg-config libtorch-dev libsqlite3-dev
              libzstd-dev libcxxopts-dev googletest libgtest-dev libopenblas0-pthread
              nlohmann-json3-dev python3-numpy)
DEB_PACKAGES+=(git)          # scripts/check_tree.sh and its ctest case read the git index
DEB_PACKAGES+=(libgloo-dev)  # c10d's Gloo process group: multi-rank training on CPUs
DEB_PACKAGES+=(python3-torch python3-dev pybind11-dev)  # the Python package and the nanoGPT tests
DEB_PACKAGES+=(clang-14 libclang-rt-14-dev)             # scripts/fuzz.sh: libFuzzer, ASan, UBSan
# tests/browser: the run page and bisect report in Debian's chromium, driven by Playwright
# from PyPI (tests/browser/install.sh), which launches this chromium and downloads none.
DEB_PACKAGES+=(chromium)

install_deps() {
  local missing=()
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "== installing: ${missing[*]}"
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

build_rewind() {
  echo "== configuring $BUILD_DIR"
  cmake -S "$REWIND_ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  echo "== building (this takes a few minutes on 2 cores)"
  cmake --build "$BUILD_DIR" -j "$(nproc)"
}
