#!/usr/bin/env bash
# Rebuild the shipped EAGLE-3 draft for the built-in SmolLM2-135M target from scratch, in nine stages:
#   stage 1: prompt pool -> self-distilled answers + hidden-state dumps -> training (the v2 recipe);
#   stage 2: the stage-1 draft, trained on, online, over the first self-instruct conversations the target
#            wrote itself (tools/draft/data/selfinstruct, committed) (version 3);
#   stage 3: the stage-2 draft, trained on over every self-instruct training conversation in one long
#            schedule (version 4);
#   stage 4: the stage-3 draft, trained on over them again in a new order at half the peak learning rate
#            (version 5);
#   stage 5: the stage-4 draft, trained on over both self-instruct builds (tools/draft/data/selfinstruct and
#            tools/draft/data/selfinstruct-s1, 38,912 conversations, half of them new) (version 6);
#   stage 6: the stage-5 draft, trained on over both builds again in a new order, stopped at step 3,250 of a
#            3,600-step schedule (version 7);
#   stage 7: the stage-6 draft, trained on over the 16,809 training conversations new to it (the second build's
#            shards 35-72 and a third, coding build), 1,800 steps (version 8);
#   stage 8: the stage-7 draft, its vocabulary chosen again from all five builds (--refit-vocab), trained on over
#            one pass of a mixed window: general chat it has seen, two new steered builds (writing, reasoning) and
#            coding, 1,375 steps (version 9);
#   stage 9: the stage-8 draft, trained on over one pass of a window led by two new steered builds (extraction and
#            role-play; science, the humanities and word problems), with coding and general chat it saw least
#            recently, 1,222 steps -> offline eval -> ship (version 10).
# Every step is resumable: after an interruption, rerun `make draft` and it continues where it stopped.
# Progress goes to runs/draft/*.log. Sizes can be overridden from the environment.
#
# Stage-1 data: three disjoint parts of the prompt pool (docs/PROMPT_POOL.md), one dump each, merged by
# `specwire train` (which checks every dump against the same wiring):
#   pool[:512]      512 prompts: CPython stdlib code + Shakespeare/Milton passages
#   pool:synthetic  2,160 prompts: chat and reasoning (writing, roleplay, extraction, maths, logic, STEM...)
#   pool[512:1000]  488 more code + Shakespeare/Milton prompts
# Stage-2 data: the self-instruct conversations (docs/PROMPT_POOL.md). Versions 3-5 learnt from shards 0-78
# (20,224 conversations); `specwire selfinstruct` below finds those complete and only checks them. The build
# goes on growing past them for the next stage, so stages 3 and 4 name their window (`SI_ALL`). Stage 5 reads shards
# 0-116 of that build and shards 0-34 of a second one made with `--seed 1` (38,912 conversations); its window
# (`SI5_ALL`) is their training conversations, the main build's first, so growth belongs in the second build or a
# third folder, never in the main build. Stage 7 reads the second build first (shards 0-72), then a third, coding
# build (shards 0-28, made with `--seed 2` and a system message that asks for Python functions), then the main
# build: it skips the second build's 8,780 training conversations that stages 5-6 saw (`SI7_SKIP`) and takes the
# next `SI7_ALL`: the 16,809 training conversations of the 17,152 new ones, and none of the main build's. So growth
# then belonged at the end of the coding build or in a new folder. Stage 8 reads all five builds (the second, the
# writing and reasoning builds, the coding build, the main build): its vocabulary is chosen again from every
# conversation of every folder it names, and its window (`SI8_SKIP`, `SI8_ALL`) is the second build's last 3,000
# training conversations, both steered builds in full and the coding build's first 1,980. So no build it reads may
# grow: growth belongs in a new folder. Stage 9 reads the coding build, two new steered builds (made with `--seed 8`
# and `--seed 9`) and the second build, in that order: its window (`SI9_SKIP`, `SI9_ALL`) is the coding build's last
# 1,500 training conversations, both new builds in full and the second build's first 1,500; it keeps stage 8's
# vocabulary. Target states are captured per batch (--online): no dump.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
RUN=${RUN:-runs/draft}
NEW_TOKENS=${NEW_TOKENS:-128}     # answer length cap, the benchmark's generation length
VOCAB=${VOCAB:-8192}              # draft vocabulary (see docs/MODEL_CARD.md for the coverage measurement)
EPOCHS=${EPOCHS:-2}
LR=${LR:-1e-3}
SI_SAMPLES=${SI_SAMPLES:-7680}  # self-instruct conversations stage 2 trains on (of 20,224): 960 steps, ~95 min on 2 cores
SI_LR=${SI_LR:-1e-3}
SI_STOP=${SI_STOP:-800}   # version 3 stopped its 960-step schedule here (a session's time box); its best validation ships
SI_ALL=${SI_ALL:-19819}  # stages 3-4: the training conversations of shards 0-78 (20,224 less the validation split)
S3_EPOCHS=${S3_EPOCHS:-1.2}  # stage 3: passes over all ~19,800 self-instruct training conversations (2,974 steps)
S3_LR=${S3_LR:-1e-3}
S4_STEPS=${S4_STEPS:-3000}  # stage 4: steps of 8 over the same conversations, data order seed 1 (about 1.2 passes)
S4_LR=${S4_LR:-5e-4}
SI5_ALL=${SI5_ALL:-38132}  # stage 5: the training conversations of both builds (38,912 less the 780 of the validation split)
S5_STEPS=${S5_STEPS:-4000}  # stage 5: steps of 8, data order seed 2 (0.84 of a pass)
S5_LR=${S5_LR:-5e-4}
S6_STEPS=${S6_STEPS:-3600}  # stage 6: the schedule's steps of 8 over the same window, data order seed 3
S6_STOP=${S6_STOP:-3250}  # version 7 stopped its schedule here (a session's time box; the cosine lr was down to 1.2e-5)
S6_LR=${S6_LR:-5e-4}
SI7_SKIP=${SI7_SKIP:-8780}  # stage 7: the second build's training conversations that stages 5-6 saw (its shards 0-34)
SI7_ALL=${SI7_ALL:-16809}  # stage 7: its window, the new training conversations (second build's rest, coding build)
S7_STEPS=${S7_STEPS:-1800}  # stage 7: steps of 8, data order seed 4 (0.86 of a pass)
S7_LR=${S7_LR:-5e-4}
SI8_SKIP=${SI8_SKIP:-15314}  # stage 8: the second build's training conversations before its last 3,000 (of 18,314)
SI8_ALL=${SI8_ALL:-11000}  # stage 8: its window: 3,000 general, 2,759 writing, 3,261 reasoning, 1,980 coding
S8_STEPS=${S8_STEPS:-1375}  # stage 8: steps of 8, data order seed 6 (one pass)
S8_LR=${S8_LR:-3e-4}
SI9_SKIP=${SI9_SKIP:-5775}  # stage 9: the coding build's training conversations before its last 1,500 (of 7,275)
SI9_ALL=${SI9_ALL:-9773}  # stage 9: its window: 1,500 coding, 3,512 extraction, 3,261 science and humanities, 1,500 general
S9_STEPS=${S9_STEPS:-1222}  # stage 9: steps of 8, data order seed 8 (one pass)
S9_LR=${S9_LR:-3e-4}
THREADS=${THREADS:-2}
mkdir -p "$RUN"

datagen() {  # datagen OUT PROMPTS BATCH [extra args]
  local out=$1 prompts=$2 batch=$3; shift 3
  # fp32 answers on padded batches: the engine the shipped draft's data was generated with
  "$BIN/specwire" datagen --prompts "$prompts" --out "$RUN/$out" --max-new-tokens "$NEW_TOKENS" \
    --batch-size "$batch" --dtype float32 --batching padded --threads "$THREADS" "$@" 2>>"$RUN/datagen.log"
}

ship() {  # ship SRC DST [STATE]: the bf16 copy of a trained draft that ships (under 50 MB), its training record kept
  # (STATE: the run's checkpoint state.json, whose config joins the record of a draft taken from OUT/best)
  "$BIN/python" - "$@" <<'PY'
import json, sys
import torch
from specwire.draft.checkpoint import load_draft, save_draft
src, dst, *state = sys.argv[1:]
training = json.load(open(f"{src}/config.json"))["specwire"].get("training")
if state:  # a draft from OUT/best records only its step and validation: the rest comes from the run's state
    st = json.load(open(state[0]))
    c = st["config"]
    base = {"steps": training["steps"], "selected_step": training["steps"], "ttt_steps": c["ttt_steps"],
            "data": c["data"], "target": c["target"], "online": c["online"]}
    training = {**base, **training, "config": c, "stopped_at_step": st["step"], "schedule_steps": st["total_steps"]}
save_draft(load_draft(src), dst, dtype=torch.bfloat16, extra={"training": training} if training else None,
           verifier_path="smollm2-135m")  # the built-in name, not this machine's path
PY
}

echo "[1/20] training data: 3,160 self-distilled pool conversations in three dumps (log: $RUN/datagen.log)"
datagen data-pool1 pool 16 --max-samples 512
datagen data-synthetic pool:synthetic 32
datagen data-pool2 'pool[512:1000]' 32

echo "[2/20] held-out evaluation data: every MT-bench and HumanEval prompt answered (never used for training)"
datagen eval-mtbench mt-bench 8
datagen eval-humaneval humaneval 8

echo "[3/20] stage 1: training on the pool (log: $RUN/train.log)"
"$BIN/specwire" train --data "$RUN/data-pool1" "$RUN/data-synthetic" "$RUN/data-pool2" --out "$RUN/train" \
  --draft-vocab-size "$VOCAB" --epochs "$EPOCHS" --lr "$LR" --batch-size 8 --eval-every 200 --threads "$THREADS" \
  --json >"$RUN/train.json" 2>"$RUN/train.log"
ship "$RUN/train/draft" "$RUN/stage1"  # the bf16 copy that shipped as version 2; stage 2 starts from it

echo "[4/20] stages 2-9 data: the seven self-instruct builds (complete in the repository: checked, not regenerated)"
SI_ARGS=(--shard-size 256 --sample-batch 320 --answer-batch 128 --max-request-tokens 128 --max-new-tokens 128)
"$BIN/specwire" selfinstruct --out tools/draft/data/selfinstruct --conversations 29952 "${SI_ARGS[@]}" \
  --threads "$THREADS" 2>>"$RUN/selfinstruct.log"
"$BIN/specwire" selfinstruct --out tools/draft/data/selfinstruct-s1 --seed 1 --conversations 18688 "${SI_ARGS[@]}" \
  --threads "$THREADS" 2>>"$RUN/selfinstruct.log"
"$BIN/specwire" selfinstruct --out tools/draft/data/selfinstruct-code --seed 2 --conversations 7424 "${SI_ARGS[@]}" \
  --system "You are an expert Python programmer. Users ask you to write Python functions." \
  --threads "$THREADS" 2>>"$RUN/selfinstruct.log"
"$BIN/specwire" selfinstruct --out tools/draft/data/selfinstruct-write --seed 3 --conversations 2816 "${SI_ARGS[@]}" \
  --system "You are a helpful assistant. Users ask you to write stories, essays, emails, poems and blog posts, and to rewrite, shorten or edit a text they give you." \
  --threads "$THREADS" 2>>"$RUN/selfinstruct.log"
"$BIN/specwire" selfinstruct --out tools/draft/data/selfinstruct-reason --seed 5 --conversations 3328 "${SI_ARGS[@]}" \
  --system "You are a helpful assistant. Users ask you to solve math problems and logic puzzles step by step, and to explain ideas in science, history and economics." \
  --threads "$THREADS" 2>>"$RUN/selfinstruct.log"
"$BIN/specwire" selfinstruct --out tools/draft/data/selfinstruct-extract --seed 8 --conversations 3584 "${SI_ARGS[@]}" \
  --system "You are a helpful assistant. Users give you a text and ask you to extract facts, names and numbers from it, to summarise it, or to put it in a table or JSON; some ask you to play a character in a conversation." \
  --threads "$THREADS" 2>>"$RUN/selfinstruct.log"
"$BIN/specwire" selfinstruct --out tools/draft/data/selfinstruct-stem --seed 9 --conversations 3328 "${SI_ARGS[@]}" \
  --system "You are a helpful assistant. Users ask you to explain ideas in physics, chemistry, biology, medicine, history, philosophy and the arts, to compare them, and to work through arithmetic and word problems." \
  --threads "$THREADS" 2>>"$RUN/selfinstruct.log"

ckpt_step() {  # ckpt_step RUN_OUT: the step of its checkpoint (fails when there is none)
  "$BIN/python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$1/checkpoint/state.json" 2>/dev/null
}

snapshot_loop() {  # snapshot_loop RUN_OUT SNAPS: copy each new checkpoint to SNAPS/step-N, the learning curve's points
  local out=$1 snaps=$2 ck="$1/checkpoint" step
  while sleep 20; do
    step=$(ckpt_step "$out") || continue
    [ -d "$snaps/step-$step" ] && continue
    rm -rf "$snaps/tmp" && mkdir -p "$snaps/tmp"
    cp "$ck/state.json" "$ck/draft.safetensors" "$snaps/tmp/" 2>/dev/null || continue
    cmp -s "$ck/state.json" "$snaps/tmp/state.json" && mv "$snaps/tmp" "$snaps/step-$step"  # not torn
  done
}

learning_curve() {  # learning_curve RUN_OUT SNAPS NAME XLABEL: score the snapshots on the held-out sets, and plot
  "$BIN/python" tools/draft/snapshots.py --run "$1" --snaps "$2" --eval mtbench="$RUN/eval-mtbench" \
    --eval humaneval="$RUN/eval-humaneval" --out "$RUN/$3.json"
  "$BIN/python" tools/plot_learning_curve.py "$RUN/$3.json" "$RUN/$3.png" --xlabel "$4"
}

echo "[5/20] stage 2: the stage-1 draft trained on over self-instruct, best held-out checkpoint kept (log: $RUN/train-si.log)"
snapshot_loop "$RUN/train-si" "$RUN/snaps" & SNAPSHOTS=$!
trap 'kill $SNAPSHOTS 2>/dev/null' EXIT
done_steps=$(ckpt_step "$RUN/train-si" || echo 0)
if [ "$done_steps" -lt "$SI_STOP" ]; then
  "$BIN/specwire" train --online --target smollm2-135m --data tools/draft/data/selfinstruct --init-draft "$RUN/stage1" \
    --out "$RUN/train-si" --max-train-samples "$SI_SAMPLES" --ttt-steps 3 --epochs 1 --lr "$SI_LR" --batch-size 8 \
    --eval-every 160 --save-every 160 --eval-max-samples 96 --select best --dtype float32 --threads "$THREADS" \
    --stop-after $((SI_STOP - done_steps)) --json >"$RUN/train-si.json" 2>>"$RUN/train-si.log"
fi
sleep 25  # the snapshot loop's last copy
kill $SNAPSHOTS 2>/dev/null || true

echo "[6/20] bf16 copy of stage 2 (version 3): $RUN/stage2"
ship "$RUN/train-si/best" "$RUN/stage2" "$RUN/train-si/checkpoint/state.json"

# Stages 3 and 4 train the draft under bf16 autocast and capture the target's states in bf16 where the CPU computes
# bf16 natively (AMX or AVX512-BF16: 1.4-1.7 s a step on 2 cores with AMX), and in fp32 elsewhere (emulated bf16
# is about 10x slower there), so their results differ by the rounding of the dtype. Versions 4 and 5 were trained with AMX.
if "$BIN/python" -c 'import sys; from specwire.target.cpu import native_bf16; sys.exit(0 if native_bf16() else 1)'; then
  ONLINE_DTYPE="--dtype bfloat16 --autocast"
else
  ONLINE_DTYPE="--dtype float32 --no-autocast"
fi

SI_DATA="tools/draft/data/selfinstruct"  # what online_stage trains on (stage 5 adds the second build)

online_stage() {  # online_stage OUT SNAPS INIT [train args...]: the init draft trained on over $SI_DATA
  # online, in $ONLINE_DTYPE, each checkpoint copied to SNAPS (resumes from OUT's checkpoint when rerun)
  local out=$1 snaps=$2 init=$3; shift 3
  snapshot_loop "$out" "$snaps" & SNAPSHOTS=$!
  # shellcheck disable=SC2086  # SI_DATA is a list of folders
  "$BIN/specwire" train --online --target smollm2-135m --data $SI_DATA --init-draft "$init" \
    --out "$out" --ttt-steps 3 --batch-size 8 --eval-every 250 --save-every 125 --eval-max-samples 96 --select best \
    $ONLINE_DTYPE --threads "$THREADS" "$@" --json >"$out.json" 2>>"$out.log"
  sleep 25  # the snapshot loop's last copy
  kill $SNAPSHOTS 2>/dev/null || true
}

echo "[7/20] stage 3: every self-instruct training conversation, one long schedule ($ONLINE_DTYPE; log: $RUN/train-si2.log)"
online_stage "$RUN/train-si2" "$RUN/snaps-si2" "$RUN/stage2" --max-train-samples "$SI_ALL" --epochs "$S3_EPOCHS" --lr "$S3_LR"

echo "[8/20] bf16 copy of stage 3 (version 4): $RUN/stage3"
ship "$RUN/train-si2/draft" "$RUN/stage3" "$RUN/train-si2/checkpoint/state.json"

echo "[9/20] stage 4: the same conversations again, a new order, half the peak lr ($ONLINE_DTYPE; log: $RUN/train-si3.log)"
online_stage "$RUN/train-si3" "$RUN/snaps-si3" "$RUN/stage3" --max-train-samples "$SI_ALL" --epochs 2 --max-steps "$S4_STEPS" --seed 1 --lr "$S4_LR"

echo "[10/20] bf16 copy of stage 4 (version 5): $RUN/stage4"
ship "$RUN/train-si3/draft" "$RUN/stage4" "$RUN/train-si3/checkpoint/state.json"

echo "[11/20] stage 5: both self-instruct builds, half of them new to the draft ($ONLINE_DTYPE; log: $RUN/train-si4.log)"
SI_DATA="tools/draft/data/selfinstruct tools/draft/data/selfinstruct-s1"
online_stage "$RUN/train-si4" "$RUN/snaps-si4" "$RUN/stage4" --max-train-samples "$SI5_ALL" --epochs 1 --max-steps "$S5_STEPS" --seed 2 --lr "$S5_LR"

echo "[12/20] bf16 copy of stage 5 (version 6): $RUN/stage5"
ship "$RUN/train-si4/draft" "$RUN/stage5" "$RUN/train-si4/checkpoint/state.json"

echo "[13/20] stage 6: both builds again, a new order ($ONLINE_DTYPE; log: $RUN/train-si5.log)"
done_steps=$(ckpt_step "$RUN/train-si5" || echo 0)
if [ "$done_steps" -lt "$S6_STOP" ]; then  # its best validation ships (OUT/best: the stop leaves no OUT/draft)
  online_stage "$RUN/train-si5" "$RUN/snaps-si5" "$RUN/stage5" --max-train-samples "$SI5_ALL" --epochs 1 \
    --max-steps "$S6_STEPS" --stop-after $((S6_STOP - done_steps)) --seed 3 --lr "$S6_LR"
fi

echo "[14/20] bf16 copy of stage 6 (version 7): $RUN/stage6"
ship "$RUN/train-si5/best" "$RUN/stage6" "$RUN/train-si5/checkpoint/state.json"

echo "[15/20] stage 7: the 16,809 new conversations ($ONLINE_DTYPE; log: $RUN/train-si6.log)"
SI_DATA="tools/draft/data/selfinstruct-s1 tools/draft/data/selfinstruct-code tools/draft/data/selfinstruct"
online_stage "$RUN/train-si6" "$RUN/snaps-si6" "$RUN/stage6" --skip-train-samples "$SI7_SKIP" \
  --max-train-samples "$SI7_ALL" --epochs 1 --max-steps "$S7_STEPS" --seed 4 --lr "$S7_LR"

echo "[16/20] bf16 copy of stage 7 (version 8): $RUN/stage7"
ship "$RUN/train-si6/best" "$RUN/stage7" "$RUN/train-si6/checkpoint/state.json"

echo "[17/20] stage 8: version 8, vocabulary refit, over a mixed window ($ONLINE_DTYPE; log: $RUN/train-si7.log)"
SI_DATA="tools/draft/data/selfinstruct-s1 tools/draft/data/selfinstruct-write tools/draft/data/selfinstruct-reason tools/draft/data/selfinstruct-code tools/draft/data/selfinstruct"
online_stage "$RUN/train-si7" "$RUN/snaps-si7" "$RUN/stage7" --refit-vocab --skip-train-samples "$SI8_SKIP" \
  --max-train-samples "$SI8_ALL" --epochs 1 --max-steps "$S8_STEPS" --seed 6 --lr "$S8_LR"

echo "[18/20] bf16 copy of stage 8 (version 9): $RUN/stage8"
ship "$RUN/train-si7/best" "$RUN/stage8" "$RUN/train-si7/checkpoint/state.json"

echo "[19/20] stage 9: version 9 over two new steered builds, coding and general chat ($ONLINE_DTYPE; log: $RUN/train-si8.log)"
SI_DATA="tools/draft/data/selfinstruct-code tools/draft/data/selfinstruct-extract tools/draft/data/selfinstruct-stem tools/draft/data/selfinstruct-s1"
online_stage "$RUN/train-si8" "$RUN/snaps-si8" "$RUN/stage8" --skip-train-samples "$SI9_SKIP" \
  --max-train-samples "$SI9_ALL" --epochs 1 --max-steps "$S9_STEPS" --seed 8 --lr "$S9_LR"

echo "[20/20] offline evaluation on the held-out answers, stages 1-9"
for stage in stage1 stage2 stage3 stage4 stage5 stage6 stage7 stage8 train-si8/best; do
  for set in mtbench humaneval; do
    "$BIN/specwire" eval --draft "$RUN/$stage" --data "$RUN/eval-$set" --split all --json >"$RUN/eval-${stage%%/*}-$set.json"
  done
done
cat "$RUN"/eval-*.json
learning_curve "$RUN/train-si" "$RUN/snaps" learning-curve "self-instruct conversations seen (0: the stage-1 draft)"
learning_curve "$RUN/train-si2" "$RUN/snaps-si2" learning-curve-si2 "self-instruct conversations seen in stage 3 (0: version 3)"
learning_curve "$RUN/train-si3" "$RUN/snaps-si3" learning-curve-si3 "self-instruct conversations seen in stage 4 (0: version 4)"
learning_curve "$RUN/train-si4" "$RUN/snaps-si4" learning-curve-si4 "self-instruct conversations seen in stage 5 (0: version 5)"
learning_curve "$RUN/train-si5" "$RUN/snaps-si5" learning-curve-si5 "self-instruct conversations seen in stage 6 (0: version 6)"
learning_curve "$RUN/train-si6" "$RUN/snaps-si6" learning-curve-si6 "self-instruct conversations seen in stage 7 (0: version 7)"
learning_curve "$RUN/train-si7" "$RUN/snaps-si7" learning-curve-si7 "conversations seen in stage 8 (0: version 8, before its vocabulary refit)"
learning_curve "$RUN/train-si8" "$RUN/snaps-si8" learning-curve-si8 "conversations seen in stage 9 (0: version 9)"

echo "bf16 copy to ship: $RUN/ship (then: cp -r $RUN/ship src/specwire/assets/smollm2-135m-eagle3)"
ship "$RUN/train-si8/best" "$RUN/ship" "$RUN/train-si8/checkpoint/state.json"
