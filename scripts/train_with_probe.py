"""A real small training loop, instrumented with the probe: is it waiting for its data?

    python scripts/train_with_probe.py --num-workers 0 8 --output-prefix results/probe_story_cpu

The built-in TransformerLM (2 layers, d_model 64, byte-level, context 128) trained with AdamW
on items from loader_bench's simulated store, which sleeps `--latency-ms` per item as a remote
archive or a cold cache would. One run per --num-workers value; each is the user's own loop
with the probe's three lines added. The story (loader_bench's "enough workers"): without
workers the loop waits for its data more than 20% of the time (input-bound); with enough
workers, less than 5%. Writes PREFIX.csv and PREFIX.jsonl (every run's windows; raw per-step
times in the JSONL) and PREFIX.md (the runs, their advice and the checks).
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from cs336_bench.argtypes import ArgumentParser, non_negative_float, non_negative_int, positive_int
from cs336_bench.latency_model import LatencyModel
from cs336_bench.loader_bench import BenchConfig, EpochSampler, LoaderConfig, StoreDataset, make_loader
from cs336_bench.models import ModelConfig, TransformerLM
from cs336_bench.probe import StepProbe
from cs336_bench.results.writing import write_whole

PROG = "python scripts/train_with_probe.py"
INPUT_BOUND_TARGET_PCT = 20.0
NOT_INPUT_BOUND_TARGET_PCT = 5.0


def train(num_workers: int, args, outputs: list[Path], lines: list[str]) -> StepProbe:
    torch.manual_seed(args.seed)
    context = args.context_length
    config = ModelConfig(d_model=64, d_ff=256, num_layers=2, num_heads=4, vocab_size=256, context_length=context)
    model = TransformerLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    bench = BenchConfig(
        storage="simulated",
        num_items=args.steps * args.batch_size,
        item_bytes=context + 1,
        batch_size=args.batch_size,
        model=LatencyModel(latency_ms=args.latency_ms, seed=args.seed),
    )
    sampler = EpochSampler(range(bench.num_items), args.seed, tag_epoch=True)
    prefetch = 2 if num_workers else None
    loader = make_loader(StoreDataset(bench), sampler, bench, LoaderConfig(num_workers, prefetch), pin=False)

    def report(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        lines.append(line)

    # -- the user's loop; the probe's lines are marked --
    probe = StepProbe(
        device="cpu",
        outputs=outputs,
        window=args.window,
        label=f"num_workers={num_workers}",
        model=model,
        print_fn=report,
    )  # probe
    with probe:  # probe
        for batch in probe.loader(loader):  # probe
            tokens = batch.long()
            with probe.phase("forward"):  # probe
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), tokens[:, 1:].reshape(-1))
            with probe.phase("backward"):  # probe
                loss.backward()
            with probe.phase("optimizer"):  # probe
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            probe.step()  # probe
    return probe


def wait_pct(probe: StepProbe, skip_first: bool) -> float:
    """Data wait % over the run's steps; the first step waits for worker start-up and a whole
    first fetch, which the steady state (and the probe's advice) leave out."""
    steps = probe.steps[1:] if skip_first else probe.steps
    return 100 * sum(s.wait_ms for s in steps) / sum(s.wall_ms for s in steps)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--num-workers", type=non_negative_int, nargs="+", default=[0, 8], metavar="N")
    parser.add_argument("--steps", type=positive_int, default=80, help="steps per run, one epoch (80)")
    parser.add_argument("--window", type=positive_int, default=20, help="steps per probe window (20)")
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--context-length", type=positive_int, default=128)
    parser.add_argument("--latency-ms", type=non_negative_float, default=10.0, help="per item (10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-prefix", default="results/probe_story_cpu", help="PREFIX.{csv,jsonl,md}")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    prefix = Path(args.output_prefix)
    if prefix.suffix:
        parser.error(f"--output-prefix {prefix} must not have a suffix (.csv, .jsonl and .md are added)")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for suffix in (".csv", ".jsonl", ".md"):
        prefix.with_suffix(suffix).unlink(missing_ok=True)
    # torch warns above 2 workers on 2 cores; these workers sleep (latency), they do not compute
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    torch.set_num_threads(1)  # leave the other core to the loader's workers, as a GPU job would
    runs = []
    for workers in args.num_workers:
        lines: list[str] = []
        probe = train(workers, args, [prefix.with_suffix(".csv"), prefix.with_suffix(".jsonl")], lines)
        runs.append((workers, probe, lines))
    checks = []
    if 0 in args.num_workers and any(w > 0 for w in args.num_workers):
        without = next(p for w, p, _ in runs if w == 0)
        most, enough = max((w, p) for w, p, _ in runs)
        wait0, wait_n = wait_pct(without, skip_first=True), wait_pct(enough, skip_first=True)
        checks = [
            (
                "data wait % with 0 workers (steps 2-)",
                wait0,
                f"> {INPUT_BOUND_TARGET_PCT:g}",
                wait0 > INPUT_BOUND_TARGET_PCT,
            ),
            (
                f"data wait % with {most} workers (steps 2-)",
                wait_n,
                f"< {NOT_INPUT_BOUND_TARGET_PCT:g}",
                wait_n < NOT_INPUT_BOUND_TARGET_PCT,
            ),
        ]
    command = f"PYTHONPATH=$PWD {PROG} {shlex.join(argv)}".rstrip()
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    parts = [
        "# The probe in a real training loop (CPU)",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Load average when it finished (1, 5, 15 min; {os.cpu_count()} cores): {load}.",
        "",
        "Data wait over each run after its first step (the first waits for worker start-up and a whole "
        "fetch; whole run: " + ", ".join(f"{w} workers {wait_pct(p, False):.1f}%" for w, p, _ in runs) + "):",
        "",
        "| check | measured | target | passed |",
        "|---|---|---|---|",
        *(f"| {name} | {value:.1f} | {target} | {str(ok).lower()} |" for name, value, target, ok in checks),
        "",
    ]
    for workers, probe, lines in runs:
        parts += [f"## num_workers={workers}", "", "```", *lines, "```", "", probe.markdown().split("\n", 2)[2]]
    write_whole(prefix.with_suffix(".md"), "\n".join(parts))
    for name, value, target, ok in checks:
        print(f"{name}: {value:.1f} (target {target}): {'passed' if ok else 'FAILED'}", file=sys.stderr)
    print(f"wrote {prefix}.csv, {prefix}.jsonl, {prefix}.md", file=sys.stderr)
    return 0 if all(ok for *_, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
