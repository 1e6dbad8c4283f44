"""`gpu_session.sh first --collect DIR...`: the archives of one or more `first` calls into
results/gpu/<gpu>/, then the summary beside them (README.md) and the manual's page docs/gpu.md,
both made from those files alone (`--summarize results/gpu/<gpu>` makes them again).

A later DIR's file replaces an earlier DIR's file of the same stage and name, so a second call that
re-ran some stages completes the first. Each stage keeps its run.json (the commit, the commands and
their statuses); the rows carry their own environment record.
"""

from __future__ import annotations

import json
import re
import shutil
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "gpu"
DOCS_PAGE = REPO / "docs" / "gpu.md"
MFU_TARGET, CV_TARGET, BUSY_TARGET, MATMUL_TARGET = 0.55, 2.0, 90.0, 0.50


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3': the folder of that card's results."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower().removeprefix("nvidia").strip()).strip("-") or "gpu"


def unpack(dirs: list[Path], into: Path) -> None:
    """Each DIR's <n>-<stage>.tgz into `into`/<stage>/, and its log as logs/first-<k>.log. A file and
    its twins of the same stem (.csv/.jsonl/.png, .xml/.txt) are one result: a later DIR's result
    replaces the earlier one whole, and an earlier result the later DIR did not make stays."""
    for k, folder in enumerate(dirs, 1):
        for archive in sorted(folder.glob("*.tgz")):
            with tarfile.open(archive) as tar:
                members = [m for m in tar.getmembers() if m.isfile()]
                files = {}
                for member in members:
                    parts = Path(member.name).parts
                    if len(parts) < 2 or ".." in parts or Path(member.name).is_absolute():
                        continue
                    stage = re.sub(r"^\d+-", "", parts[0])  # the first call's archives were numbered
                    files[into / stage / Path(*parts[1:])] = member
                for target in files:
                    for older in target.parent.glob(f"{target.stem}.*") if target.parent.is_dir() else []:
                        older.unlink()
                for target, member in files.items():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(member).read())
        if (folder / "first.log").is_file():
            (into / "logs").mkdir(exist_ok=True)
            shutil.copyfile(folder / "first.log", into / "logs" / f"first-{k}.log")


def collect(dirs: list[Path]) -> int:
    missing = [str(d) for d in dirs if not any(d.glob("*.tgz"))]
    if missing:
        print(f"first --collect: no stage archives (*.tgz) in {', '.join(missing)}", file=__import__("sys").stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        staging = Path(scratch)
        unpack(dirs, staging)
        versions = staging / "environment" / "versions.json"
        name = json.loads(versions.read_text()).get("gpu") if versions.is_file() else None
        destination = RESULTS / gpu_slug(name or "gpu")
        destination.mkdir(parents=True, exist_ok=True)
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                target = destination / path.relative_to(staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
    write_summaries(destination)
    print(f"wrote {destination.relative_to(REPO)}/ and {DOCS_PAGE.relative_to(REPO)}")
    return 0


def write_summaries(folder: Path) -> None:
    (folder / "README.md").write_text(summary(folder, link=""))
    DOCS_PAGE.write_text(docs_page())


def docs_page() -> str:
    """The manual's page: every collected card's summary, one section each."""
    cards = sorted(p for p in RESULTS.iterdir() if (p / "README.md").is_file()) if RESULTS.is_dir() else []
    sections = [f"## {card.name}\n\n" + summary(card, link=f"results/gpu/{card.name}/", depth=3) for card in cards]
    return DOCS_HEAD + "\n".join(sections)


DOCS_HEAD = """# Measured on a GPU

`bash scripts/dev/gpu_session.sh first` runs the project's prepared stages on a GPU in one call of
at most 6 minutes (a lent machine's start-up, the call and one re-run fit 15 minutes); `first
--collect` packs what it wrote into `results/gpu/<gpu>/` and makes this page from those files (every
figure below is one row of them, with its file). `first --dry-run` runs the same stages with tiny
shapes on a CPU, in CI, so a flag renamed since cannot wait for the next GPU.

"""


def _rows(path: Path) -> pd.DataFrame:
    return pd.read_csv(path) if path.is_file() else pd.DataFrame()


def _num(value, digits: int = 1) -> str:
    return "" if value is None or pd.isna(value) else f"{value:,.{digits}f}"


def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: text.rfind(" ", 0, width)] + " ..."


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"] if "status" in frame else frame


def _commits(folder: Path) -> list[str]:
    lines = []
    for run in sorted(folder.glob("*/run.json")):
        info = json.loads(run.read_text())
        lines.append(f"`{info['stage']}` at {info['commit'][:7]} ({info['finished_at']}, {info['seconds']:.0f} s)")
    for stage in sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "logs"):
        if not (stage / "run.json").is_file():
            commits = {c for csv in stage.glob("*.csv") for c in _rows(csv).get("git_commit", pd.Series()).dropna()}
            lines.append(f"`{stage.name}` at {', '.join(sorted(c[:7] for c in commits)) or 'unknown'}")
    return lines


def machine(folder: Path) -> list[str]:
    versions = folder / "environment" / "versions.json"
    if not versions.is_file():
        return ["No environment stage was collected."]
    info = json.loads(versions.read_text())
    smi = info.get("nvidia_smi", "").splitlines()
    driver = smi[1].split(", ")[2] if len(smi) > 1 and len(smi[1].split(", ")) > 2 else "?"
    lines = [
        f"{info.get('gpu')} ({info.get('gpu_memory_bytes', 0) / 2**30:.0f} GiB, {info.get('multiprocessors')} SMs), "
        f"driver {driver}, torch {info.get('torch')}, CUDA {info.get('cuda')}, Triton {info.get('triton')}, "
        f"Python {info.get('python')}."
    ]
    check = folder / "environment" / "gpu_selfcheck.md"
    if check.is_file():
        rate = re.search(r"bf16 matmul on .*", check.read_text())
        if rate:
            lines.append(f"Self-check: {rate.group(0).strip()} (`environment/gpu_selfcheck.md`).")
    return lines


def gpu_tests(folder: Path) -> str:
    junit = next((p for p in (folder / s / "gpu_tests.xml" for s in ("gpu_tests", "environment")) if p.is_file()), None)
    if junit is not None:
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        failed = [
            case.get("name")
            for case in suite.iter("testcase")
            if case.find("failure") is not None or case.find("error") is not None
        ]
        passed = int(suite.get("tests", 0)) - len(failed) - int(suite.get("skipped", 0))
        return f"GPU-only tests: {passed} passed, {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else "")
    log = next((p for p in (folder / s / "gpu_tests.txt" for s in ("gpu_tests", "environment")) if p.is_file()), None)
    if log is not None:
        text = log.read_text()
        marks = re.findall(r"^[.FEsx]+", text, re.M)
        done = "".join(marks)
        return (
            f"GPU-only tests: the run was stopped at its limit after {len(done)} tests "
            f"({done.count('.')} passed, {done.count('F') + done.count('E')} failed); no summary was written."
        )
    return "GPU-only tests: not run."


def all_rows(folder: Path) -> pd.DataFrame:
    """Every benchmark row collected for the card (the attention and distributed files have no MFU)."""
    frames = [
        _rows(p).assign(file=p.relative_to(folder).as_posix())
        for p in sorted(folder.glob("*/*.csv"))
        if p.parent.name in ("fast_path", "precision", "precision_eager", "extras") and "mfu" in _rows(p)
    ]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def replayed_targets(folder: Path) -> list[str]:
    """The matmul probe, CV or a measured cause on every replayed row, tf32 rows, a CUDA-graph row."""
    from cs336_bench.anomalies import NOISY_MIN_STEPS, flag_noisy_gpu_steps

    lines = []
    check = folder / "environment" / "gpu_selfcheck.md"
    share = (
        re.search(r"= (\d+)% of the ([\d.]+) TFLOP/s spec-sheet peak", check.read_text()) if check.is_file() else None
    )
    if share:
        met = int(share.group(1)) >= 100 * MATMUL_TARGET
        lines.append(
            f"| bf16 matmul probe >= {MATMUL_TARGET:.0%} of the spec sheet | {share.group(1)}% of "
            f"{share.group(2)} TFLOP/s (`environment/gpu_selfcheck.md`) | {'yes' if met else 'no'} |"
        )
    rows = all_rows(folder)
    if not len(rows):
        return lines
    records = rows.to_dict("records")
    replayed = [
        r
        for r in records
        if r.get("status") == "ok"
        and (r.get("compile") is True or r.get("cuda_graphs") is True)
        and (r.get("measure_steps") or 0) >= NOISY_MIN_STEPS
    ]
    noisy = flag_noisy_gpu_steps(replayed)
    unexplained = [replayed[i]["file"] for i, why in noisy.items() if "host-bound" not in why]
    if replayed:
        lines.append(
            f"| every compiled or CUDA-graph row of {NOISY_MIN_STEPS}+ steps at CV <= {CV_TARGET:g}% or host-bound | "
            f"{len(replayed) - len(noisy)} of {len(replayed)} at CV <= {CV_TARGET:g}%, "
            f"{len(noisy) - len(unexplained)} marked host-bound | "
            f"{'yes' if not unexplained else 'no: ' + ', '.join(sorted(set(unexplained)))} |"
        )
    tf32 = [r for r in records if r.get("precision") == "tf32" and r.get("status") == "ok"]
    lines.append(f"| tf32 rows | {len(tf32)} ok | {'yes' if tf32 else 'no'} |")
    graphs = [r for r in records if r.get("cuda_graphs") is True]
    if graphs:
        ok = [r for r in graphs if r.get("status") == "ok"]
        lines.append(
            f"| an ok CUDA-graph row | {len(ok)} of {len(graphs)} ok"
            + (f" ({ok[0]['median_ms']:.1f} ms, `{ok[0]['file']}`)" if ok else "")
            + f" | {'yes' if ok else 'no'} |"
        )
    return lines


def targets(folder: Path) -> list[str]:
    """The campaign's targets, each with the measured figure and the row it comes from."""
    fast = pd.concat(
        [_rows(p).assign(file=f"fast_path/{p.name}") for p in sorted(folder.glob("fast_path/*.csv"))], ignore_index=True
    )
    fast = _ok(fast) if len(fast) else fast
    compiled = fast[fast["compile"] == True] if len(fast) else fast  # noqa: E712  (a CSV column of booleans)
    lines = ["| target | measured | met |", "|---|---|---|"]
    if len(compiled):
        best = compiled.loc[compiled["mfu"].idxmax()]
        tokens = int(best["batch_size"] * best["context_length"] * (best["grad_accum_steps"] or 1))
        lines.append(
            f"| 2.7B bf16 train-step MFU >= {MFU_TARGET:.0%} | {best['mfu']:.1%} (batch {int(best['batch_size'])} x "
            f"{int(best['grad_accum_steps'])} micro-batches, {tokens:,} tokens a step, {best['median_ms']:.0f} ms; "
            f"`{best['file']}`) | {'yes' if best['mfu'] >= MFU_TARGET else 'no'} |"
        )
        worst_cv = compiled.loc[compiled["cv_pct"].idxmax()]
        lines.append(
            f"| CV <= {CV_TARGET:g}% on every fast-path row | at most {worst_cv['cv_pct']:.2f}% over "
            f"{len(compiled)} rows | {'yes' if worst_cv['cv_pct'] <= CV_TARGET else 'no'} |"
        )
        least = compiled["device_busy_pct"].min()
        lines.append(
            f"| GPU busy >= {BUSY_TARGET:g}% on the fast path | at least {least:.1f}% | "
            f"{'yes' if least >= BUSY_TARGET else 'no'} |"
        )
    lines += replayed_targets(folder)
    bf16, fp32 = _ok(_rows(folder / "precision/best_bf16.csv")), _ok(_rows(folder / "precision/best_fp32.csv"))
    if len(bf16) and len(fp32):
        both = bf16.merge(fp32, on="model_size", suffixes=("_bf16", "_fp32"))
        # slower only where the two rows' spreads do not overlap (bf16's p10 above fp32's p90)
        slower = both[both["p10_ms_bf16"] > both["p90_ms_fp32"]]
        ratio = (both["median_ms_fp32"] / both["median_ms_bf16"]).agg(["min", "max"])
        lines.append(
            f"| no size slower in bf16 than fp32 on the best path | bf16 {ratio['min']:.1f}x to {ratio['max']:.1f}x "
            f"faster over {len(both)} sizes | {'yes' if slower.empty else 'no: ' + ', '.join(slower['model_size'])} |"
        )
    return lines


def table(frame: pd.DataFrame, columns: dict[str, str], digits: dict[str, int] | None = None) -> list[str]:
    digits = digits or {}
    shown = [c for c in columns if c in frame]
    lines = ["| " + " | ".join(columns[c] for c in shown) + " |", "|" + "---|" * len(shown)]
    for _, row in frame.iterrows():
        cells = []
        for c in shown:
            value = row[c]
            if isinstance(value, float) and c in digits:
                cells.append(_num(value, digits[c]))
            else:
                cells.append("" if pd.isna(value) else str(value).replace("|", "/"))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(folder: Path, link: str, depth: int = 2) -> str:
    """The card's figures as Markdown; `depth`: the level of its section headings (2 under a title)."""
    h = "#" * (depth - 1)
    out = [f"# {folder.name}: measured on a GPU", ""] if depth == 2 else []
    out += [f"{h}# The machine", "", *machine(folder), "", gpu_tests(folder), ""]
    if (folder / "NOTES.md").is_file():
        out += [
            f"What broke on this GPU, what was fixed and what is not verified yet: [{link}NOTES.md]({link}NOTES.md).",
            "",
        ]
    out += ["Stages and the harness commit each ran at: " + "; ".join(_commits(folder)) + ".", ""]
    out += [f"{h}# Targets", "", *targets(folder), ""]

    fast = (
        pd.concat([_rows(p) for p in sorted(folder.glob("fast_path/*.csv"))], ignore_index=True)
        if any(folder.glob("fast_path/*.csv"))
        else pd.DataFrame()
    )
    if len(fast):
        fast = fast.sort_values("mfu", ascending=False)
        fast["commit"] = fast["git_commit"].str.slice(0, 7)
        fast["step"] = fast.apply(
            lambda r: (
                ("compiled blocks, bf16 params, fused" if r["compile"] else "eager, fp32 params")
                + f", {int(r['batch_size'])} x {int(r['grad_accum_steps']) if r['grad_accum_steps'] == r['grad_accum_steps'] else 1}"
            ),
            axis=1,
        )
        counts = sorted({f"{int(r.warmup_steps)} warmup + {int(r.measure_steps)} measured" for r in fast.itertuples()})
        out += [f"{h}# The 2.7B bf16 training step (context 512, CUDA-event timer, {' or '.join(counts)})", ""]
        out += table(
            fast,
            {
                "step": "step (batch x micro-batches)",
                "median_ms": "median ms",
                "cv_pct": "CV %",
                "mfu": "MFU",
                "device_busy_pct": "GPU busy %",
                "kernels_per_step": "kernels",
                "forward_median_ms": "forward ms",
                "backward_median_ms": "backward ms",
                "optimizer_median_ms": "optimizer ms",
                "compile_s": "compile s",
                "commit": "commit",
            },
            {
                "median_ms": 1,
                "cv_pct": 2,
                "mfu": 3,
                "device_busy_pct": 1,
                "forward_median_ms": 1,
                "backward_median_ms": 1,
                "optimizer_median_ms": 1,
                "compile_s": 1,
            },
        )
        files = ", ".join(f"[{p.name}]({link}fast_path/{p.name})" for p in sorted(folder.glob("fast_path/*.csv")))
        out += [
            "",
            f"Files: {files}. MFU divides the model FLOPs by the spec-sheet "
            "dense peak of the row's precision (the row's `peak_tflops`).",
            "",
        ]

    grids = []
    paths = (
        ("precision/best_{}.csv", "best"),
        ("precision/eager.csv", "eager"),  # the first call's layout
        ("precision_eager/eager.csv", "eager"),
        ("precision_eager/eager_tf32.csv", "eager"),
    )
    for path, path_name in paths:
        for precision in ("bf16", "fp32", "tf32"):
            frame = _ok(_rows(folder / path.format(precision)))
            if "precision" in frame:
                frame = frame[frame["precision"] == precision]
                grids.append(frame.assign(column=f"{path_name} {precision}"))
    if grids:
        grid = pd.concat(grids).drop_duplicates(["model_size", "column"], keep="last")
        pivot = grid.pivot(index="model_size", columns="column", values="median_ms")
        order = [s for s in ("small", "medium", "large", "xl", "2.7B") if s in pivot.index]
        pivot = pivot.reindex(order)
        out += [f"{h}# Forward-backward per size and precision (context 512, batch 4; median ms)", ""]
        cols = [c for c in ("eager fp32", "eager bf16", "best fp32", "best tf32", "best bf16") if c in pivot]
        out += ["| size | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for size, row in pivot[cols].iterrows():
            out.append(f"| {size} | " + " | ".join(_num(v) for v in row) + " |")
        out += [
            "",
            "Best: blocks compiled one by one, fused projections, bf16 parameters in the bf16 column. "
            "Files: "
            + ", ".join(
                f"[{p.parent.name}/{p.name}]({link}{p.parent.name}/{p.name})"
                for p in sorted(folder.glob("precision*/*.csv"))
            )
            + "; "
            "an empty cell was not measured within the call.",
            "",
        ]

    for csv in sorted([*folder.glob("attention/*.csv"), *folder.glob("extras/attention_*.csv")]):
        frame = _rows(csv)
        frame["error"] = frame.get("error", pd.Series(dtype=str)).fillna("").map(_short)
        shape = ", ".join(
            sorted(
                {
                    f"batch {r.batch_size} x {r.num_heads} head(s) of {r.head_dim}, {r.precision}, {r.timer}"
                    for r in frame.itertuples()
                }
            )
        )
        out += [f"{h}# Attention, {csv.stem.removeprefix('attention_')} ({shape}, causal)", ""]
        out += table(
            frame,
            {
                "implementation": "implementation",
                "context_length": "context",
                "status": "status",
                "forward_median_ms": "forward ms",
                "backward_median_ms": "backward ms",
                "end_to_end_median_ms": "end-to-end ms",
                "error": "why",
            },
            {"forward_median_ms": 3, "backward_median_ms": 3, "end_to_end_median_ms": 3},
        )
        where = csv.relative_to(folder).as_posix()
        out += ["", f"File: [{where}]({link}{where}).", ""]

    ddp = _rows(folder / "distributed/ddp.csv")
    if len(ddp):
        out += [f"{h}# DDP strategies at world size 1 (NCCL, small, bf16)", ""]
        out += table(
            ddp,
            {"strategy": "strategy", "status": "status", "median_ms": "median ms", "iqr_pct": "IQR %"},
            {"median_ms": 1, "iqr_pct": 1},
        )
        out += [
            "",
            "One rank: no data leaves the GPU, so these rows time each strategy's own work and hooks, "
            f"not communication. File: [distributed/ddp.csv]({link}distributed/ddp.csv).",
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        write_summaries(Path(sys.argv[2]).resolve())
    else:
        sys.exit(collect([Path(a) for a in sys.argv[1:]]))
