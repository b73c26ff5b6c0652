#!/usr/bin/env bash
# The GPU check (issue 43): on a machine with a CUDA GPU and the project installed (pip install -e ".[dev]"),
# in at most 10 minutes (each check has its limit; 6 minutes on an H200), everything asr does on a GPU that the CPU suite cannot reach:
#   1. the tests marked gpu (pytest -m gpu: varlen attention against SDPA, no host sync in a step, ...)
#   2. python -m asr.bench.gpu: the GPU presets' step time, x real time, memory and MFU (at 1000 s a step in bf16:
#      the figures asr.bench.presets.MEASURED_MFU holds; update it from this table)
#   3. a short bf16-mixed fit and a short 16-mixed fit of the default model on the bundled data, then a transcription
#   4. with 2+ GPUs: a few FSDP2 steps and a few DDP steps
# and prints one summary table. Each part has its own time limit, so a hang is a TIMEOUT row, not a stuck script.
# Exit status: 0 when every check passed, 1 when any failed or timed out, 2 without a CUDA GPU.
#   bash scripts/gpu_check.sh            # logs in gpu-check/ (GPU_CHECK_OUT=DIR to choose; PYTHON=... the interpreter)
set -u
cd "$(dirname "$0")/.."
out=${GPU_CHECK_OUT:-gpu-check}
mkdir -p "$out" 2>/dev/null
python=${PYTHON:-python}
rows=()
failed=0  # checks that failed or timed out

run() {  # run NAME SECONDS COMMAND...: time it, keep its log, add a row
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$? status=ok
  [ $rc -eq 124 ] && status="TIMEOUT (${limit} s)"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && status="FAIL (exit $rc)"
  [ $rc -ne 0 ] && failed=$((failed + 1))
  rows+=("| $name | $status | $((SECONDS - start)) | $(summary "$name") |")
}

summary() {  # the figure a row shows, from its log
  case $1 in
    tests) grep -aE "passed|failed|error" "$out/tests.log" | tail -1 ;;
    bench-*) grep -acE "^\| [a-z]" "$out/$1.log" | sed 's/$/ presets measured (table in the log)/' ;;
    fit-*) grep -aoE "train/loss[= ][0-9.]+" "$out/$1.log" | tail -1 ;;
    transcribe) grep -aoE "WER [0-9.]+" "$out/transcribe.log" | head -1 ;;
    *) tail -c 120 "$out/$1.log" | tr '\n' ' ' ;;
  esac
}

gpus=$($python -c "import torch; print(torch.cuda.device_count())")
if [ "${gpus:-0}" -lt 1 ]; then echo "gpu_check: no CUDA GPU here (torch.cuda.device_count() = ${gpus:-?})"; exit 2; fi
$python -c "import torch; p = torch.cuda.get_device_properties(0); print(f'{torch.cuda.device_count()} x {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, CUDA {torch.version.cuda}')" | tee "$out/device.txt"

fit=(-m asr.fit --trainer.accelerator gpu --trainer.devices 1 --trainer.max_steps 150
     --test false --trainer.logger.init_args.save_dir "$out/runs")
run tests 120 $python -m pytest -q -m gpu tests
run bench-bf16 150 $python -m asr.bench.gpu --precision bf16-mixed --batch_seconds 1000  # asr.bench.presets.MEASURED_MFU's batch
run bench-fp16 50 $python -m asr.bench.gpu --precision 16-mixed --presets conformer-large xl
run fit-bf16 100 $python "${fit[@]}" --trainer.precision bf16-mixed --trainer.logger.init_args.name bf16
run fit-fp16 100 $python "${fit[@]}" --trainer.precision 16-mixed --trainer.logger.init_args.name fp16
last=$(ls -d "$out"/runs/bf16/version_*/checkpoints 2>/dev/null | tail -1)/last.ckpt
run transcribe 30 $python -m asr.transcribe --device cuda --checkpoint "$last" data/mini/test.jsonl
if [ "$gpus" -ge 2 ]; then
  multi=(-m asr.fit --trainer.accelerator gpu --trainer.devices 2 --trainer.max_steps 5 --test false
         --trainer.logger.init_args.save_dir "$out/runs" --config configs/model/conformer-large.yaml)
  run fsdp2-steps 60 $python "${multi[@]}" --config configs/strategy/fsdp.yaml --trainer.logger.init_args.name fsdp
  run ddp-steps 45 $python "${multi[@]}" --config configs/strategy/ddp.yaml --trainer.logger.init_args.name ddp
else
  rows+=("| fsdp2-steps, ddp-steps | skipped: one GPU | 0 | |")
fi

echo
echo "| check | status | seconds | figure |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
cat "$out"/bench-*.log | grep -a "^|" | sort -u | grep -v "^| preset\|^|---" | sed 's/^/bench: /'
if [ "$failed" -gt 0 ]; then echo "gpu_check: $failed checks failed (logs in $out/)"; exit 1; fi
