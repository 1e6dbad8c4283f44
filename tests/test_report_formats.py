"""report's formats, sections and refusals, from rows of the committed results files."""

import re
from pathlib import Path

import pandas as pd
import pytest

from cs336_systems import report
from cs336_systems.report.build import build_document
from cs336_systems.report.latex import escape
from cs336_systems.report.load import load
from cs336_systems.report.typst_source import string
from tests.conftest import REPO

RESULTS = REPO / "results"


def _subset(tmp_path, name: str, rows: pd.DataFrame) -> str:
    path = tmp_path / name
    rows.to_csv(path, index=False)
    return str(path)


def _read(name: str) -> pd.DataFrame:
    return pd.read_csv(RESULTS / name, dtype={"cuda_version": str, "cudnn_version": str})


@pytest.fixture
def files(tmp_path):
    """A few rows of each tool, real columns and values: CPU and H100 benchmark rows (one of
    them an OOM), attention with an OOM and a FlashAttention row, all-reduce, DDP, loader, warmup."""
    gpu = _read("gpu_sweep_h100.csv")
    gpu = gpu[gpu["model_size"].isin(["small", "medium"]) & gpu["context_length"].isin([128, 256])]
    attention = _read("attention_cpu.csv")
    flash = attention[attention["implementation"] == "sdpa"].assign(implementation="flash-triton")
    return {
        "benchmark": [
            _subset(tmp_path, "cpu.csv", _read("cpu_sweep.csv").head(6)),
            _subset(tmp_path, "cap.csv", _read("cpu_sweep_4gib.csv")),
            _subset(tmp_path, "gpu.csv", gpu),
        ],
        "attention": [_subset(tmp_path, "attention.csv", pd.concat([attention, flash]))],
        "allreduce": [_subset(tmp_path, "allreduce.csv", _read("allreduce_gloo_cpu.csv"))],
        "ddp": [_subset(tmp_path, "ddp.csv", _read("ddp_gloo_cpu.csv"))],
        "loader": [_subset(tmp_path, "loader.csv", _read("input_pipeline_enough_workers_cpu.csv"))],
        "warmup": [_subset(tmp_path, "warmup.csv", _read("warmup_study_cpu.csv"))],
    }


def _all(files) -> list[str]:
    return [path for paths in files.values() for path in paths]


def _balanced(tex: str) -> bool:
    stack = []
    for kind, name in re.findall(r"\\(begin|end)\{(\w+)\}", tex):
        if kind == "begin":
            stack.append(name)
        elif not stack or stack.pop() != name:
            return False
    return not stack


def test_every_format_holds_every_table_row(files, tmp_path):
    outputs = [tmp_path / "out" / f"report.{ext}" for ext in ("md", "tex", "typ")]
    assert report.main([*_all(files), *(x for o in outputs for x in ("--output", str(o)))]) == 0
    md, tex, typ = (o.read_text() for o in outputs)
    document = build_document(load(_all(files)), tmp_path, "check", [])
    assert len(document.tables()) > 15
    for table in document.tables():
        assert f"### {table.title}" in md or table.title == "Environment"
        for label, cells in table.frame.iterrows():
            line = f"{escape(label)} & " + " & ".join(escape(c) for c in cells)
            assert line in tex.replace(" \\\\\n", "\n"), (table.title, line)
            assert ", ".join(string(c) for c in (label, *cells)) in typ, (table.title, label)
    assert _balanced(tex) and tex.count("\\begin{table}") == len(document.tables())
    assert "\\usepackage{booktabs,graphicx}" in tex and "\\toprule" in tex and "\\includegraphics" in tex
    for png in ("report_time_vs_context.png", "report_allreduce.png", "report_warmup.png"):
        assert (tmp_path / "out" / png).stat().st_size > 1000 and png in md and png in tex and png in typ
    for problem in (
        "benchmarking_script",
        "benchmarking_mixed_precision",
        "memory_profiling",
        "pytorch_attention",
        "torch_compile",
        "flash_benchmarking",
        "distributed_communication_single_node",
        "naive_ddp_benchmarking",
    ):
        assert f"`{problem}`" in md
    order = [
        md.index(f"## {title}")
        for title in (
            "Environment",
            "End-to-end benchmarking",
            "Mixed precision",
            "Memory",
            "Attention",
            "FlashAttention",
            "All-reduce",
            "Data-parallel training",
            "Input pipeline",
        )
    ]
    assert order == sorted(order)  # the handout's order
    assert "Device: NVIDIA H100 80GB HBM3." in md and "Device: AMD EPYC." in md  # every caption names its device


def test_pdf_compiles_with_typst(files, tmp_path):
    pytest.importorskip("typst")
    output = tmp_path / "report.pdf"
    assert report.main([*_all(files), "--output", str(output)]) == 0
    assert output.read_bytes().startswith(b"%PDF") and output.stat().st_size < 1_000_000
    assert not list(tmp_path.glob("*.typ"))  # the source compiled was temporary


def test_environment_once_with_versions_as_torch_wrote_them(files, tmp_path):
    rows = _read("gpu_sweep_h100.csv").head(2)
    jsonl = tmp_path / "gpu.jsonl"  # JSON keeps cudnn an int; a missing value would make pandas a float of it
    rows.assign(cudnn_version=[91900, None]).to_json(jsonl, orient="records", lines=True)
    output = tmp_path / "report.md"
    assert report.main([files["benchmark"][0], str(jsonl), "--output", str(output)]) == 0
    text = output.read_text()
    environment = text[text.index("## Environment") : text.index("## End-to-end")]
    assert "| field " in environment and "| AMD EPYC " in environment and "| NVIDIA H100 80GB HBM3 " in environment
    assert "| 13.0 " in environment and "| 91900 " in environment
    assert "13.000" not in text and "91900.0" not in text and text.count("## Environment") == 1


def test_sections_appear_only_with_their_data(files, tmp_path):
    output = tmp_path / "report.md"
    fp32 = _read("cpu_sweep.csv").query("precision == 'fp32'")
    assert report.main([_subset(tmp_path, "phased.csv", fp32), "--output", str(output)]) == 0
    assert "Phases" in output.read_text()  # the committed sweep has per-phase times
    unphased = fp32.assign(**{f"{phase}_ms": None for phase in ("forward", "backward", "optimizer")})
    assert report.main([_subset(tmp_path, "fp32.csv", unphased), "--output", str(output)]) == 0
    text = output.read_text()
    assert "## End-to-end benchmarking" in text and "## Memory" in text
    for absent in (
        "## Mixed precision",
        "## Attention",
        "## All-reduce",
        "## Data-parallel",
        "## Warmup",
        "## Input pipeline",
        "## torch.compile",
        "Phases",
        "ckpt",
    ):
        assert absent not in text
    assert report.main([*files["attention"], "--output", str(output)]) == 0
    text = output.read_text()
    assert "## Attention" in text and "## FlashAttention against PyTorch attention" in text
    assert "## End-to-end" not in text and "## Memory\n" not in text and "## All-reduce" not in text
    attention = text[text.index("### Attention:") : text.index("### Memory held")]
    # two shapes OOM in the naive implementation: forward and backward cells marked
    assert attention.count("| OOM ") == 4 and "naive fwd (ms)" in attention and "compiled bwd (ms)" in attention
    assert "### Speedup of compiled over naive" in text and "### Speedup of flash-triton over sdpa" in text


def test_per_phase_columns_and_checkpointing_are_shown_when_present(tmp_path):
    rows = _read("cpu_sweep.csv").query("precision == 'fp32' and pass_type == 'forward-backward'")
    rows = rows.assign(
        forward_ms=rows["mean_ms"] / 3, backward_ms=rows["mean_ms"] * 2 / 3, optimizer_ms=None, checkpoint_blocks=2
    )
    output = tmp_path / "report.md"
    assert report.main([_subset(tmp_path, "phases.csv", rows), "--output", str(output)]) == 0
    text = output.read_text()
    first = rows.iloc[0]
    assert "### Phases: pass type forward-backward" in text and "forward (ms)" in text and "backward (ms)" in text
    assert "optimizer (ms)" not in text  # an empty column is not a phase
    assert f"| {float(first['forward_ms']):.0f} " in text or f"| {first['forward_ms']:.1f} " in text
    assert "forward-backward fp32 ckpt 2 (GiB)" in text


def test_ddp_rows_are_never_folded(files, tmp_path):
    output = tmp_path / "report.md"
    assert report.main([*files["ddp"], "--output", str(output)]) == 0
    text = output.read_text()
    table = text[text.index("### DDP strategies") :].split("\n\n")[2]
    body = table.splitlines()[2:]
    assert len(body) == 7 and sum(line.startswith("| naive ") for line in body) == 2
    assert "device memory" not in text  # the machine's memory is not a measurement per rank


def test_tables_only_writes_one_file_per_table(files, tmp_path):
    output = tmp_path / "t" / "tables.tex"
    assert report.main([*files["allreduce"], "--output", str(output), "--tables-only"]) == 0
    written = sorted(p.name for p in output.parent.glob("tables_*.tex"))
    assert len(written) == 3  # time, bandwidth, environment
    for path in output.parent.glob("tables_*.tex"):
        text = path.read_text()
        assert text.startswith("\\begin{table}[!htbp]") and _balanced(text) and "\\documentclass" not in text


def _one_line_exit_2(capsys, argv, expected):
    code = report.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and expected in err, err


def test_bad_input_is_one_line_and_exit_2(files, tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_info:
        report.main([])
    assert exit_info.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage\x00\xff")
    (tmp_path / "folder.csv").mkdir()
    for argv, expected in (  # nothing left to report: exit 2, one line
        ([str(tmp_path / "missing.csv")], "no such file"),
        ([str(binary)], "binary.csv:1: not UTF-8 text"),
        ([str(tmp_path / "folder.csv")], "is a directory"),
        ([str(RESULTS / "checks" / "bench_timing_cpu.csv")], "not the output of any tool of this project"),
        ([*files["ddp"], "--output", str(tmp_path / "r.csv")], "unknown format '.csv'"),
        ([*files["ddp"], "--output", str(tmp_path / "r.pdf"), "--tables-only"], "not PDF"),
    ):
        _one_line_exit_2(capsys, argv, expected)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "typst" else object())
    _one_line_exit_2(capsys, [*files["ddp"], "--output", str(tmp_path / "r.pdf")], 'pip install -e ".[pdf]"')
    assert not (tmp_path / "r.pdf").exists() and not (tmp_path / "r.csv").exists()


def test_a_file_of_no_tool_is_one_line_and_the_rest_is_reported(files, tmp_path, capsys):
    checks = sorted(str(p) for p in (RESULTS / "checks").glob("*.csv"))
    missing = str(tmp_path / "missing.csv")
    output = tmp_path / "report.md"
    code = report.main([*files["ddp"], *checks, missing, *files["warmup"], "--output", str(output)])
    err = capsys.readouterr().err.splitlines()
    left_out = [line for line in err if "left out" in line]
    assert code == 1 and len(left_out) == len(checks) + 1 and "Traceback" not in "\n".join(err)
    assert all(any(Path(path).name in line for line in left_out) for path in [*checks, missing])
    text = output.read_text()
    assert "Data-parallel training" in text and "Warmup effect" in text


def test_warmup_study_alone_is_a_report(files, tmp_path):
    output = tmp_path / "report.md"
    assert report.main([*files["warmup"], "--output", str(output)]) == 0
    assert "Warmup effect" in output.read_text() and "Environment" not in output.read_text()


def test_monitor_probe_and_find_max_outputs_are_reported(tmp_path):
    outputs = [
        RESULTS / "monitor_captioning_cpu.csv",
        RESULTS / "monitor_captioning_cpu.json",
        RESULTS / "probe_story_cpu.csv",
        RESULTS / "find_max_cpu_4gib.json",
    ]
    output = tmp_path / "report.md"
    assert report.main([*map(str, outputs), "--output", str(output)]) == 0
    text = output.read_text()
    monitor = pd.read_csv(outputs[0])
    assert "Resources over a run" in text and f"{len(monitor)} samples" in text
    assert "python -m cs336_systems.loader_bench" in text  # the command, from the run record
    assert "Your training loop" in text and "num_workers=8" in text
    answer = pd.read_json(outputs[3], typ="series")
    assert "Largest that fits" in text and re.search(
        rf"\|\s*{answer['largest_ok']}\s*\|\s*{answer['smallest_oom']}\s*\|", text
    )


def test_tex_compiles_with_pdflatex(files, tmp_path):
    """Only booktabs and graphicx: a standard distribution compiles it (skipped without one)."""
    import shutil
    import subprocess

    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed")
    output = tmp_path / "report.tex"
    assert report.main([*_all(files), "--output", str(output)]) == 0
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", output.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert (tmp_path / "report.pdf").read_bytes().startswith(b"%PDF")


def test_model_label_names_the_size_table_where_a_size_changed_shape():
    from cs336_systems.report import model_label

    assert model_label({"model_size": "xl", "size_table": "2025"}) == "xl"
    assert model_label({"model_size": "xl", "size_table": "2026"}) == "xl (2026)"
    assert model_label({"model_size": "small", "size_table": "2026"}) == "small"  # same shape in both
    assert model_label({"model_size": "10B", "size_table": "2026"}) == "10B"
    assert model_label({"model_size": "xl"}) == "xl"  # files written before size_table existed
