"""Statistics over raw step times: pure functions, no I/O.

Conventions (stated once, used everywhere):
- std is the *sample* standard deviation (ddof=1); it is NaN for fewer than 2 samples.
- cv_pct = 100 * std / mean.
- Quantiles use linear interpolation between order statistics (numpy's default,
  Hyndman & Fan type 7), so p10/p90 of 10 samples are interpolated, not picked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

HIGH_CV_PCT = 10.0  # torch.utils.benchmark warns at IQR/median > 10%; we warn on CV the same way


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float
    cv_pct: float
    median: float
    min: float
    max: float
    p10: float
    p90: float

    def as_dict(self, suffix: str = "") -> dict[str, float]:
        """Fields named for a record, e.g. suffix '_ms' gives mean_ms, std_ms, ... (n excluded)."""
        return {
            f"{key}{suffix}" if key != "cv_pct" else key: value for key, value in asdict(self).items() if key != "n"
        }


def summarize(samples: Sequence[float]) -> Summary:
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        raise ValueError("cannot summarise zero samples")
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if values.size > 1 else math.nan
    cv_pct = 100.0 * std / mean if mean != 0 and not math.isnan(std) else math.nan
    p10, median, p90 = (float(q) for q in np.percentile(values, [10, 50, 90]))
    return Summary(
        n=int(values.size),
        mean=mean,
        std=std,
        cv_pct=cv_pct,
        median=median,
        min=float(values.min()),
        max=float(values.max()),
        p10=p10,
        p90=p90,
    )


def is_noisy(cv_pct: float | None, threshold: float = HIGH_CV_PCT) -> bool:
    return cv_pct is not None and not math.isnan(cv_pct) and cv_pct > threshold
