#!/usr/bin/env bash
# GPU checks run on a lent H100/H200 (device tool): bash scripts/gpu_session.sh PART
# Results go to $OUT (or results/ when $OUT is unset); each stage has its own time limit so
# one slow stage cannot cost the others.
set -u
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
out="${OUT:-results}"
py=python3
stage() { local limit=$1; shift; echo "=== $* (limit ${limit}s)"; timeout "$limit" "$@"; echo "=== exit $?"; }

case "${1:-}" in
  core)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
    $py -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
    stage 330 $py -m cs336_systems.benchmark_direct --model-sizes small medium large xl 2.7B \
      --context-lengths 128 256 512 1024 --precisions fp32 bf16 --pass-types forward forward-backward \
      --output "$out/gpu_sweep_h100.csv" --output "$out/gpu_sweep_h100.md"
    stage 150 $py scripts/memory_accuracy.py --device cuda --output-dir "$out"
    stage 60 $py scripts/bench_timing.py --device cuda --output-dir "$out"
    stage 90 $py -m pytest -q tests/test_gpu.py 2>&1 | tail -25
    ;;
  attention)
    # issue 8: about 3.5 minutes on an H100 (the 16384-long naive/compiled rows dominate;
    # --max-seconds 5 bounds each timed loop).
    stage 60 $py -m cs336_systems.mixed_precision --device cuda | tee "$out/mixed_precision_cuda.txt"
    stage 120 $py -m pytest -q tests/test_attention_gpu.py tests/test_nvtx.py 2>&1 | tail -15
    stage 240 $py -m cs336_systems.attention_bench --device cuda --head-dims 16 128 --seq-lens 256 1024 4096 16384 \
      --batch-size 8 --steps 100 --max-seconds 5 --implementations naive sdpa compiled \
      --output "$out/attention_h100.csv" --output "$out/attention_h100.md" --output "$out/attention_h100.jsonl"
    ;;
  *) echo "usage: $0 core|attention" >&2; exit 2 ;;
esac
