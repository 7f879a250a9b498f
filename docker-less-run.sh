#!/usr/bin/env bash
# speclane without Docker: set up everything on a fresh machine, then run it.
#
#   ./docker-less-run.sh                 # router + both MLX lanes on the embedded default model
#   ./docker-less-run.sh --port 9000     # any `speclane serve` flag passes through
#   ./docker-less-run.sh test            # ruff (lint, format), mypy, then every test tier (CI):
#                                        # fast, realmodel, clients (docs/development.md)
#   ./docker-less-run.sh test -k relay   # pytest flags pass through (to each tier; with -m,
#                                        # one run of that selection)
#   ./docker-less-run.sh bench overhead  # a benchmark (`speclane bench` flags pass through)
#
# Steps, each skipped when already done: system packages, a virtual environment in .venv,
# speclane and its dependencies, the default model (`speclane models prepare`).
# System packages (Debian/Ubuntu, apt-get, only with root or passwordless sudo), named
# before they are installed:
#   always:        libopenblas0-pthread (MLX's CPU backend is ~30x faster with it)
#   test only:     chromium (the status page test), prometheus (the dashboard/rules test)
#   bench only:    nginx (the reference proxy of `speclane bench overhead`; Debian starts
#                  it on port 80, so it is never installed unless you ask for `bench`)
set -euo pipefail
cd "$(dirname "$0")"
VENV="${SPECLANE_VENV:-.venv}"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

pick_python() {
  for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "speclane needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2
  return 1
}

MODE=serve
case "${1:-}" in
  test) MODE=test; shift ;;
  bench) MODE=bench; shift ;;
esac

missing_system_packages() {
  ls /usr/lib/*-linux-gnu/openblas-pthread/libblas.so.3 >/dev/null 2>&1 || echo libopenblas0-pthread
  if [ "$MODE" = test ]; then
    [ -x /usr/bin/chromium ] || echo chromium
    command -v prometheus >/dev/null 2>&1 || echo prometheus
  fi
  if [ "$MODE" = bench ]; then
    command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || echo nginx
  fi
}

install_system_packages() {
  [ "$(uname -s)" = "Linux" ] || return 0
  local wanted=()
  mapfile -t wanted < <(missing_system_packages)
  [ ${#wanted[@]} -gt 0 ] || return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    say "not a Debian/Ubuntu system: install these yourself if you want them: ${wanted[*]}"
    return 0
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"; else
      say "cannot install ${wanted[*]} without root: MLX will use its slow bundled BLAS," \
          "and tests that need chromium or prometheus skip"
      return 0
    fi
  fi
  say "installing system packages with apt-get (${MODE}): ${wanted[*]}"
  $sudo apt-get update -qq >/dev/null || true
  local pkg
  for pkg in "${wanted[@]}"; do  # one at a time: a missing optional one must not block the rest
    if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$pkg" >/dev/null; then
      case "$pkg" in
        nginx) say "apt-get could not install nginx: 'speclane bench overhead' will skip it" ;;
        chromium|prometheus) say "apt-get could not install $pkg: the tests that need it skip" ;;
        *) say "apt-get could not install $pkg: MLX on the CPU will be slow" ;;
      esac
    fi
  done
}

setup_venv() {
  local py stamp want
  py="$(pick_python)"
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtual environment $VENV"
    "$py" -m venv "$VENV"
  fi
  stamp="$VENV/.speclane-installed"
  want="$(cat pyproject.toml | cksum)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing speclane and its dependencies into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q -e ".[test,plot]"
    echo "$want" > "$stamp"
  fi
}

# The test tiers (markers in pyproject.toml), one pytest run each so that a tier's time and
# closing line are its own: "name|marker expression". The fast tier runs on every core
# (pytest-xdist's -n auto in addopts); the others in one process (tests/tiers.py decides).
TIERS=(
  "fast|not realmodel and not clients"
  "realmodel|realmodel and not clients"
  "clients|clients"
)

closing_line() {  # pytest's last line ("12 passed, 3 deselected in 4.56s"), = signs dropped
  grep -E '(passed|failed|error|skipped|deselected|no tests ran).* in [0-9.]+s' "$1" |
    tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//'
}

run_tiers() {
  local arg explicit=0
  for arg in "$@"; do
    case "$arg" in -m|-m*) explicit=1 ;; esac
  done
  if [ "$explicit" = 1 ]; then  # the caller chose the selection: one run, as asked
    export SPECLANE_FUZZ="${SPECLANE_FUZZ:-full}"
    say "running the tests ($*)"
    exec "$VENV/bin/python" -m pytest "$@"
  fi
  # CI's run: every fuzzer and property test with all its cases (tests/fuzzing.py).
  export SPECLANE_FUZZ="${SPECLANE_FUZZ:-full}"
  local tier name expr log status failed=0 ran=0 summary=()
  log="$(mktemp)"
  for tier in "${TIERS[@]}"; do
    name="${tier%%|*}"; expr="${tier#*|}"
    say "running the $name tier (-m \"$expr\")"
    set +e  # every tier runs; the first failure's status is the run's
    "$VENV/bin/python" -m pytest -m "$expr" "$@" 2>&1 | tee "$log"
    status="${PIPESTATUS[0]}"
    set -e
    # 5: no test selected (a -k that matches nothing in this tier) is not a failure.
    [ "$status" = 5 ] || ran=1
    if [ "$status" != 0 ] && [ "$status" != 5 ] && [ "$failed" = 0 ]; then failed="$status"; fi
    summary+=("$(printf '%-10s %s' "$name" "$(closing_line "$log")")")
  done
  rm -f "$log"
  say "tiers"
  printf '  %s\n' "${summary[@]}" >&2
  [ "$ran" = 1 ] || exit 5  # no tier selected anything
  exit "$failed"
}

install_system_packages
setup_venv
say "preparing the default model (cached after the first run)"
"$VENV/bin/speclane" models prepare

case "$MODE" in
  test)
    # Lint and type-check first: either failing fails the run (set -e) before pytest starts.
    say "ruff check, ruff format --check"
    "$VENV/bin/ruff" check router tests examples
    "$VENV/bin/ruff" format --check router tests examples
    say "mypy (configured in pyproject.toml: router/)"
    "$VENV/bin/mypy"
    run_tiers "$@" ;;
  bench)
    exec "$VENV/bin/speclane" bench "$@" ;;
esac
exec "$VENV/bin/speclane" serve "$@"
