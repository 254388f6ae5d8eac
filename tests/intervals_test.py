"""intervals: Student t and Welch intervals by hand and against scipy, the bootstrap share."""
import math

import numpy as np
import pytest
from scipy import stats

from marl_jax.tools import intervals


def test_mean_ci_by_hand():
  # [1, 2, 3, 4]: mean 2.5; s^2 = (1.5^2 + 0.5^2 + 0.5^2 + 1.5^2) / 3 = 5/3, s = 1.2910;
  # se = s / sqrt(4) = 0.6455; t_{0.975, 3} = 3.1824 (tables); half-width 3.1824 * 0.6455 = 2.0543.
  mean, half = intervals.mean_ci([1, 2, 3, 4])
  assert mean == 2.5
  assert half == pytest.approx(2.0543, abs=1e-4)
  # One value: no spread to estimate, so no interval.
  mean, half = intervals.mean_ci([0.4])
  assert mean == 0.4 and math.isnan(half)


def test_welch_by_hand():
  # a = [1, 2, 3]: mean 2, s^2 = 1, se_a^2 = 1/3; b = [3, 5, 7, 9]: mean 6, s^2 = 20/3, se_b^2 = 5/3.
  # diff 4, se = sqrt(1/3 + 5/3) = sqrt(2); dof = 2^2 / ((1/3)^2 / 2 + (5/3)^2 / 3) = 216/53 = 4.0755;
  # t_{0.975, 4.0755} = 2.7563 (between the tables' 2.7764 at 4 and 2.5706 at 5), half 3.8980.
  diff, half, dof = intervals.welch_diff([1, 2, 3], [3, 5, 7, 9])
  assert diff == 4
  assert dof == pytest.approx(216 / 53)
  assert half == pytest.approx(2.7563 * math.sqrt(2), abs=1e-3)
  assert math.isnan(intervals.welch_diff([1.0], [2.0, 3.0])[1])  # one seed on a side: undefined
  assert math.isnan(intervals.welch_diff([1.0, 1.0], [2.0, 2.0])[1])  # no spread on either side


def test_t_quantile_tables():
  # t_{0.975, dof} from printed tables, and the normal limit for large dof.
  for dof, t in [(1, 12.7062), (2, 4.3027), (3, 3.1824), (10, 2.2281), (30, 2.0423), (1e6, 1.9600)]:
    assert intervals.t_quantile(0.975, dof) == pytest.approx(t, abs=1e-4)
  assert intervals.t_quantile(0.025, 3) == pytest.approx(-3.1824, abs=1e-4)
  with pytest.raises(ValueError):
    intervals.t_quantile(0.975, 0.5)


def test_welch_matches_scipy():
  rng = np.random.default_rng(0)
  for n_a, n_b in [(2, 2), (3, 5), (4, 3), (8, 8)]:
    a, b = rng.normal(0.4, 0.05, n_a), rng.normal(0.5, 0.1, n_b)
    diff, half, dof = intervals.welch_diff(a, b)
    result = stats.ttest_ind(b, a, equal_var=False)  # b − a, as welch_diff
    lo, hi = result.confidence_interval(0.95)
    assert dof == pytest.approx(result.df)
    assert (diff - half, diff + half) == pytest.approx((lo, hi))
    mean, half = intervals.mean_ci(a)
    assert (mean - half, mean + half) == pytest.approx(
        stats.t.interval(0.95, n_a - 1, loc=a.mean(), scale=stats.sem(a)))


def test_bootstrap_share():
  share, lo, hi = intervals.bootstrap_share([0.10, 0.12, 0.14], [0.20, 0.23, 0.26])
  assert share == pytest.approx(0.12 / 0.23)
  assert lo < share < hi
  assert (share, lo, hi) == intervals.bootstrap_share([0.10, 0.12, 0.14], [0.20, 0.23, 0.26])  # fixed seed
  # No spread: every resample gives the same share.
  assert intervals.bootstrap_share([0.1, 0.1], [0.2, 0.2]) == pytest.approx((0.5, 0.5, 0.5))
  assert math.isnan(intervals.bootstrap_share([0.1], [0.2, 0.3])[1])
  # Two seeds each: a resample is one seed twice with probability 1/4, so each extreme ratio takes
  # 1/16 of the draws, more than the 2.5 % in each tail: the interval is min part / max total to
  # max part / min total, both runs resampled.
  assert intervals.bootstrap_share([0.1, 0.3], [0.2, 0.4]) == pytest.approx((2 / 3, 0.25, 1.5))
  # 20 seeds at 0 and 20 at 1 over a constant total: a resampled share is Binomial(40, 1/2) / 40,
  # whose 2.5 % and 97.5 % quantiles are 14/40 and 26/40 (P(X <= 13) = 0.019, P(X <= 14) = 0.040),
  # and the 5 % and 95 % ones (a 90 % interval) 15/40 and 25/40.
  half = [0.0] * 20 + [1.0] * 20
  assert intervals.bootstrap_share(half, [1.0] * 40) == pytest.approx((0.5, 14 / 40, 26 / 40))
  assert intervals.bootstrap_share(half, [1.0] * 40, level=0.9) == pytest.approx((0.5, 15 / 40, 25 / 40))
