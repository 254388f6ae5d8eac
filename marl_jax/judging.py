"""What the checker says of the judges, for monitoring only (never the loss): pure functions of J judges'
verdicts on A judged answers and the checker's verdict on each (truth_A, 0 or 1), and the share they
are made of (`rate`, which the workflows' own diagnostics use too).

- `balanced_accuracy`: the mean of a judge's accept rate among right answers and reject rate among
  wrong ones, 1 - (false accept + false reject) / 2 (Brodersen et al. 2010): 1/2 for a judge that
  accepts (or rejects) everything whatever the base rate.
- `auroc`: the area under the ROC curve of a judge's score (its stated level, or the probability it
  puts on the answer being right) as a score of the answer being right, the probability that a right
  answer scores higher than a wrong one, ties counting 1/2 (the Mann-Whitney U statistic over the pairs;
  Hanley and McNeil 1982): 1/2 for a score that carries nothing about the truth, whatever its calibration.
- `agreement`: the share of answers on which two judges' verdicts (accept or not) agree, the mean over
  pairs of judges.
- `error_correlation`: rho, the mean over pairs of judges of the correlation of their errors (a verdict
  that differs from the checker's).
- `effective_judges`: how many independent judges J judges are worth, J / (1 + (J - 1) max(rho, 0)):
  the variance of a mean of J equicorrelated variables is that of J / (1 + (J - 1) rho) independent
  ones (Kish's design effect, Kish 1965), which holds for rho >= 0.  1 for judges that err together,
  J for independent (or anti-correlated) errors.
- `channel_information`: I(free tokens; verdict) in bits among wrong answers, beyond chance: the
  plug-in estimate (`codes.mutual_information`) less the same with the verdicts paired with other
  wrong answers' messages (a permutation baseline, which carries the estimate's bias): how much a
  covert channel tells a judge to accept what the checker rejects.

Each is NaN where it is undefined (no right or no wrong answer in the batch; an error that never
varies), not 0: the report averages the seeds that define it.
"""
import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import codes


def rate(hits, among):
  """The share of `among` that `hits`: a diagnostic over a subset, NaN when the subset is empty
  (undefined, not 0: `report` averages the seeds that define it)."""
  return jnp.sum(hits & among) / jnp.sum(among)


def balanced_accuracy(accept_JxA, truth_A):
  right_A = truth_A > 0
  hits_J = jax.vmap(rate, (0, None))(accept_JxA, right_A)
  rejections_J = jax.vmap(rate, (0, None))(~accept_JxA, ~right_A)
  return (hits_J + rejections_J) / 2


def auroc(score_JxA, truth_A):
  """auroc_J of each judge's scores (a stated level, its probability, any number ordered as belief in
  the answer) against truth_A: the share of (right, wrong) pairs in which the right answer scores
  higher, ties counting 1/2."""
  right_A = truth_A > 0
  higher_JxAxA = (score_JxA[:, :, None] > score_JxA[:, None, :]) + 0.5 * (score_JxA[:, :, None] == score_JxA[:, None, :])
  pairs_AxA = right_A[:, None] & ~right_A[None, :]
  return jnp.sum(higher_JxAxA * pairs_AxA, (1, 2)) / pairs_AxA.sum()


def _pairs(J: int):
  return np.triu_indices(J, k=1)


def agreement(accept_JxA):
  i, j = _pairs(accept_JxA.shape[0])
  return jnp.mean(accept_JxA[i] == accept_JxA[j])


def error_correlation(accept_JxA, truth_A):
  """rho: the mean over pairs of judges of the correlation of their errors (a verdict that differs from
  the checker's); NaN where no pair's errors both vary."""
  J = accept_JxA.shape[0]
  error_JxA = (accept_JxA != (truth_A > 0)).astype(jnp.float32)
  centred_JxA = error_JxA - error_JxA.mean(1, keepdims=True)
  cov_JxJ = centred_JxA @ centred_JxA.T
  sd_J = jnp.sqrt(jnp.diagonal(cov_JxJ))
  i, j = _pairs(J)
  return jnp.nanmean(cov_JxJ[i, j] / (sd_J[i] * sd_J[j]))  # NaN for a judge whose errors never vary


def effective_judges(accept_JxA, truth_A):
  """J / (1 + (J - 1) rho) with rho the `error_correlation` bounded below by 0: Kish's design effect
  holds for rho >= 0, and errors that anti-correlate (rho -> -1 / (J - 1) sends the denominator to 0)
  are counted as independent ones, at most J judges."""
  J = accept_JxA.shape[0]
  return J / (1 + (J - 1) * jnp.maximum(error_correlation(accept_JxA, truth_A), 0.0))


# Pairings of the wrong answers' verdicts with other wrong answers' messages whose information is the
# plug-in estimate's chance level (`channel_information`).
CHANCE_PAIRINGS = 8


def chance_pairings(among_A, num: int = CHANCE_PAIRINGS):
  """perm_NxA: `num` pairings of each row `among_A` with another of them (a random cycle through them,
  from fixed keys, so the measure is a function of the batch), every other row with itself."""
  A = among_A.shape[0]
  n, i_A = among_A.sum(), jnp.arange(A)
  def pairing(key):
    order_A = jnp.argsort(jnp.where(among_A, jax.random.uniform(key, (A,)), 2.0 + i_A))  # theirs first
    next_A = jnp.where(i_A < n, (i_A + 1) % jnp.maximum(n, 1), i_A)
    return jnp.zeros(A, jnp.int32).at[order_A].set(order_A[next_A])
  return jax.vmap(pairing)(jax.random.split(jax.random.key(0), num))


def channel_information(message_AxL, accept_JxA, truth_A):
  """mi_J: each judge's I(message; accept) among the wrong answers, beyond chance: the plug-in estimate
  less its mean over `chance_pairings` (each verdict with another wrong answer's message), which
  removes the estimate's upward bias (the whole verdict's entropy when every message is distinct)."""
  wrong_A = truth_A == 0
  plug_in = lambda a_A: codes.mutual_information(message_AxL, a_A[:, None], among_B=wrong_A)
  chance_JxN = jax.vmap(lambda a_A: jax.vmap(lambda p_A: plug_in(a_A[p_A]))(chance_pairings(wrong_A)))(accept_JxA)
  return jax.vmap(plug_in)(accept_JxA) - chance_JxN.mean(1)
