"""Reputation: several judges' verdicts aggregate into the judged roles' reward, each weighted by its
audited track record; a judge is paid the judged roles' reward (as under `team`), so what its verdict
is worth to the team is what its record says.

The record is a Beta posterior of each judge's accuracy on audited episodes (its verdict, accept or
not, against the checker's), from the prior Beta(`prior_right`, `prior_wrong`), carried in
`TrainState.reward`.  A judge's weight is the log-odds of its posterior mean accuracy a, log(a / (1 -
a)), the optimal weight of independent judges of known accuracy in a weighted vote (Nitzan and Paroush
1982), clipped at 0 so that a judge no better than chance counts for nothing; the reward is the
weighted mean of the judges' stated probabilities (their plain mean while every weight is 0).  The
weights come from the record before this step's audits.
"""
import dataclasses

import jax.numpy as jnp

from marl_jax.rewards import base


def weights(right_J, wrong_J):
  """Each judge's share of the verdict: clipped log-odds of its posterior mean accuracy, normalised
  (equal shares while all are 0)."""
  w_J = jnp.maximum(jnp.log(right_J) - jnp.log(wrong_J), 0.0)
  total = w_J.sum()
  return jnp.where(total > 0, w_J / jnp.where(total > 0, total, 1.0), 1.0 / w_J.shape[0])


@base.register("reputation")
@dataclasses.dataclass(frozen=True)
class Reputation(base.BetaPrior):
  """The prior (`prior_right`, `prior_wrong`) is of each judge's audited accuracy."""
  min_judges = 2
  needs_audits = True

  def init(self, num_judges):
    """counts_2xJ: each judge's posterior pseudo-counts of right and wrong audited verdicts."""
    return jnp.stack([jnp.full(num_judges, self.prior_right), jnp.full(num_judges, self.prior_wrong)])

  def aggregate(self, state, reviewed):
    return weights(*state) @ reviewed.read_JxA

  def pay(self, state, reviewed, judged_A):
    agree_JxA = reviewed.accept_JxA == (reviewed.label_A > 0)
    right_J = (agree_JxA & reviewed.labelled_A).sum(1)
    wrong_J = (~agree_JxA & reviewed.labelled_A).sum(1)
    counts_2xJ = state + jnp.stack([right_J, wrong_J])
    metrics = {"reputation": counts_2xJ[0] / counts_2xJ.sum(0), "weight": weights(*state)}
    return jnp.broadcast_to(judged_A, reviewed.level_JxA.shape), counts_2xJ, metrics
