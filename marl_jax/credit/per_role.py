"""Per-role credit: each role gets the group-baseline advantage of its own verifiable signal (the
solver's answer is right, the verifier's verdict is right, a worker's report is right, ...)."""
import dataclasses

from marl_jax.credit import base, baselines


@base.register("per_role")
@dataclasses.dataclass(frozen=True)
class PerRole(base.Estimator):
  baseline: str = "dr_grpo"  # grpo | dr_grpo | rloo | none

  def check(self, num_roles, group_size):
    base.check_baseline(self.baseline, group_size)

  def advantages(self, state, outcome, team_CxKxB):
    return baselines.group_advantage(outcome.role_RxB, outcome.group_size, self.baseline), {}
