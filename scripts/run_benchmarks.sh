#!/usr/bin/env bash
# The measurements behind docs/benchmarks.md, on the bundled pair, in one go (about 25 minutes here).
# Run on an otherwise idle machine. Outputs land in runs/ (gitignored); the docs quote them.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
mkdir -p runs
# gamma=auto measures c and v(k) on first use and caches them per machine and model pair: measure them
# in this run, on this idle machine, not reuse a cache written while something else was running
export SPECDECODE_CACHE=$(mktemp -d)

# 0. Step costs per runtime mode (eager, AVX2, AVX-512, bf16 products): v(γ) and c.
$BIN/python scripts/fast_path_modes.py 2>&1 | tee runs/fast-path-modes.log

# 1. The benchmark: ours (plain, draft-model γ sweep, γ=auto, prompt lookup, eager path) beside transformers.
$BIN/specdecode bench --threads 1 --per-category 4 --reps 2 --gammas 1,2,3,4,5,6,8,auto --lookup-tokens 4,8 \
    --out runs/bench-full 2>&1 | tee runs/bench-full.log

# 1b. The draft vocabulary ablation (FR-Spec): the same draft over its top-2048 tokens vs the full 8192.
$BIN/specdecode bench --threads 1 --per-category 2 --reps 2 --gammas 3,5 --methods plain,draft,draft-fullvocab \
    --out runs/bench-vocab 2>&1 | tee runs/bench-vocab.log

# 2. A useless (random) draft: γ=auto must fall back to plain decoding, not lose to it.
$BIN/python scripts/make_random_draft.py --out runs/random-draft
$BIN/specdecode bench --threads 1 --draft runs/random-draft --per-category 2 --reps 3 --gammas 4,auto \
    --methods plain,draft,draft-auto --out runs/bench-random-draft 2>&1 | tee runs/bench-random-draft.log
$BIN/specdecode bench --threads 1 --draft runs/random-draft --per-category 4 --reps 3 --gammas auto \
    --methods plain,draft-auto --out runs/bench-random-draft-long 2>&1 | tee runs/bench-random-draft-long.log

# 3. The server under load: concurrency 1, 4, 16, speculation on vs off.
$BIN/python scripts/load_test.py --target models/code-target --draft models/code-draft --concurrency 1 4 16 \
    --duration 10 --repeats 2 --max-tokens 128 --server-threads 1 --json runs/load.json 2>&1 | tee runs/load.log
