#!/usr/bin/env bash
# Rebuild the shipped EAGLE-3 draft for the built-in SmolLM2-135M target from scratch:
# prompt pool -> self-distilled data + hidden-state dump -> training -> offline eval -> ship.
# Every step is resumable: after an interruption, rerun `make draft` and it continues where it stopped.
# Progress goes to runs/draft/*.log. Sizes can be overridden from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
RUN=${RUN:-runs/draft}
SAMPLES=${SAMPLES:-3000}          # training conversations (self-distilled from the prompt pool)
NEW_TOKENS=${NEW_TOKENS:-128}     # answer length cap, the benchmark's generation length
VOCAB=${VOCAB:-8192}              # draft vocabulary (see docs/MODEL_CARD.md for the coverage measurement)
EPOCHS=${EPOCHS:-6}
LR=${LR:-1e-3}
EVAL_SAMPLES=${EVAL_SAMPLES:-80}  # held-out MT-bench / HumanEval prompts answered by the target for eval
THREADS=${THREADS:-2}
mkdir -p "$RUN"

echo "[1/4] training data: $SAMPLES pool prompts (log: $RUN/datagen.log)"
"$BIN/specwire" datagen --prompts pool --out "$RUN/data" --max-samples "$SAMPLES" \
  --max-new-tokens "$NEW_TOKENS" --batch-size 16 --threads "$THREADS" 2>"$RUN/datagen.log"

echo "[2/4] held-out evaluation data: MT-bench and HumanEval answers (never used for training)"
"$BIN/specwire" datagen --prompts mt-bench --out "$RUN/eval-mtbench" --max-samples "$EVAL_SAMPLES" \
  --max-new-tokens "$NEW_TOKENS" --batch-size 8 --threads "$THREADS" 2>"$RUN/datagen-eval.log"
"$BIN/specwire" datagen --prompts humaneval --out "$RUN/eval-humaneval" --max-samples "$EVAL_SAMPLES" \
  --max-new-tokens "$NEW_TOKENS" --batch-size 8 --threads "$THREADS" 2>>"$RUN/datagen-eval.log"

echo "[3/4] training (log: $RUN/train.log)"
"$BIN/specwire" train --data "$RUN/data" --out "$RUN/train" --draft-vocab-size "$VOCAB" \
  --epochs "$EPOCHS" --lr "$LR" --batch-size 8 --threads "$THREADS" --json >"$RUN/train.json" 2>"$RUN/train.log"

echo "[4/4] offline evaluation"
for set in mtbench humaneval; do
  "$BIN/specwire" eval --draft "$RUN/train/draft" --data "$RUN/eval-$set" --split all --json >"$RUN/eval-$set.json"
done
cat "$RUN"/eval-*.json
echo "draft: $RUN/train/draft  (ship it with: cp -r $RUN/train/draft src/specwire/assets/smollm2-135m-eagle3)"
