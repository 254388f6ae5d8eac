"""Difference (counterfactual) credit: outcome_weight x the team's group-baseline advantage
+ credit_weight x D_r, where D_r = R - mean over K re-runs of the team outcome with role r's messages
resampled from its policy (or made `absent`), the later turns that read them re-sampled and
everything else held fixed (`Layout.resampled_turns`).

With `resample`, the sampled episode and its K re-runs are K + 1 draws of role r's message from the
same policy in the same context, so D_r is C3's leave-one-out baseline for the sampled message.  C3's
credit for each of the K alternatives would need the re-runs' tokens in the update, which trains on
the sampled episodes only."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import checks
from marl_jax.credit import base, baselines


def difference_credit(team_B, team_RxKxB):
  """D_r = R - mean over K counterfactual re-runs of the team outcome: credit_RxB."""
  return team_B[None] - team_RxKxB.mean(1)


def difference_rewards(value_fn, num_agents: int):
  """v(all) - v(all without i) for each agent i: float[num_agents].  `value_fn` maps a bool coalition
  mask [num_agents] to a scalar and is traceable (the masks are evaluated in one vmap)."""
  masks_CxN = np.concatenate([np.ones((1, num_agents), bool), ~np.eye(num_agents, dtype=bool)])
  values_C = jax.vmap(value_fn)(masks_CxN)
  return difference_credit(values_C[0], values_C[1:, None])


@dataclasses.dataclass(frozen=True)
class OutcomeAndCredit(base.Estimator):
  """outcome_weight x the team outcome's group-baseline advantage + credit_weight x a per-role credit
  (the settings `difference` and `shapley` share)."""
  baseline: str = "dr_grpo"  # of the outcome term: grpo | dr_grpo | rloo | none
  outcome_weight: float = 1.0
  credit_weight: float = 1.0

  def check(self, num_roles, group_size):
    base.check_baseline(self.baseline, group_size, whole_advantage=self.credit_weight == 0)
    checks.number("credit.outcome_weight", self.outcome_weight, 0.0)
    checks.number("credit.credit_weight", self.credit_weight, 0.0)

  def mix(self, outcome: base.Outcome, credit_RxB):
    """Advantages adv_RxB, and the credit's mean size per role as `influence`."""
    outcome_B = baselines.group_advantage(outcome.team_B, outcome.group_size, self.baseline)
    adv_RxB = self.outcome_weight * outcome_B[None] + self.credit_weight * credit_RxB
    return adv_RxB, {"influence": jnp.abs(credit_RxB).mean(1)}


@base.register("difference")
@dataclasses.dataclass(frozen=True)
class Difference(OutcomeAndCredit):
  counterfactual: str = "resample"  # resample | absent | replace (base.Reruns)
  samples: int = 2  # K re-runs per role

  def check(self, num_roles, group_size):
    super().check(num_roles, group_size)
    if self.counterfactual not in base.Reruns.MODES:
      raise ValueError(f"config.credit.counterfactual={self.counterfactual!r} is unknown; "
                       f"allowed: {list(base.Reruns.MODES)}")
    checks.integer("credit.samples", self.samples, 1)

  def reruns(self, num_roles):
    return base.Reruns(tuple(map(tuple, np.eye(num_roles, dtype=bool))), self.counterfactual,
                       self.samples)

  def advantages(self, state, outcome, counterfactuals):
    return self.mix(outcome, difference_credit(outcome.team_B, counterfactuals.team_CxKxB))
