#!/usr/bin/env bash
# The GPU checks of the speed and draft work, as one time-boxed script for a CUDA machine:
#   1. `specwire bench` in bf16 on the built-in target and the shipped draft: every method, the
#      lossless column, the first $LIMIT MT-bench prompts;
#   2. the draft recipe on CUDA with larger batches: held-out answers to every MT-bench and HumanEval
#      prompt (fp32, one batch each), the shipped draft trained on over the self-instruct conversations
#      it has not seen (bf16 autocast, batch $SI_BATCH), then both drafts evaluated on those answers;
#   3. if time is left, the bench again in fp32.
# Nothing in it is CUDA-specific but DEVICE. Its dry run on a CPU (about 5 minutes on 2 cores; it passed
# under torch 2.13.0 with transformers 5.17.0 and huggingface_hub 1.33.0, a CUDA image's versions, besides
# the pinned transformers 5.19.0):
#   DEVICE=cpu LIMIT=1 NEW_TOKENS=8 EVAL_LIMIT=2 EVAL_TOKENS=8 SI_SAMPLES=16 SI_BATCH=8 AUTOCAST=--no-autocast \
#   BENCH_DTYPE=float32 OUT=/tmp/gpu-dry PY=.venv/bin/python bash tools/gpu_run.sh
# (tests/integration/test_gpu_script.py runs a smaller one).
# Every step runs under `timeout` within BUDGET_S seconds in all; a step that fails or runs out of time
# leaves its log and the next one still runs. Results: $OUT/gpu-results.tar.gz (logs, bench folders,
# eval JSON, training metrics) and $OUT/gpu-draft.tar.xz (the trained draft, when one was written).
#
# Usage: OUT=runs/gpu bash tools/gpu_run.sh   (specwire importable, e.g. PYTHONPATH=src)
set -uo pipefail
OUT=${OUT:-runs/gpu}
WORK=${WORK:-$OUT/work}
DEVICE=${DEVICE:-cuda}
BUDGET_S=${BUDGET_S:-540}      # the whole script, every step included
LIMIT=${LIMIT:-20}             # MT-bench prompts the bench runs
NEW_TOKENS=${NEW_TOKENS:-64}   # bench tokens per prompt
EVAL_TOKENS=${EVAL_TOKENS:-128}
EVAL_LIMIT=${EVAL_LIMIT:-}     # held-out prompts per set (empty: all)
SI_SKIP=${SI_SKIP:-6400}       # the self-instruct conversations the shipped draft was trained on
SI_SAMPLES=${SI_SAMPLES:-}     # how many of the rest to train on (empty: all)
SI_BATCH=${SI_BATCH:-32}
SI_LR=${SI_LR:-3e-4}
VAL_SAMPLES=${VAL_SAMPLES:-96}  # self-instruct validation conversations (best-checkpoint selection)
FP32_BENCH=${FP32_BENCH:-1}     # 0: no fp32 bench at the end
AUTOCAST=${AUTOCAST:---autocast}  # the draft under bf16 autocast (CUDA; --no-autocast for a dry run on a CPU without bf16)
BENCH_DTYPE=${BENCH_DTYPE:-bfloat16}  # the first bench's dtype (a dry run on a CPU without bf16: float32)
PY=${PY:-python3}
SW=("$PY" -m specwire)
mkdir -p "$WORK"
start=$(date +%s)

step() {  # step NAME SECONDS CMD...: CMD under the smaller of SECONDS and what is left of the budget
  local name=$1 want=$2 t rc; shift 2
  t=$(( BUDGET_S - ($(date +%s) - start) - 15 ))
  (( t > want )) && t=$want
  if (( t < 20 )); then echo "[$(date +%T)] $name: skipped, ${t}s left"; return 1; fi
  echo "[$(date +%T)] $name (at most ${t}s)"
  timeout "$t" "$@" >"$WORK/$name.out" 2>"$WORK/$name.log"
  rc=$?
  echo "[$(date +%T)] $name: rc=$rc$([ $rc = 124 ] && echo ' (timed out)')"
  tail -n 4 "$WORK/$name.log" | cut -c1-300
  return $rc
}

pack() {  # what comes back: small text in one archive (written again after each stage)
  tar -czf "$OUT/gpu-results.tar.gz" --exclude='*.safetensors' --exclude='shard-*' -C "$WORK" . 2>/dev/null
}
trap pack EXIT

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c 'import torch, transformers, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
"transformers", transformers.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))'
} | tee "$WORK/machine.txt"

BENCH=(bench --device "$DEVICE" --prompts mt-bench --limit "$LIMIT" --max-new-tokens "$NEW_TOKENS"
       --methods hf-generate,hf-prompt-lookup,plain,eagle3-chain,eagle3-tree --fresh --no-progress)
step "bench-$BENCH_DTYPE" 300 "${SW[@]}" "${BENCH[@]}" --dtype "$BENCH_DTYPE" --out "$WORK/bench-$BENCH_DTYPE" --json
pack

limit_args=(); [ -n "$EVAL_LIMIT" ] && limit_args=(--max-samples "$EVAL_LIMIT")
for set in mt-bench humaneval; do
  step "datagen-$set" 90 "${SW[@]}" datagen --device "$DEVICE" --prompts "$set" --out "$WORK/eval-$set" \
    --max-new-tokens "$EVAL_TOKENS" --batch-size 256 --dtype float32 "${limit_args[@]}" --no-progress
done

si_args=(--skip-train-samples "$SI_SKIP"); [ -n "$SI_SAMPLES" ] && si_args+=(--max-train-samples "$SI_SAMPLES")
step train 200 "${SW[@]}" train --online --device "$DEVICE" --target smollm2-135m --data tools/draft/data/selfinstruct \
  --init-draft smollm2-135m-eagle3 --out "$WORK/train" "${si_args[@]}" --ttt-steps 3 --epochs 1 --lr "$SI_LR" \
  --warmup-ratio 0.05 --batch-size "$SI_BATCH" --batch-tokens 65536 --eval-every 100 --save-every 100 \
  --eval-max-samples "$VAL_SAMPLES" --select best --dtype float32 "$AUTOCAST" --no-progress --json
trained=""
for d in "$WORK/train/draft" "$WORK/train/best"; do [ -f "$d/config.json" ] && { trained=$d; break; }; done

for set in mt-bench humaneval; do
  [ -f "$WORK/eval-$set/manifest.json" ] || continue
  step "eval-shipped-$set" 60 "${SW[@]}" eval --device "$DEVICE" --draft smollm2-135m-eagle3 --data "$WORK/eval-$set" \
    --split all --json
  [ -n "$trained" ] && step "eval-trained-$set" 60 "${SW[@]}" eval --device "$DEVICE" --draft "$trained" \
    --data "$WORK/eval-$set" --split all --json
done
pack
[ -n "$trained" ] && tar -cJf "$OUT/gpu-draft.tar.xz" -C "$(dirname "$trained")" "$(basename "$trained")"

[ "$FP32_BENCH" = 1 ] && step bench-fp32 240 "${SW[@]}" "${BENCH[@]}" --dtype float32 --out "$WORK/bench-fp32" --json
echo "[$(date +%T)] done in $(( $(date +%s) - start ))s"
