import math

import pytest

from cs336_systems.stats import NOISE, NOISY_PCT, per_second, percent_of, summarize


def test_summary_matches_hand_computed_values():
    # samples 1..5: mean 3, sample variance ((4+1+0+1+4)/4) = 2.5
    s = summarize([5.0, 1.0, 4.0, 2.0, 3.0])
    assert s.n == 5
    assert s.mean == 3.0
    assert s.std == pytest.approx(math.sqrt(2.5))
    assert s.cv_pct == pytest.approx(100 * math.sqrt(2.5) / 3)
    assert s.median == 3.0
    # p25 at rank 0.25*4 = 1 -> 2, p75 at rank 3 -> 4: IQR 2, 100 * 2 / 3 of the median
    assert s.iqr == 2.0 and s.iqr_pct == pytest.approx(200 / 3)
    assert (s.min, s.max) == (1.0, 5.0)
    # linear interpolation: p10 at rank 0.1*(5-1)=0.4 -> 1 + 0.4*(2-1)
    assert s.p10 == pytest.approx(1.4)
    assert s.p90 == pytest.approx(4.6)


def test_even_count_median_and_quantiles_interpolate():
    s = summarize([10.0, 20.0, 30.0, 40.0])
    assert s.median == 25.0
    assert s.p10 == pytest.approx(13.0)  # rank 0.3
    assert s.p90 == pytest.approx(37.0)  # rank 2.7
    # p25 at rank 0.75 -> 17.5, p75 at rank 2.25 -> 32.5: IQR 15 of a median of 25
    assert s.iqr == pytest.approx(15.0) and s.iqr_pct == pytest.approx(60.0)


def test_one_outlier_moves_the_cv_not_the_iqr():
    # nine steps of 10 ms and one of 30: the mean's CV says noisy, the median's IQR does not
    s = summarize([10.0] * 9 + [30.0])
    assert s.median == 10.0 and s.iqr == 0.0 and s.iqr_pct == 0.0
    assert s.mean == 12.0 and s.cv_pct == pytest.approx(100 * math.sqrt(40.0) / 12)  # variance 360/9
    row = s.as_dict("_ms")
    assert not NOISE["median"].is_noisy(NOISE["median"].spread_of(row))
    assert NOISE["mean"].is_noisy(NOISE["mean"].spread_of(row))


def test_single_sample_has_undefined_spread():
    s = summarize([7.0])
    assert s.mean == s.median == s.min == s.max == 7.0
    assert math.isnan(s.std) and math.isnan(s.cv_pct)
    assert s.iqr == 0.0  # one sample: its quartiles are itself


def test_constant_samples_have_zero_spread():
    s = summarize([2.0, 2.0, 2.0])
    assert s.std == 0.0 and s.cv_pct == 0.0 and s.iqr_pct == 0.0


def test_empty_samples_rejected():
    with pytest.raises(ValueError):
        summarize([])


def test_record_field_names():
    fields = summarize([1.0, 2.0]).as_dict(suffix="_ms")
    assert list(fields) == [
        *("median_ms", "iqr_ms", "iqr_pct", "mean_ms", "std_ms", "cv_pct"),
        *("min_ms", "max_ms", "p10_ms", "p90_ms"),
    ]


@pytest.mark.parametrize(("spread", "noisy"), [(10.0, False), (10.01, True), (float("nan"), False), (None, False)])
@pytest.mark.parametrize("statistic", ["median", "mean"])
def test_one_noise_threshold_per_statistic(statistic, spread, noisy):
    assert NOISY_PCT == 10.0  # torch.utils.benchmark's bar for IQR/median
    rule = NOISE[statistic]
    assert rule.is_noisy(spread) is noisy


def test_each_rule_reads_its_own_spread_and_says_which():
    row = {"median_ms": 10.0, "iqr_pct": 12.5, "cv_pct": 4.0, "forward_iqr_pct": "3.0", "backward_cv_pct": None}
    median, mean = NOISE["median"], NOISE["mean"]
    assert median.spread_of(row) == 12.5 and mean.spread_of(row) == 4.0
    assert median.spread_of(row, "forward_") == 3.0 and mean.spread_of(row, "backward_") is None
    assert median.warning(12.5) == "high variance, IQR/median 12.5% > 10%; treat the median with care"
    assert mean.warning(12.5) == "high variance, CV 12.5% > 10%; treat the mean with care"
    assert (
        "interquartile range" in median.footnote
        and "coefficient of variation" in mean.footnote
        and "10%" in mean.footnote
    )


def test_rates_are_per_second_of_the_median_step():
    assert per_second(1000, 250.0) == 4000.0  # 1000 tokens in a 250 ms median step
    assert per_second(None, 250.0) is None and per_second(1000, None) is None and per_second(1000, 0.0) is None
    assert per_second(1000, float("nan")) is None
    assert percent_of(25.0, 200.0) == 12.5
    assert percent_of(None, 200.0) is None and percent_of(25.0, 0.0) is None
