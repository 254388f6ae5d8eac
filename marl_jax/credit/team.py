"""Team credit: every role gets the group-baseline advantage of the shared outcome."""
import dataclasses

from marl_jax.credit import base, baselines


@base.register("team")
@dataclasses.dataclass(frozen=True)
class Team(base.Estimator):
  baseline: str = "dr_grpo"  # grpo | dr_grpo | rloo | none

  def check(self, num_roles, group_size):
    base.check_baseline(self.baseline, group_size)

  def advantages(self, state, outcome, counterfactuals):
    adv_B = baselines.group_advantage(outcome.team_B, outcome.group_size, self.baseline)
    return adv_B[None].repeat(outcome.role_RxB.shape[0], 0), {}
