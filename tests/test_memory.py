import itertools
import json
import subprocess

import pytest
import torch
import torch.nn.functional as F

from cs336_systems.memory import PhaseMemory, estimate_memory, find_max_by_prediction
from cs336_systems.memory import cli as memory
from cs336_systems.models import ModelConfig, TransformerLM, formula_num_params
from cs336_systems.precision import autocast
from cs336_systems.runner import run_benchmark
from cs336_systems.units import format_bytes, parse_bytes
from tests.helpers import FIXTURES, PYTHON, child_env, tiny_benchmark_config

GIB = 2**30


def test_activation_arithmetic_by_hand():
    # N = 2 tokens, d = 4, d_ff = 6, 2 heads, fp32, sdpa: per layer
    #   rmsnorm 2*(2*N*d*4 + N*4) = 144, projection inputs 2*N*d*4 = 64,
    #   attention 4*N*d*4 + B*H*T*4 = 144, swiglu 4*N*d_ff*4 = 192
    m = ModelConfig(d_model=4, d_ff=6, num_layers=1, num_heads=2, vocab_size=10, context_length=2)
    e = estimate_memory(m, 1, 2, "forward-backward", "fp32", "cpu")
    assert e.activations == {
        "rmsnorm": 144,
        "projection inputs": 64,
        "attention (sdpa)": 144,
        "swiglu": 192,
        "final norm and LM-head input": 2 * 2 * 4 * 4 + 2 * 4 + 2 * 4 * 4,
    }
    assert e.parameters == e.gradients == formula_num_params(m) * 4
    assert e.optimizer_state == 0 and e.autocast_weight_copies == 0
    assert e.logits_and_loss == 2 * (2 * 10 * 4)  # logits and log-probabilities, fp32
    # naive attention: + probs B*H*T*T*4 = 32 + mask T*T = 4 - logsumexp 16
    naive = estimate_memory(m.replace(attention="naive"), 1, 2, "forward-backward", "fp32", "cpu")
    assert naive.activations["attention (naive)"] == 4 * 2 * 4 * 4 + 32 + 4


def saved_tensor_bytes(config: ModelConfig, batch: int, precision: str) -> int:
    """Bytes autograd saves for backward in one forward + loss, each storage once."""
    model = TransformerLM(config)
    tokens = torch.randint(0, config.vocab_size, (batch, config.context_length))
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), tokens]}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(precision, torch.device("cpu")):
        logits = model(tokens)
        F.cross_entropy(logits.reshape(-1, config.vocab_size), tokens.reshape(-1))
    return sum(saved.values())


@pytest.mark.parametrize(
    ("attention", "precision", "shape"),
    list(
        itertools.product(
            ["sdpa", "naive"], ["fp32", "bf16"], [(2, 40, 96, 224, 4, 2, 1000), (3, 16, 64, 160, 2, 3, 500)]
        )
    ),
)
def test_saved_activations_match_what_autograd_saves(attention, precision, shape):
    batch, seq, d, d_ff, heads, layers, vocab = shape
    config = ModelConfig(
        d_model=d,
        d_ff=d_ff,
        num_layers=layers,
        num_heads=heads,
        vocab_size=vocab,
        context_length=seq,
        attention=attention,
    )
    e = estimate_memory(config, batch, seq, "forward-backward", precision, "cpu")
    predicted = sum(e.activations.values()) + e.autocast_weight_copies + batch * seq * vocab * 4  # + log-probs
    assert saved_tensor_bytes(config, batch, precision) == predicted + 4  # + the scalar loss


def test_step_timeline():
    m = ModelConfig.from_size("small")
    params = formula_num_params(m)
    fb = estimate_memory(m, 4, 512, "forward-backward")
    steady = estimate_memory(m, 4, 512, "train-step")
    first = estimate_memory(m, 4, 512, "train-step", first_step=True)
    forward = estimate_memory(m, 4, 512, "forward")
    assert fb.peak_bytes > params * 4 * 2  # weights + gradients at least
    assert steady.peak_bytes == fb.peak_bytes + 8 * params  # AdamW state is there all step
    assert first.peak_bytes >= 16 * params  # the optimizer step: weights, grads, two states
    assert forward.peak_bytes < fb.peak_bytes and forward.gradients == 0
    assert estimate_memory(m, 4, 512, "forward-backward", "bf16").autocast_weight_copies > 0


@pytest.mark.parametrize(
    ("size", "fits"), [("small", True), ("medium", True), ("large", False), ("xl", False), ("2.7B", False)]
)
def test_laptop_story(size, fits):
    """docs/reference.md section 3: a 16 GiB card, fp32, context 512, batch 4, forward-backward, the
    handout's (naive) attention: large does not fit, hence its 17.8 s steps from host spill."""
    model = ModelConfig.from_size(size, "2025", context_length=512, attention="naive")
    estimate = estimate_memory(model, 4, 512, "forward-backward", "fp32", "cuda", device_memory_bytes=16 * GIB)
    assert estimate.fits is fits


def test_find_max_by_prediction_is_the_boundary():
    model = ModelConfig.from_size("medium", context_length=512)

    def estimate_for(batch):
        return estimate_memory(model, batch, 512, "train-step", "bf16", "cuda", 24 * GIB)

    largest = find_max_by_prediction(estimate_for, "batch-size", 4, 24 * GIB)
    assert estimate_for(largest).fits and not estimate_for(largest + 1).fits


def test_phase_memory_on_cpu_records_each_phase():
    tracker = PhaseMemory(torch.device("cpu"))
    for _ in range(2):
        with tracker.phase("forward"):
            block = torch.ones(64 * 2**20 // 4)  # 64 MiB touched (mmap-served: returned on free)
            del block
        with tracker.phase("backward"):
            pass
    assert len(tracker.steps) == 2 and set(tracker.steps[0]) == {"forward", "backward"}
    assert tracker.steps[0]["forward"][0] - tracker.steps[0]["backward"][0] > 32 * 2**20


def test_every_row_has_measured_and_predicted_memory():
    record = run_benchmark(tiny_benchmark_config(pass_type="train-step"))
    assert record.memory_source == "rss_high_water_mark"
    assert record.predicted_memory_bytes > 0 and record.peak_memory_bytes > 0
    assert record.forward_peak_bytes is not None and record.optimizer_peak_bytes is not None
    assert record.first_optimizer_peak_bytes is not None
    forward_only = run_benchmark(tiny_benchmark_config(pass_type="forward"))
    assert forward_only.backward_peak_bytes is None and forward_only.optimizer_peak_bytes is None


BASELINE_CHILD = """
import sys, torch
from cs336_systems.memory import baseline_memory_bytes
from tests.helpers import tiny_benchmark_config
cpu = torch.device("cpu")
for pass_type in sys.argv[1:]:
    baseline_memory_bytes(cpu, [tiny_benchmark_config(pass_type=pass_type)])
    print(pass_type, "torch._dynamo" in sys.modules)
"""


def test_the_cpu_baseline_includes_torch_dynamo_when_the_step_would_import_it():
    # RSS is the CPU's measure: 73 MiB of modules imported by the first optimizer step would be the step's
    result = subprocess.run(
        [PYTHON, "-c", BASELINE_CHILD, "forward", "forward-backward", "train-step"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["forward", "False", "forward-backward", "False", "train-step", "True"]


@pytest.mark.slow
@pytest.mark.parametrize("pass_type", ["forward-backward", "train-step"])
def test_cpu_prediction_within_15_percent_above_1gb(pass_type):
    result = subprocess.run(
        [PYTHON, str(FIXTURES / "memory_accuracy_child.py"), pass_type],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["status"] == "ok", row["error"]
    assert row["peak_memory_bytes"] > 1e9
    assert row["predicted_memory_bytes"] == pytest.approx(row["peak_memory_bytes"], rel=0.15)


def run_memory_cli(capsys, *args):
    try:
        code = memory.main(list(args))
    except SystemExit as exc:
        code = exc.code
    return (code, *capsys.readouterr())


def test_cli_table_and_verdict(capsys):
    code, out, _ = run_memory_cli(capsys, "--model-size", "xl", "--device-memory", "16GiB")
    assert code == 0
    for part in (
        "parameters (fp32)",
        "gradients (fp32)",
        "activations saved for backward: swiglu",
        "logits and loss",
        "workspace margin",
        "Verdict: does NOT fit in 16.00 GiB",
        "With --attention naive instead",
    ):
        assert part in out


def test_cli_json(capsys):
    code, out, _ = run_memory_cli(
        capsys,
        "--model-size",
        "small",
        "--precision",
        "bf16",
        "--pass-type",
        "train-step",
        "--device-memory",
        "80GB",
        "--json",
        "--find-max",
        "batch-size",
    )
    data = json.loads(out)
    assert code == 0 and data["fits"] is True and data["total_bytes"] > data["peak_bytes"] > 0
    assert data["autocast_weight_copies"] > 0 and data["find_max"]["largest_that_fits"] > 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device-memory", "lots"], "argument --device-memory: not a size: 'lots'"),
        (["--device-memory", "0.5"], "argument --device-memory: size must be at least one byte"),
        (["--find-max", "batch-size"], "--find-max needs --device-memory"),
        (["--model-size", "giant"], "unknown model size"),
        (["--context-length", "0"], "must be a positive integer"),
    ],
)
def test_cli_errors(capsys, args, message):
    code, _, err = run_memory_cli(capsys, *args)
    assert code == 2 and message in err and err.count("\n") == 1


def test_units():
    assert parse_bytes("16GiB") == 16 * GIB and parse_bytes("80GB") == 80 * 10**9 and parse_bytes("4096") == 4096
    assert parse_bytes("1.5G") == int(1.5 * GIB)
    assert format_bytes(1536) == "1.50 KiB" and format_bytes(3 * GIB) == "3.00 GiB"
    with pytest.raises(ValueError):
        parse_bytes("-1GB")
