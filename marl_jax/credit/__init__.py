"""Credit assignment: who is rewarded for a shared outcome, and by how much.

Each returns adv_RxB, one advantage per role per episode:
  team:       every role gets the group-baseline advantage of the team outcome.
  per_role:   each role gets the group-baseline advantage of its own verifiable signal.
  difference: outcome_weight x team advantage + credit_weight x D_r, where the counterfactual
              (difference) credit D_r = R - mean_k R(role r's messages resampled / made absent, the
              later turns that read them re-sampled, everything else frozen).
"""
from marl_jax.credit.baselines import BASELINES, group_advantage

CREDITS = ("team", "per_role", "difference")
COUNTERFACTUALS = ("resample", "absent")


def difference_credit(team_B, counterfactual_team_RxKxB):
  """D_r = R - mean over K counterfactual re-runs of the team outcome: credit_RxB."""
  return team_B[None] - counterfactual_team_RxKxB.mean(1)


def advantages(rl, rewards, counterfactual_team_RxKxB=None):
  """Combines the outcome advantage with per-role credit as `rl.credit` says: adv_RxB."""
  team_B, role_RxB = rewards["team_B"], rewards["role_RxB"]
  G, kind = rl.group_size, rl.baseline
  if rl.credit == "team":
    return group_advantage(team_B, G, kind)[None].repeat(role_RxB.shape[0], 0)
  if rl.credit == "per_role":
    return group_advantage(role_RxB, G, kind)
  if rl.credit == "difference":
    outcome_B = group_advantage(team_B, G, kind)
    return rl.outcome_weight * outcome_B[None] + rl.credit_weight * difference_credit(
        team_B, counterfactual_team_RxKxB)
  raise ValueError(f"config.rl.credit={rl.credit!r} is unknown; allowed: {list(CREDITS)}")
