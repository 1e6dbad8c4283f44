import math

import pytest

from cs336_systems.stats import is_noisy, summarize


def test_summary_matches_hand_computed_values():
    # samples 1..5: mean 3, sample variance ((4+1+0+1+4)/4) = 2.5
    s = summarize([5.0, 1.0, 4.0, 2.0, 3.0])
    assert s.n == 5
    assert s.mean == 3.0
    assert s.std == pytest.approx(math.sqrt(2.5))
    assert s.cv_pct == pytest.approx(100 * math.sqrt(2.5) / 3)
    assert s.median == 3.0
    assert (s.min, s.max) == (1.0, 5.0)
    # linear interpolation: p10 at rank 0.1*(5-1)=0.4 -> 1 + 0.4*(2-1)
    assert s.p10 == pytest.approx(1.4)
    assert s.p90 == pytest.approx(4.6)


def test_even_count_median_and_quantiles_interpolate():
    s = summarize([10.0, 20.0, 30.0, 40.0])
    assert s.median == 25.0
    assert s.p10 == pytest.approx(13.0)  # rank 0.3
    assert s.p90 == pytest.approx(37.0)  # rank 2.7


def test_single_sample_has_undefined_spread():
    s = summarize([7.0])
    assert s.mean == s.median == s.min == s.max == 7.0
    assert math.isnan(s.std) and math.isnan(s.cv_pct)


def test_constant_samples_have_zero_spread():
    s = summarize([2.0, 2.0, 2.0])
    assert s.std == 0.0 and s.cv_pct == 0.0


def test_empty_samples_rejected():
    with pytest.raises(ValueError):
        summarize([])


def test_record_field_names():
    fields = summarize([1.0, 2.0]).as_dict(suffix="_ms")
    assert set(fields) == {"mean_ms", "std_ms", "cv_pct", "median_ms", "min_ms", "max_ms", "p10_ms", "p90_ms"}


@pytest.mark.parametrize(("cv", "noisy"), [(10.0, False), (10.01, True), (float("nan"), False), (None, False)])
def test_noise_threshold(cv, noisy):
    assert is_noisy(cv) is noisy
