#!/bin/bash
# Gemma 3 270M prose under intermittent load on the other core, from a fresh cost cache, for a source tree ($1):
# the cost tables left in the cache afterwards. Usage: tables_under_load.sh SRC LABEL
SRC=$1; LABEL=$2; OUT=/work/main/lab/results/session40
C=$(mktemp -d); mkdir $C/models; ln -s ~/.cache/specdecode/models/gemma-3-270m $C/models/
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /work/main/.venv/bin/python $OUT/load.py & LP=$!
SPECDECODE_CACHE=$C OMP_NUM_THREADS=1 PYTHONPATH=$SRC /work/main/.venv/bin/python -m specdecode.cli bench variants auto suffix \
  --target gemma-3-270m --workload prose --per-category all --max-new-tokens 128 --reps 3 2>&1 | grep -v Warn | tail -4
kill $LP
for f in $C/costs/*.json; do python3 -c "import json; d=json.load(open('$f')); print('$LABEL', [round(x,2) for x in d['v']])"; done
