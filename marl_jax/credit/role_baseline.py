"""Role baseline: A_r = r - b_r, where b_r is an exponential moving average of role r's reward over
past steps (bias-corrected, as Adam's moments), the role-conditioned baseline of self-play training.
The reward is the team outcome (`signal='team'`) or the role's own verifiable signal (`'role'`).
A stateful estimator: b_r lives in `TrainState.credit`, is checkpointed and resumed exactly."""
import dataclasses

import jax.numpy as jnp

from marl_jax import checks, parallel
from marl_jax.credit import base

SIGNALS = ("team", "role")


def check_signal(signal: str) -> None:
  if signal not in SIGNALS:
    raise ValueError(f"config.credit.signal={signal!r} is unknown; allowed: {list(SIGNALS)}")


def reward_RxB(outcome: base.Outcome, signal: str):
  """Each role's reward: the team outcome (`team`) or its own verifiable signal (`role`)."""
  if signal == "team":
    return jnp.broadcast_to(outcome.team_B, outcome.role_RxB.shape)
  return outcome.role_RxB


@base.register("role_baseline")
@dataclasses.dataclass(frozen=True)
class RoleBaseline(base.Estimator):
  decay: float = 0.9
  signal: str = "team"  # team | role

  @property
  def role_rewards(self):
    return self.signal == "role"

  def check(self, num_roles, group_size):
    checks.number("credit.decay", self.decay, 0, below=1)
    check_signal(self.signal)

  def init(self, key, layout):
    return {"ema_R": jnp.zeros(len(layout.roles)), "updates": jnp.zeros((), jnp.int32)}

  def baseline_R(self, state):
    # Bias correction: after n updates from zero, the average's weights sum to 1 - decay^n.
    return state["ema_R"] / jnp.maximum(1.0 - self.decay ** state["updates"], 1e-12)

  def advantages(self, state, outcome, counterfactuals):
    baseline_R = self.baseline_R(state)
    return reward_RxB(outcome, self.signal) - baseline_R[:, None], {"baseline": baseline_R}

  def update(self, state, outcome):
    mean_R = parallel.mean_over_devices(reward_RxB(outcome, self.signal).mean(1))
    ema_R = self.decay * state["ema_R"] + (1.0 - self.decay) * mean_R
    return {"ema_R": ema_R, "updates": state["updates"] + 1}, {}
