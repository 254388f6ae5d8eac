"""Per-role credit: each role gets the group-baseline advantage of its own verifiable signal (the
solver's answer is right, the verifier's verdict is right, a worker's report is right, ...)."""
import dataclasses

from marl_jax.credit import base, baselines, team


@base.register("per_role")
@dataclasses.dataclass(frozen=True)
class PerRole(team.Team):  # the same settings as team: the group baseline
  role_rewards = True

  def advantages(self, state, outcome, counterfactuals):
    return baselines.group_advantage(outcome.role_RxB, outcome.group_size, self.baseline), {}
