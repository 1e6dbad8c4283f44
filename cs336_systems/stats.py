"""Statistics over raw step times: pure functions, no I/O.

Conventions (stated once, used everywhere):
- std is the *sample* standard deviation (ddof=1); it is NaN for fewer than 2 samples.
- Quantiles use linear interpolation between order statistics (numpy's default,
  Hyndman & Fan type 7), so p10/p90 of 10 samples are interpolated, not picked.
- One spread per statistic a table shows, and one noise rule each (`NOISE`), both flagging
  above NOISY_PCT:
    median: iqr_pct = 100 * (p75 - p25) / median   torch.utils.benchmark's rule (it warns above 10%)
    mean:   cv_pct  = 100 * std / mean              the coefficient of variation
  Tables lead with the median, so they flag IQR/median; a table of mean ± std (the handout asks
  for the average and the standard deviation) flags the CV.
- Every rate derived from a step time (tokens/s, TFLOP/s and MFU, GB/s, samples/s, a share of
  the step) is computed once, on the median step: `per_second`, `percent_of`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

NOISY_PCT = 10.0  # torch.utils.benchmark warns at IQR/median > 10%; the CV of a mean gets the same bar
# What a table of timings says under it (results.markdown): the conventions above, in one line.
CONVENTIONS = (
    f"Times lead with the median of the measured steps; iqr_pct = 100*IQR/median (noisy above {NOISY_PCT:g}%, "
    "as torch.utils.benchmark); std is the sample standard deviation (ddof=1), cv_pct = 100*std/mean; "
    "quantiles interpolate linearly; rates (tokens/s, TFLOP/s, MFU, GB/s, samples/s) are on the median step."
)


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    iqr: float
    iqr_pct: float
    mean: float
    std: float
    cv_pct: float
    min: float
    max: float
    p10: float
    p90: float

    def as_dict(self, suffix: str = "") -> dict[str, float]:
        """Fields named for a record, e.g. suffix '_ms' gives median_ms, iqr_ms, iqr_pct, ... (n excluded;
        a percentage keeps its own name)."""
        return {
            key if key.endswith("_pct") else f"{key}{suffix}": value
            for key, value in asdict(self).items()
            if key != "n"
        }


def _percent(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole != 0 and not math.isnan(part) else math.nan


def summarize(samples: Sequence[float]) -> Summary:
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        raise ValueError("cannot summarise zero samples")
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if values.size > 1 else math.nan
    p10, p25, median, p75, p90 = (float(q) for q in np.percentile(values, [10, 25, 50, 75, 90]))
    return Summary(
        n=int(values.size),
        median=median,
        iqr=p75 - p25,
        iqr_pct=_percent(p75 - p25, median),
        mean=mean,
        std=std,
        cv_pct=_percent(std, mean),
        min=float(values.min()),
        max=float(values.max()),
        p10=p10,
        p90=p90,
    )


def _number(value: object) -> float | None:
    try:
        value = float(value)  # a row read back from a file holds strings, None or NaN too
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


@dataclass(frozen=True)
class NoiseRule:
    """When the shown statistic of a timing is not to be trusted alone, and how a reader is told."""

    statistic: str  # the statistic shown: "median" or "mean"
    spread: str  # its spread's column (without prefix): "iqr_pct" or "cv_pct"
    spread_name: str  # as a reader reads it
    footnote: str  # the noise mark's footnote under a table

    def spread_of(self, row: Mapping, prefix: str = "") -> float | None:
        """The spread of the timing `prefix` (e.g. 'forward_') in a record's row, None where it has none."""
        return _number(row.get(f"{prefix}{self.spread}"))

    def is_noisy(self, spread: float | None) -> bool:
        return spread is not None and not math.isnan(spread) and spread > NOISY_PCT

    def warning(self, spread: float) -> str:
        return f"high variance, {self.spread_name} {spread:.1f}% > {NOISY_PCT:g}%; treat the {self.statistic} with care"


def is_noise_warning(text: str) -> bool:
    """Whether a row's note (or a part of one split at '; ') is NoiseRule.warning's, which a table marks
    in its cells instead."""
    return "high variance" in text or (text.startswith("treat the ") and text.endswith(" with care")) or "CV" in text


NOISE = {
    "median": NoiseRule(
        "median",
        "iqr_pct",
        "IQR/median",
        f"the interquartile range of the measured steps is above {NOISY_PCT:g}% of their median: noisy.",
    ),
    "mean": NoiseRule(
        "mean",
        "cv_pct",
        "CV",
        f"the coefficient of variation of the measured steps is above {NOISY_PCT:g}%: noisy.",
    ),
}


def per_second(amount: float | None, median_ms: float | None) -> float | None:
    """`amount` (tokens, FLOPs, bytes, samples) per second over a step of `median_ms`: the one rate
    formula, given the median step as every rate in a row is."""
    if amount is None or not median_ms or math.isnan(median_ms):
        return None
    return amount / (median_ms / 1e3)


def percent_of(part_ms: float | None, median_ms: float | None) -> float | None:
    """`part_ms` (a median, e.g. communication) as a percentage of the median step."""
    if part_ms is None or not median_ms or math.isnan(median_ms):
        return None
    return 100.0 * part_ms / median_ms


# -- comparing two measurements ------------------------------------------------------------

BOOTSTRAP_RESAMPLES = 2000
MIN_SAMPLES = 3  # fewer steps on a side say nothing of the noise: never compared
SAME_BAND_PCT = 5.0  # "the same": the whole interval of the ratio lies within this of 1


def compare(
    a: Sequence[float], b: Sequence[float], statistic: str = "median", level: float = 0.95, seed: int = 0
) -> tuple[float, float, float] | None:
    """a's steps against b's: (ratio, low, high), the ratio of their `statistic` (median or mean, a / b)
    and a bootstrap interval of it (`level`), each side resampled with replacement from its own steps.
    None without a positive statistic on both sides; (ratio, 0, inf) from fewer than MIN_SAMPLES a side."""
    a = np.asarray([x for x in a if x is not None and math.isfinite(x)], dtype=float)
    b = np.asarray([x for x in b if x is not None and math.isfinite(x)], dtype=float)
    of = getattr(np, statistic)
    if not len(a) or not len(b) or of(a) <= 0 or of(b) <= 0:
        return None
    ratio = float(of(a) / of(b))
    if min(len(a), len(b)) < MIN_SAMPLES:
        return ratio, 0.0, math.inf
    rng = np.random.default_rng(seed)
    ratios = of(rng.choice(a, (BOOTSTRAP_RESAMPLES, len(a))), axis=1) / of(
        rng.choice(b, (BOOTSTRAP_RESAMPLES, len(b))), axis=1
    )
    low, high = (float(q) for q in np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2]))
    return ratio, low, high


def compare_spreads(a: float, a_half: float, b: float, b_half: float) -> tuple[float, float, float] | None:
    """a against b where only each side's statistic and half its spread are left (a CSV row keeps no
    steps): (ratio, low, high) with the interval of the two ranges' extremes, which excludes 1 only
    where the ranges do not overlap."""
    values = (a, a_half, b, b_half)
    if any(v is None or not math.isfinite(v) for v in values) or a <= 0 or b <= 0:
        return None
    low = (a - a_half) / (b + b_half) if b + b_half > 0 else 0.0
    high = (a + a_half) / (b - b_half) if b - b_half > 0 else math.inf
    return a / b, low, high
