#!/usr/bin/env bash
# Rebuild the bundled pair models/code-target + models/code-draft from scratch on a CPU.
# These are the exact commands behind models/README.md. Both steps are time-budgeted
# (--max-minutes): the cosine LR schedule follows the wall clock, so the number of steps,
# and hence the exact weights, depend on the machine's speed; every other choice is fixed.
# Checkpoints go to runs/ (gitignored); rerunning a step with --resume continues it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p runs

# 1. Target: 26.7M-param Llama (8 x 512, 8 heads / 2 KV heads, FFN 1408, tied embeddings, 512 context),
#    byte-level BPE 8192, trained on this interpreter's stdlib (test suites excluded, 5% of files held out).
$PY -m specdecode.train.cli train --out models/code-target --run-dir runs/target \
    --dim 512 --layers 8 --heads 8 --kv-heads 2 --ffn 1408 --lr 0.0015 \
    --steps 100000 --max-minutes 95 --warmup 20 --threads 0 2>&1 | tee runs/target.log

# 2. Draft: 1.4M-param Llama (2 x 128, 4 heads / 2 KV heads, FFN 384, tied), distilled from the target
#    on its own greedy + sampled continuations (forward KL to its top-64 distributions); distill also
#    ranks the tokens by training-split frequency (draft_vocab.json: the draft proposes from the top 2048).
$PY -m specdecode.train.cli distill --target models/code-target --out models/code-draft --run-dir runs/draft \
    --steps 100000 --max-minutes 10 --onpolicy-seqs 768 --corpus-seqs 384 --threads 0 2>&1 | tee runs/draft.log

# 3. Held-out acceptance rate (also printed at the end of step 2) and the draft/target cost ratio.
$PY -m specdecode.train.cli eval-draft --target models/code-target --draft models/code-draft \
    --json runs/alpha.json
$PY -m specdecode.cli bench costs --target models/code-target --draft models/code-draft --formats bf16 \
    --isas auto --max-tokens 2 --context 128 --json runs/cost.json
