#!/usr/bin/env bash
# Regenerate every committed CPU result at one commit: the tools' results in results/, the
# harness's self-checks in results/checks/, and the write-up in writeup/ (last, from them), one
# stage after another on a quiet machine (nothing else running: these are timings; the docs quote
# them, so update the figures there after a run).
#
#   bash scripts/dev/cpu_results.sh            # all stages, about an hour on 2 cores
#   bash scripts/dev/cpu_results.sh sweep ddp  # only the stages named
#   bash scripts/dev/cpu_results.sh --list     # the stages
#
# Each stage removes its old files first (the tools never overwrite a result file).
# Not here: results/gpu_sweep_h100.* and results/checks/*_cuda.* (scripts/dev/gpu_session.sh on a GPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python}
r=results
c=results/checks
all_stages=(stability timing model memory probe_overhead bad_inputs sweep cap find_max warmup allreduce ddp
  ddp_strategies multinode input monitor probe attention flash precision writeup h100)
# writeup_report (not in the list above): the write-up made again from writeup/2026's own plan and rows,
# nothing measured, after a change to report/
if [ "${1:-}" = "--list" ]; then
  echo "${all_stages[*]}"
  exit 0
fi
if ! git diff --quiet HEAD -- . ":(exclude)results" ":(exclude)writeup" 2>/dev/null; then
  echo "note: the code has uncommitted changes; rows will say git_dirty=true" >&2
fi

failed=()
# `with_load COMMAND...`: the command, with the machine's load before and after it in results/multinode_gloo_cpu.txt
with_load() {
  { echo "\$ $*"; echo "before: $(uptime)"; } >>$r/multinode_gloo_cpu.txt
  local status=0
  "$@" || status=$?
  echo "after:  $(uptime) (exit $status)" >>$r/multinode_gloo_cpu.txt
  return $status
}
# A stage that fails (a script whose target was missed exits 1) is reported and the next runs.
stage() {
  local name=$1
  shift
  echo "=== $name: $*" >&2
  local start=$SECONDS status=0
  "$@" || status=$?
  echo "=== $name took $((SECONDS - start)) s (exit $status)" >&2
  [ "$status" -eq 0 ] || failed+=("$name")
}

run_stage() {
  case "$1" in
    stability) stage stability $py scripts/checks/cpu_stability.py --seconds 30 --output $c/cpu_stability.md ;;
    timing) stage timing $py scripts/checks/bench_timing.py --device cpu --output-dir $c ;;
    model) stage model $py scripts/checks/bench_model.py --device cpu --output-dir $c ;;
    memory) stage memory $py scripts/checks/memory_accuracy.py --device cpu --output-dir $c ;;
    probe_overhead)
      rm -f $c/probe_overhead_cpu.csv $c/probe_overhead_cpu.md
      stage probe_overhead $py scripts/checks/bench_probe_overhead.py --output $c/probe_overhead_cpu.csv --output $c/probe_overhead_cpu.md
      ;;
    bad_inputs) stage bad_inputs $py scripts/checks/bad_inputs.py --output $c/bad_inputs.md ;;
    sweep)
      # twice, one run after the other: cpu_sweep_earlier is the baseline of the docs' compare example
      for name in cpu_sweep_earlier cpu_sweep; do
        rm -f $r/$name.csv $r/$name.jsonl $r/$name.md
        stage $name $py -m cs336_systems.benchmark_direct --model-sizes small medium --context-lengths 64 128 256 \
          --precisions fp32 bf16 --pass-types forward forward-backward --warmup-steps 2 --measure-steps 5 \
          --output $r/$name.csv --output $r/$name.jsonl --output $r/$name.md
      done
      ;;
    cap)
      rm -f $r/cpu_sweep_4gib.csv $r/cpu_sweep_4gib.jsonl $r/cpu_sweep_4gib.md
      stage cap $py -m cs336_systems.run_benchmarks --model-sizes small medium --context-lengths 64 \
        --pass-types train-step --memory-limit 4GiB --timeout 600 --warmup-steps 2 --measure-steps 5 \
        --output $r/cpu_sweep_4gib.csv --output $r/cpu_sweep_4gib.jsonl --output $r/cpu_sweep_4gib.md
      ;;
    find_max)
      rm -f $r/find_max_cpu_4gib.csv $r/find_max_cpu_4gib.json
      # the allocator-level prediction; the cap counts address space, glibc's retained arenas too
      $py -m cs336_systems.memory --model-size small --context-length 128 --pass-type train-step \
        --find-max batch-size --device-memory 4GiB --device-type cpu | tail -1
      stage find_max $py -m cs336_systems.find_max --dimension batch-size --model-size small --context-length 128 \
        --pass-type train-step --memory-limit 4GiB --warmup-steps 1 --measure-steps 1 --start 4 \
        --output $r/find_max_cpu_4gib.csv
      ;;
    warmup) stage warmup $py -m cs336_bench.warmup_study --output-dir $r ;;
    allreduce)
      rm -f $r/allreduce_gloo_cpu.csv $r/allreduce_gloo_cpu.jsonl $r/allreduce_gloo_cpu.md $r/allreduce_gloo_cpu.png
      stage allreduce $py -m cs336_systems.allreduce_bench --backend gloo --world-sizes 2 4 6 \
        --sizes 1MB 10MB 100MB 1GB --output $r/allreduce_gloo_cpu.csv --output $r/allreduce_gloo_cpu.jsonl \
        --output $r/allreduce_gloo_cpu.md --plot $r/allreduce_gloo_cpu.png
      ;;
    ddp)
      rm -f $r/ddp_gloo_cpu.csv $r/ddp_gloo_cpu.jsonl $r/ddp_gloo_cpu.md
      stage ddp $py -m cs336_systems.ddp_bench --backend gloo --world-sizes 1 2 --strategies ddp naive \
        --bucket-cap-mb 1 25 --d-model 256 --d-ff 1024 --num-layers 4 --num-heads 4 --context-length 128 \
        --batch-size 4 --output $r/ddp_gloo_cpu.csv --output $r/ddp_gloo_cpu.jsonl --output $r/ddp_gloo_cpu.md
      stage concurrent_matmul bash -o pipefail -c \
        "$py scripts/checks/concurrent_matmul.py --processes 2 --trials 3 | tee $c/concurrent_matmul_cpu.txt"
      ;;
    multinode)
      # one Slurm job over 2 emulated hosts (scripts/dev/slurm_cluster.sh, as root), their links limited to
      # 200 Mbit/s then 1 Gbit/s; the emulated nodes are removed after (the one-node cluster stays)
      rm -f $r/multinode_*.csv $r/multinode_*.jsonl $r/multinode_*.md $r/multinode_gloo_cpu.txt
      local job=(--backend gloo --executor slurm --slurm-nodes 2 --slurm-partition multi --job-dir /tmp/cs336-multinode.jobs)
      for rate in 200mbit 1gbit; do
        bash scripts/dev/slurm_cluster.sh start --nodes 2 --link-rate $rate
        echo "# links at $rate: bash scripts/dev/slurm_cluster.sh start --nodes 2 --link-rate $rate" >>$r/multinode_gloo_cpu.txt
        local a=$r/multinode_allreduce_$rate d=$r/multinode_ddp_$rate
        stage multinode_allreduce_$rate with_load $py -m cs336_systems.allreduce_bench "${job[@]}" \
          --sizes 1MB 16MB 64MB 256MB --warmup-steps 2 --measure-steps 10 --output $a.csv --output $a.jsonl --output $a.md
        stage multinode_ddp_$rate with_load $py -m cs336_systems.ddp_bench "${job[@]}" --strategies ddp naive flat \
          --d-model 256 --d-ff 1024 --num-layers 4 --num-heads 4 --context-length 128 --batch-size 4 \
          --warmup-steps 2 --measure-steps 5 --output $d.csv --output $d.jsonl --output $d.md
      done
      bash scripts/dev/slurm_cluster.sh remove-nodes
      ;;
    ddp_strategies)
      rm -f $r/ddp_strategies_cpu.csv $r/ddp_strategies_cpu.jsonl $r/ddp_strategies_cpu.md
      stage ddp_strategies $py -m cs336_systems.ddp_bench --backend gloo --world-sizes 2 --strategies ddp naive flat \
        zero1 fsdp2 adapter-ddp adapter-ddp-bucketed adapter-sharded-optimizer adapter-fsdp \
        --adapters tests/fixtures/adapters_student.py --d-model 256 --d-ff 1024 --num-layers 4 --num-heads 4 \
        --context-length 128 --batch-size 4 --warmup-steps 2 --measure-steps 5 --output $r/ddp_strategies_cpu.csv \
        --output $r/ddp_strategies_cpu.md --output $r/ddp_strategies_cpu.jsonl
      ;;
    input) stage input $py scripts/input_pipeline_stories.py --device cpu --output-dir $r ;;
    monitor)
      rm -f $r/monitor_captioning_cpu.csv $r/monitor_captioning_cpu.json $r/monitor_captioning_cpu.png
      stage monitor $py -m cs336_systems.monitor --interval 0.25 --output $r/monitor_captioning_cpu.csv -- \
        $py -m cs336_systems.loader_bench --storage http --item-bytes 500KB --latency-ms 100 --bandwidth 20MB \
        --num-items 36 --batch-size 1 --compute-ms 10 --epochs 1 --num-workers 0 --processes 1 3
      ;;
    probe)
      rm -f $r/probe_story_cpu.csv $r/probe_story_cpu.jsonl $r/probe_story_cpu.md
      stage probe $py scripts/train_with_probe.py --output-prefix $r/probe_story_cpu
      ;;
    attention)
      rm -f $r/attention_cpu.csv $r/attention_cpu.jsonl $r/attention_cpu.md $r/attention_cpu.png
      stage attention $py -m cs336_systems.attention_bench --device cpu --head-dims 16 64 \
        --context-lengths 256 1024 4096 16384 --batch-size 8 --measure-steps 20 --max-seconds 3 \
        --implementations naive sdpa compiled \
        --output $r/attention_cpu.csv --output $r/attention_cpu.jsonl --output $r/attention_cpu.md
      ;;
    flash)
      rm -f $r/flash_cpu.csv $r/flash_cpu.md $r/flash_cpu.png
      stage flash env OMP_NUM_THREADS=1 $py -m cs336_systems.attention_bench --device cpu \
        --adapters tests/fixtures/adapters_student.py --implementations naive sdpa flash-pytorch --head-dims 64 \
        --context-lengths 128 256 512 1024 2048 --precisions fp32 --warmup-steps 2 --measure-steps 10 \
        --output $r/flash_cpu.csv --output $r/flash_cpu.md
      ;;
    precision)
      stage precision bash -o pipefail -c "$py -m cs336_systems.mixed_precision --device cpu | tee $r/mixed_precision_cpu.txt"
      ;;
    writeup)
      # the write-up a student hands in, as `handout` writes it at the small scale on this CPU, run as a
      # student would: from a copy of the student-shaped repository in tests/fixtures/, into its default
      # output directory (so the commands it shows are the student's); its logs and done markers are not
      # committed. tests/test_committed_results.py checks it verifies and is what `report` makes from its plan.
      rm -rf writeup/2026 && mkdir -p writeup
      student=$(mktemp -d)
      cp -r tests/fixtures/student_repo/. "$student"
      stage writeup bash -c "cd '$student' && $py -m cs336_bench handout --edition 2026 --scale small \
        --device cpu --adapters tests/adapters.py"
      cp -r "$student"/results/handout-2026-* writeup/2026 && rm -rf "$student"  # named after the CPU
      rm -rf writeup/2026/logs writeup/2026/.handout writeup/2026/.cs336-bench.sha256 writeup/2026/*.tex writeup/2026/*.typ
      # the tools' own pages and plots are not the write-up's: only what writeup.md shows, and the rows
      for f in writeup/2026/*.md writeup/2026/*.png; do
        name=$(basename "$f")
        [ "$name" = writeup.md ] || grep -q "($name)" writeup/2026/writeup.md || rm -f "$f"
      done
      ;;
    writeup_report)
      # handout writes beside a write-up it did not record as its own (a student's edits are kept): record it
      (cd writeup/2026 && sha256sum writeup.md >.cs336-bench.sha256)
      stage writeup_report $py -m cs336_bench handout --write-up --output-dir writeup/2026
      rm -rf writeup/2026/.handout writeup/2026/.cs336-bench.sha256 writeup/2026/*.tex writeup/2026/*.typ
      ;;
    h100)
      # the H100 sweep of an earlier commit, reported as it is beside the write-up
      # and why its bf16 rows look broken: each step's operators against its time (scripts/launch_floor.py)
      rm -rf writeup/h100 && mkdir -p writeup/h100
      stage launches $py scripts/launch_floor.py --results $r/gpu_sweep_h100.csv --output-dir writeup/h100 \
        --summary writeup/h100/launches.txt
      stage h100 $py -m cs336_systems.report $r/gpu_sweep_h100.csv --output writeup/h100/report.md \
        --output writeup/h100/report.pdf --note "$(cat writeup/h100/launches.txt)"
      rm -f writeup/h100/.cs336-bench.sha256
      ;;
    *) echo "scripts/dev/cpu_results.sh: error: unknown stage '$1'" >&2; exit 2 ;;
  esac
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=("${all_stages[@]}")
for name in "${stages[@]}"; do
  run_stage "$name"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "scripts/dev/cpu_results.sh: failed stages: ${failed[*]}" >&2
  exit 1
fi
