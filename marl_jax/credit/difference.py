"""Difference (counterfactual) credit: outcome_weight x the team's group-baseline advantage
+ credit_weight x D_r, where D_r = R - mean over K re-runs of the team outcome with role r's messages
resampled from its policy (or made `absent`), the later turns that read them re-sampled and
everything else held fixed (`Layout.resampled_turns`)."""
import dataclasses

import jax.numpy as jnp
import numpy as np

from marl_jax.credit import base, baselines


def difference_credit(team_B, team_RxKxB):
  """D_r = R - mean over K counterfactual re-runs of the team outcome: credit_RxB."""
  return team_B[None] - team_RxKxB.mean(1)


@base.register("difference")
@dataclasses.dataclass(frozen=True)
class Difference(base.Estimator):
  baseline: str = "dr_grpo"  # of the outcome term: grpo | dr_grpo | rloo | none
  outcome_weight: float = 1.0
  credit_weight: float = 1.0
  counterfactual: str = "resample"  # resample | absent | replace (base.Reruns)
  samples: int = 2  # K re-runs per role

  def check(self, num_roles, group_size):
    base.check_baseline(self.baseline, group_size)
    if self.counterfactual not in base.Reruns.MODES:
      raise ValueError(f"config.credit.counterfactual={self.counterfactual!r} is unknown; "
                       f"allowed: {list(base.Reruns.MODES)}")
    if self.samples < 1:
      raise ValueError(f"config.credit.samples={self.samples}; K must be >= 1")

  def reruns(self, num_roles):
    return base.Reruns(tuple(map(tuple, np.eye(num_roles, dtype=bool))), self.counterfactual,
                       self.samples)

  def advantages(self, state, outcome, counterfactuals):
    d_RxB = difference_credit(outcome.team_B, counterfactuals.team_CxKxB)
    outcome_B = baselines.group_advantage(outcome.team_B, outcome.group_size, self.baseline)
    adv_RxB = self.outcome_weight * outcome_B[None] + self.credit_weight * d_RxB
    return adv_RxB, {"influence": jnp.abs(d_RxB).mean(1)}
