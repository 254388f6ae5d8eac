"""Balanced audited pay: the Brier score of a judge's statement on audited episodes (as `audited`), each
audited answer weighted by the inverse of its class's share, so that right and wrong answers weigh the
same in the judge's pay whatever the base rate; the judged roles get the judges' statements turned back
into probabilities at that base rate.

Why: under `audited` a judge that says the base rate is paid more than one that judges whenever the
judge's evidence is weak against the base rate (at 7 % right answers, stating 0 for every answer is
the best a judge of AUROC 0.7 can do, docs/results/peer_review.md).  Weighting a right answer by
1 / (2 pi) and a wrong one by 1 / (2 (1 - pi)), for base rate pi, a judge who believes the answer right
with probability q expects q (1 - (1 - s)^2) / (2 pi) + (1 - q) (1 - s^2) / (2 (1 - pi)) for stating s,
largest where s / (1 - s) = (q / (1 - q)) ((1 - pi) / pi): its belief at even prior odds, the evidence
without the base rate.  A judge that knows nothing (q = pi) does best to state 1/2, and a constant
statement is paid less than any statement that tells right from wrong.  Each stated s is then read at
the base rate, s pi / (s pi + (1 - s) (1 - pi)) (the judge's belief q when it states its best), and the
judged roles' reward is the judges' mean of those.

The base rate is a Beta posterior of the audited answers' accuracy, from Beta(`prior_right`,
`prior_wrong`), carried in `TrainState.reward`; the weights and the reading use the record before this
step's audits.  Pay is in [0, 1 / (2 min(pi, 1 - pi))] on an audited episode, 0 elsewhere.
"""
import dataclasses

import jax.numpy as jnp

from marl_jax.rewards import audited, base


def base_rate(counts_2):
  """The posterior mean accuracy of the audited answers from counts_2 = (right, wrong)."""
  return counts_2[0] / counts_2.sum()


def class_weight(label_A, rate):
  """1 / (2 rate) for a right answer, 1 / (2 (1 - rate)) for a wrong one: each class's total weight is
  half the answers' whatever the base rate."""
  return jnp.where(label_A > 0, 0.5 / rate, 0.5 / (1 - rate))


def at_base_rate(stated, rate):
  """A probability stated at even prior odds read at prior `rate` (odds times rate / (1 - rate))."""
  return stated * rate / (stated * rate + (1 - stated) * (1 - rate))


@base.register("audited_balanced")
@dataclasses.dataclass(frozen=True)
class AuditedBalanced(base.BetaPrior):
  """The prior (`prior_right`, `prior_wrong`) is of the audited answers' accuracy."""
  needs_audits = True
  pays_team_reward = False

  def init(self, num_judges):
    """counts_2: pseudo-counts of right and wrong audited answers."""
    return jnp.array([self.prior_right, self.prior_wrong], jnp.float32)

  def label_weight(self, state, label_A):
    """The class weights: a judge taught by a proper score states its belief at even prior odds, as its
    pay makes it state, so the aggregate's reading at the base rate applies once."""
    return class_weight(label_A, base_rate(state))

  def aggregate(self, state, reviewed):
    return at_base_rate(reviewed.read_JxA, base_rate(state)).mean(0)

  def pay(self, state, reviewed, judged_A):
    rate = base_rate(state)
    score_JxA = class_weight(reviewed.label_A, rate) * audited.brier_score(reviewed.stated_JxA, reviewed.label_A)
    right = (reviewed.labelled_A & (reviewed.label_A > 0)).sum()
    counts_2 = state + jnp.stack([right, reviewed.labelled_A.sum() - right])
    return jnp.where(reviewed.labelled_A, score_JxA, 0.0), counts_2, {"base_rate": rate}
