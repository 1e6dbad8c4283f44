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
  input)
    # monitor (NVML columns) and loader_bench (CUDA events, pinned non_blocking copies, the GPU spin stand-in)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    stage 90 $py -m pytest -q tests/test_monitor.py tests/test_loader_bench.py -k "gpu or nvml or events or 500mb" 2>&1 | tail -15
    stage 60 $py -m cs336_systems.loader_bench --device cuda --storage simulated --latency-ms 1 --item-bytes 2MiB \
      --num-items 256 --batch-size 16 --compute-ms 15 --epochs 2 --num-workers 0 4 --pin-memory false true \
      --output "$out/loader_gpu.csv" --output "$out/loader_gpu.md" --monitor "$out/loader_gpu_monitor.csv" --monitor-interval 0.2
    stage 60 $py -m cs336_systems.monitor --interval 0.2 --output "$out/monitor_gpu_benchmark.csv" -- \
      $py -m cs336_systems.benchmark --model-size small --context-length 512 --device cuda --warmup-steps 3 --measure-steps 40
    ;;
  *) echo "usage: $0 core|input" >&2; exit 2 ;;
esac
