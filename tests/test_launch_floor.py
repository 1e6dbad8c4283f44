"""scripts/launch_floor.py: operators that launch kernels are counted, views are not; its summary
reads its numbers off the table."""

import runpy

import pandas as pd
import torch

from tests.helpers import REPO

SCRIPT = runpy.run_path(str(REPO / "scripts" / "launch_floor.py"), run_name="imported")


def test_a_linear_is_one_kernel_and_autocast_adds_its_casts():
    linear, x = torch.nn.Linear(8, 8), torch.randn(2, 8)
    for precision, expected in ((None, 1), (torch.bfloat16, 4)):  # addmm; + casts of input, weight, bias
        autocast = torch.autocast("cpu", dtype=precision or torch.float32, enabled=precision is not None)
        with torch.no_grad(), autocast, SCRIPT["CountKernels"]() as counter:
            linear(x)
        assert counter.count == expected  # the transpose of the weight is a view: no kernel


def test_the_summary_quotes_the_range_per_operator_of_the_launch_bound_rows_and_the_counts():
    rows = [  # (size, operators, us per operator, step ms, FLOPs at peak ms)
        ("small", 1000, 20.0, 20.0, 1.0),
        ("xl", 3000, 25.0, 75.0, 5.0),
        ("xl", 3000, 60.0, 180.0, 90.0),  # its FLOPs take half its time: not launch-bound
    ]
    table = pd.DataFrame(
        [
            dict(
                model_size=size,
                pass_type="forward-backward",
                precision="bf16",
                operators_per_step=n,
                us_per_operator=us,
                step_ms=ms,
                flops_at_peak_ms=flops,
            )
            for size, n, us, ms, flops in rows
        ]
    )
    text = SCRIPT["summary"](table)
    assert "under a third of their time (2 of 3) cost 20 to 25 us per dispatched operator" in text
    assert "(1,000 for small, 3,000 for xl)" in text and "fp32" not in text
