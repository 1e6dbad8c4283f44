"""scripts/launch_floor.py: operators that launch kernels are counted, views are not; its summary
reads its numbers off the table."""

import runpy

import pandas as pd
import torch

from tests.conftest import REPO

SCRIPT = runpy.run_path(str(REPO / "scripts" / "launch_floor.py"), run_name="imported")


def test_a_linear_is_one_kernel_and_autocast_adds_its_casts():
    linear, x = torch.nn.Linear(8, 8), torch.randn(2, 8)
    for precision, expected in ((None, 1), (torch.bfloat16, 4)):  # addmm; + casts of input, weight, bias
        with torch.no_grad(), torch.autocast("cpu", dtype=precision or torch.float32, enabled=precision is not None):
            with SCRIPT["CountKernels"]() as counter:
                linear(x)
        assert counter.count == expected  # the transpose of the weight is a view: no kernel


def test_the_summary_quotes_the_range_per_operator_and_the_counts():
    table = pd.DataFrame(
        [
            dict(
                model_size="small",
                pass_type="forward-backward",
                precision="bf16",
                operators_per_step=1000,
                us_per_operator=20.0,
            ),
            dict(
                model_size="xl",
                pass_type="forward-backward",
                precision="bf16",
                operators_per_step=3000,
                us_per_operator=25.0,
            ),
        ]
    )
    text = SCRIPT["summary"](table)
    assert (
        "bf16 forward-backward steps take 20 to 25 us per dispatched operator (1,000 for small, 3,000 for xl)" in text
    )
    assert "fp32" not in text
