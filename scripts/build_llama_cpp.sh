#!/usr/bin/env bash
# Build llama.cpp (the peer that `specdecode bench --llama-cpp DIR` measures against)
# from the source vendored in PyPI's llama-cpp-python sdist.
#
# Why the sdist: it pins one llama.cpp revision that anyone can fetch with pip, so the
# docs' numbers name a reproducible build. Idempotent: re-running skips the download,
# the extraction and the configure step when they are done, and lets cmake rebuild only
# what changed.
#
# Usage: scripts/build_llama_cpp.sh [DEST]          (DEST defaults to /work/llamacpp)
# Env:   LLAMA_CPP_PYTHON_VERSION  pin the sdist (default: newest; the docs used 0.3.36)
#        JOBS                      parallel compile jobs (default 2)
#        PIP                       pip to download with (default: .venv/bin/pip, else pip)
#        LLAMA_CPP_CLI=1           also build llama-cli (needs the server code: much longer)
#        LLAMA_CPP_ISA=avx2        build for AVX2 + FMA + F16C only (GGML_NATIVE=OFF), what an AVX2-only CPU runs,
#                                  even on an AVX-512 machine (default: native, the build machine's own ISA)
# Then:  specdecode bench --llama-cpp DEST ...
set -euo pipefail

DEST="${1:-/work/llamacpp}"
JOBS="${JOBS:-2}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PIP="${PIP:-}"
if [[ -z "$PIP" ]]; then
    if [[ -x "$HERE/.venv/bin/pip" ]]; then PIP="$HERE/.venv/bin/pip"; else PIP="pip"; fi
fi
SPEC="llama-cpp-python"
if [[ -n "${LLAMA_CPP_PYTHON_VERSION:-}" ]]; then SPEC="llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}"; fi
# The tools the bench runs (plain timing, speculative and lookup decoding, quantization),
# plus plain generation and the tokenizer for checking a file by hand. `llama-completion`
# is the one-shot generator that older llama.cpp called `llama-cli`: from 0.3.3x on,
# `llama-cli` is a chat front end over the server code and only builds with
# LLAMA_BUILD_SERVER=ON (set LLAMA_CPP_CLI=1 to build it too; it takes several times longer).
TARGETS=(llama-bench llama-speculative-simple llama-lookup llama-quantize llama-completion llama-simple llama-tokenize)
BUILD_SERVER=OFF
if [[ "${LLAMA_CPP_CLI:-0}" == "1" ]]; then TARGETS+=(llama-cli); BUILD_SERVER=ON; fi

mkdir -p "$DEST"
if [[ ! -f "$DEST/convert_hf_to_gguf.py" ]]; then
    SDIST_DIR="$DEST/.sdist"
    mkdir -p "$SDIST_DIR"
    if ! ls "$SDIST_DIR"/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
        echo "== downloading $SPEC sdist"
        "$PIP" download --no-binary :all: --no-deps "$SPEC" -d "$SDIST_DIR"
    fi
    TARBALL="$(ls "$SDIST_DIR"/llama_cpp_python-*.tar.gz | sort -V | tail -n 1)"
    echo "== extracting vendor/llama.cpp from $(basename "$TARBALL")"
    TMP="$(mktemp -d)"
    tar -xzf "$TARBALL" -C "$TMP"
    TOP="$(ls -d "$TMP"/llama_cpp_python-*)"
    cp -a "$TOP/vendor/llama.cpp/." "$DEST/"
    # The sdist has no .git, so llama.cpp's build info would read "unknown": record
    # which sdist it came from; the bench keys its GGUF cache on this file.
    basename "$TARBALL" .tar.gz | sed 's/^llama_cpp_python-/llama-cpp-python /' > "$DEST/SPECDECODE_LLAMA_CPP_VERSION"
    rm -rf "$TMP"
fi

ISA_FLAGS=(-DGGML_NATIVE=ON)
if [[ "${LLAMA_CPP_ISA:-native}" == "avx2" ]]; then
    ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
               -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
               -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
elif [[ "${LLAMA_CPP_ISA:-native}" != "native" ]]; then
    echo "LLAMA_CPP_ISA must be native or avx2, got ${LLAMA_CPP_ISA}" >&2
    exit 2
fi
if [[ ! -f "$DEST/build/CMakeCache.txt" ]] || ! grep -q "^LLAMA_BUILD_SERVER:BOOL=$BUILD_SERVER" "$DEST/build/CMakeCache.txt"; then
    echo "== configuring (Release, ${ISA_FLAGS[*]}, CPU only)"
    cmake -S "$DEST" -B "$DEST/build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release \
        "${ISA_FLAGS[@]}" \
        -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_SERVER=$BUILD_SERVER \
        -DLLAMA_OPENSSL=OFF
fi

echo "== building ${TARGETS[*]} with -j$JOBS"
cmake --build "$DEST/build" --config Release -j "$JOBS" --target "${TARGETS[@]}"

echo "== llama.cpp ($(cat "$DEST/SPECDECODE_LLAMA_CPP_VERSION" 2>/dev/null || echo unknown)) built"
echo "checkout:  $DEST"
echo "binaries:  $DEST/build/bin"
for t in "${TARGETS[@]}"; do ls -l "$DEST/build/bin/$t" | awk '{print "  " $NF}'; done
echo "bench:     specdecode bench --llama-cpp $DEST ..."
