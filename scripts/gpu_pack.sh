#!/usr/bin/env bash
# Ready a checkout for scripts/gpu_check.py on a lent GPU machine (docs/gpu.md), where only 64 MiB travel
# per call and nothing can be downloaded:
#   scripts/gpu_pack.sh pack      SmolLM2's GGUF and its drafters as .gpu/part_aa, part_ab (xz, ~55 MB each),
#                                 and the wheels the image lacks in .whl/ (Python 3.12)
#   scripts/gpu_pack.sh slim      stop tracking models/ and docs/ in the index (not in any commit), so the
#                                 tree that travels is ~2.6 MB
#   scripts/gpu_pack.sh restore   undo slim (run it before any commit)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
exclude=.git/info/exclude
case "${1:-}" in
  pack)
    for p in /.whl/ /.gpu/; do grep -qx "$p" "$exclude" 2>/dev/null || echo "$p" >>"$exclude"; done
    gguf=$("$PY" -c "from specdecode.models.catalog import model_file; print(model_file('smollm2-135m-instruct'))")
    [ -f "$gguf" ] || { echo "pull it first: specdecode pull smollm2-135m-instruct" >&2; exit 1; }
    stage=$(mktemp -d)
    mkdir -p "$stage/smollm2-135m-instruct" .gpu
    ln -s "$gguf" "$stage/smollm2-135m-instruct/"
    cp -r models/smollm2-135m-instruct/drafters "$stage/smollm2-135m-instruct/"
    rm -f .gpu/part_*
    tar chf - -C "$stage" smollm2-135m-instruct | xz -T0 -6 | split -b 55000000 - .gpu/part_
    rm -rf "$stage"
    wheels=$("$PY" -m pip list --format=freeze 2>/dev/null | grep -iE \
      '^(gguf|fastapi|starlette|pydantic|pydantic_core|uvicorn|annotated-types|typing-inspection|typing_extensions|opentelemetry-api)==')
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl $wheels
    ls -l .gpu .whl ;;
  slim)
    git rm -r -q --cached models docs
    printf '/models/\n/docs/\n' >>"$exclude"
    git ls-files -z | xargs -0 du -cb | tail -1 ;;
  restore)
    git reset -q
    grep -vx -e /models/ -e /docs/ "$exclude" >"$exclude.tmp" || true
    mv "$exclude.tmp" "$exclude"
    git status --short | head ;;
  *) sed -n 2,9p "$0"; exit 2 ;;
esac
