"""Audited pay: a judge is paid a proper scoring rule of its stated confidence against the checker's
verdict on the audited episodes, and nothing elsewhere (audits as deterrence, arXiv 2605.01643).

The rule is the quadratic (Brier) score 1 - (p - y)^2 of stated probability p and verdict y in
{0, 1}: a judge who believes the answer right with probability q expects 1 - q(1 - q) - (p - q)^2 on
an audited episode, so its best statement is q, and within a confidence vocabulary the level nearest
to q (Brier 1950; Gneiting & Raftery 2007).  The pay is in [0, 1] on an audited episode.
"""
import dataclasses

import jax.numpy as jnp

from marl_jax import losses
from marl_jax.rewards import base


def brier_score(stated, label):
  """1 - (stated - label)^2: a proper scoring rule of a stated probability against a 0/1 verdict."""
  return 1.0 - losses.brier_loss(stated, label)


@base.register("audited")
@dataclasses.dataclass(frozen=True)
class Audited(base.PayRule):
  needs_audits = True
  pays_team_reward = False

  def pay(self, state, reviewed, judged_A):
    score_JxA = brier_score(reviewed.stated_JxA, reviewed.label_A)
    return jnp.where(reviewed.labelled_A, score_JxA, 0.0), state, {}
