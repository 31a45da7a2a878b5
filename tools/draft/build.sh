#!/usr/bin/env bash
# Rebuild the shipped EAGLE-3 draft for the built-in SmolLM2-135M target from scratch:
# prompt pool -> self-distilled data + hidden-state dumps -> training -> offline eval -> ship.
# Every step is resumable: after an interruption, rerun `make draft` and it continues where it stopped.
# Progress goes to runs/draft/*.log. Sizes can be overridden from the environment.
#
# Training data: three disjoint parts of the prompt pool (docs/PROMPT_POOL.md), one dump each, merged by
# `specwire train` (which checks every dump against the same wiring):
#   pool[:512]      512 prompts: CPython stdlib code + Shakespeare/Milton passages
#   pool:synthetic  2,160 prompts: chat and reasoning (writing, roleplay, extraction, maths, logic, STEM...)
#   pool[512:1000]  488 more code + Shakespeare/Milton prompts
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
RUN=${RUN:-runs/draft}
NEW_TOKENS=${NEW_TOKENS:-128}     # answer length cap, the benchmark's generation length
VOCAB=${VOCAB:-8192}              # draft vocabulary (see docs/MODEL_CARD.md for the coverage measurement)
EPOCHS=${EPOCHS:-2}
LR=${LR:-1e-3}
EVAL_SAMPLES=${EVAL_SAMPLES:-24}  # held-out MT-bench / HumanEval prompts answered by the target for eval
THREADS=${THREADS:-2}
mkdir -p "$RUN"

datagen() {  # datagen OUT PROMPTS BATCH [extra args]
  local out=$1 prompts=$2 batch=$3; shift 3
  # fp32 answers on padded batches: the engine the shipped draft's data was generated with
  "$BIN/specwire" datagen --prompts "$prompts" --out "$RUN/$out" --max-new-tokens "$NEW_TOKENS" \
    --batch-size "$batch" --dtype float32 --batching padded --threads "$THREADS" "$@" 2>>"$RUN/datagen.log"
}

echo "[1/5] training data: 3,160 self-distilled pool conversations in three dumps (log: $RUN/datagen.log)"
datagen data-pool1 pool 16 --max-samples 512
datagen data-synthetic pool:synthetic 32
datagen data-pool2 'pool[512:1000]' 32

echo "[2/5] held-out evaluation data: MT-bench and HumanEval answers (never used for training)"
datagen eval-mtbench mt-bench 8 --max-samples "$EVAL_SAMPLES"
datagen eval-humaneval humaneval 8 --max-samples "$EVAL_SAMPLES"

echo "[3/5] training (log: $RUN/train.log)"
"$BIN/specwire" train --data "$RUN/data-pool1" "$RUN/data-synthetic" "$RUN/data-pool2" --out "$RUN/train" \
  --draft-vocab-size "$VOCAB" --epochs "$EPOCHS" --lr "$LR" --batch-size 8 --eval-every 200 --threads "$THREADS" \
  --json >"$RUN/train.json" 2>"$RUN/train.log"

echo "[4/5] offline evaluation"
for set in mtbench humaneval; do
  "$BIN/specwire" eval --draft "$RUN/train/draft" --data "$RUN/eval-$set" --split all --json >"$RUN/eval-$set.json"
done
cat "$RUN"/eval-*.json

echo "[5/5] bf16 copy to ship: $RUN/ship (then: cp -r $RUN/ship src/specwire/assets/smollm2-135m-eagle3)"
"$BIN/python" - "$RUN/train/draft" "$RUN/ship" <<'PY'
import json, sys
import torch
from specwire.draft.checkpoint import load_draft, save_draft
src, dst = sys.argv[1:]
training = json.load(open(f"{src}/config.json"))["specwire"].get("training")
save_draft(load_draft(src), dst, dtype=torch.bfloat16, extra={"training": training} if training else None,
           verifier_path="smollm2-135m")  # the built-in name, not this machine's path
PY
