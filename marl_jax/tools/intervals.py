"""95% intervals over seeds, small pure functions of per-seed arrays that every results table shares:
the mean's Student t interval (`mean_ci`), a difference of two runs' means with Welch's
(`welch_diff`), a ratio of two runs' means by a percentile bootstrap (`bootstrap_share`), and whether
a difference is established (`verdict`)."""
import math

import numpy as np
from scipy import stats

LEVEL = 0.95
BOOTSTRAP_DRAWS, BOOTSTRAP_SEED = 10_000, 0


def t_quantile(p: float, dof: float) -> float:
  """The p quantile of Student's t with `dof` (>= 1, possibly fractional) degrees of freedom."""
  if not dof >= 1:
    raise ValueError(f"t quantile needs dof >= 1, got {dof}")
  return float(stats.t.ppf(p, dof))


def mean_ci(values, level: float = LEVEL) -> tuple[float, float]:
  """Mean and the half-width of its Student t interval (n − 1 dof); nan half-width with one value, nan
  mean with none."""
  x = np.asarray(values, dtype=np.float64).ravel()
  if len(x) < 2:
    return (float(x[0]) if len(x) else math.nan), math.nan
  return float(x.mean()), t_quantile((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))


def welch_diff(a, b, level: float = LEVEL) -> tuple[float, float, float]:
  """mean(b) − mean(a), the half-width of its Welch interval, and the Welch–Satterthwaite dof.

  Half-width and dof are nan when either side has one value, or neither varies (no spread to scale).
  """
  a, b = (np.asarray(x, dtype=np.float64).ravel() for x in (a, b))
  if not (len(a) and len(b)):
    return math.nan, math.nan, math.nan
  diff = float(b.mean() - a.mean())
  if min(len(a), len(b)) < 2:
    return diff, math.nan, math.nan
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)  # squared standard errors
  if va + vb == 0:
    return diff, math.nan, math.nan
  dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
  return diff, t_quantile((1 + level) / 2, dof) * math.sqrt(va + vb), float(dof)


def bootstrap_share(part, total, level: float = LEVEL, draws: int = BOOTSTRAP_DRAWS,
                    seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
  """mean(part) / mean(total) and its percentile bootstrap interval.

  `part` and `total` come from different runs, so each run's seeds are resampled independently; the
  rng seed is fixed so that a report prints the same interval every time.  nan interval with one seed.
  """
  part, total = (np.asarray(x, dtype=np.float64).ravel() for x in (part, total))
  share = float(part.mean() / total.mean())
  if min(len(part), len(total)) < 2:
    return share, math.nan, math.nan
  rng = np.random.default_rng(seed)
  resample = lambda x: x[rng.integers(0, len(x), (draws, len(x)))].mean(1)
  with np.errstate(divide="ignore", invalid="ignore"):  # a resampled total of 0 gives ±inf or nan
    shares = resample(part) / resample(total)
  lo, hi = np.nanpercentile(shares, [50 * (1 - level), 50 * (1 + level)])
  return share, float(lo), float(hi)


def verdict(diff: float, half: float) -> str:
  if not math.isfinite(half):
    return "n/a"
  return "established" if abs(diff) > half else "not established"


def defined(values_S) -> np.ndarray:
  """The seeds' values that are defined: a diagnostic over a subset (e.g. `judge_precision` among
  episodes with a right candidate) is NaN for a seed whose subset was empty."""
  return values_S[np.isfinite(values_S)]
