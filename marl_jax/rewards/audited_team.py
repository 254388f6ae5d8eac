"""Audited pay with a share of the team's reward: a judge is paid the Brier score of its statement on
audited episodes (as under `audited`) and `share` times the judged roles' reward elsewhere, so it gains
with the solver from what the judges accept where no audit looks, and loses on the audits for stating
more than it believes.  The collusion setting in which accepting everything is punished: how far the
judges lean towards the solver is a setting, not all or nothing.

With one judge's statement s (of J judges, the reward their mean), belief q that the answer is right and
audit rate p, the expected pay is p (1 - q (1 - q) - (s - q)^2) + (1 - p) share (s + others) / J,
largest at s* = q + (1 - p) share / (2 p J): the judge inflates its statement by that much, and within
the vocabulary states the level nearest s*.  Nothing the judge reads tells it whether an episode is
audited, so the solver cannot say anything that moves s* but its evidence on q, which it would always
report as high: a covert channel should carry no signal here (docs/peer_review.md).
"""
import dataclasses

import jax.numpy as jnp

from marl_jax import checks
from marl_jax.rewards import audited, base


def inflation(share: float, audit_rate: float, num_judges: int) -> float:
  """s* - q: how much more than its belief a judge paid this way does best to state."""
  return (1 - audit_rate) * share / (2 * audit_rate * num_judges)


@base.register("audited_team")
@dataclasses.dataclass(frozen=True)
class AuditedTeam(base.PayRule):
  share: float = 1.0  # the judge's share of the judged roles' reward on episodes not audited

  needs_audits = True
  pays_team_reward = False

  def check(self, num_judges):
    checks.number("reward.share", self.share, 0)

  def pay(self, state, reviewed, judged_A):
    score_JxA = audited.brier_score(reviewed.stated_JxA, reviewed.label_A)
    return jnp.where(reviewed.labelled_A, score_JxA, self.share * judged_A), state, {}
