"""Role-normalised credit: the group-baseline advantage of each role's reward (the team outcome, or
the role's own verifiable signal), then standardised per role, (a - mean_r) / (std_r + eps) over all
of role r's rows of the global batch, so every role's advantages have the same scale (per-agent
normalisation of multi-agent GRPO variants)."""
import dataclasses

import jax.numpy as jnp

from marl_jax import parallel
from marl_jax.credit import base, baselines, role_baseline

EPS = 1e-6


@base.register("role_normalized")
@dataclasses.dataclass(frozen=True)
class RoleNormalized(base.Estimator):
  baseline: str = "dr_grpo"  # grpo | dr_grpo | rloo | none
  signal: str = "team"  # team | role

  @property
  def role_rewards(self):
    return self.signal == "role"

  def check(self, num_roles, group_size):
    base.check_baseline(self.baseline, group_size)
    role_baseline.check_signal(self.signal)

  def advantages(self, state, outcome, counterfactuals):
    reward_RxB = role_baseline.reward_RxB(outcome, self.signal)
    a_RxB = baselines.group_advantage(reward_RxB, outcome.group_size, self.baseline)
    # Moments over the global batch (every device holds the same number of rows), in two passes and
    # about a value every device holds (the largest), so that equal advantages standardise to exactly 0
    # rather than to rounding over a rounding-level std.
    d_RxB = a_RxB - parallel.max_over_devices(a_RxB.max(1))[:, None]
    centred_RxB = d_RxB - parallel.mean_over_devices(d_RxB.mean(1))[:, None]
    std_R = jnp.sqrt(parallel.mean_over_devices((centred_RxB ** 2).mean(1)))
    return centred_RxB / (std_R[:, None] + EPS), {"advantage_std": std_R}
