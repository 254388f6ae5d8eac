"""Group baselines over G samples of the same problem (rows b*G .. b*G+G-1 share a problem)."""
import jax.numpy as jnp

BASELINES = ("grpo", "dr_grpo", "rloo", "none")


def group_advantage(r_xB, group_size: int, kind: str, eps: float = 1e-6):
  """Advantage of each sample against its group.  Works on any leading axes.

  grpo:    (r - mean) / (std + eps)     (Shao et al. 2024)
  dr_grpo: r - mean                      (Liu et al. 2025: no std normalisation)
  rloo:    r_i - mean_{j != i} r_j       (leave-one-out, Ahmadian et al. 2024)
  none:    r
  """
  if kind not in BASELINES:
    raise ValueError(f"config.credit.baseline={kind!r} is unknown; allowed: {list(BASELINES)}")
  if kind == "none":
    return r_xB
  r_xNxG = r_xB.reshape(*r_xB.shape[:-1], -1, group_size)
  # Centred as deviations from the group's first sample: a group of equal rewards gives exactly 0.
  # (In float32 the mean of eight 0.7s need not be 0.7: r - mean would leave ~1e-8, which grpo's
  # division by a std of the same size turned into advantages of ~0.06.)
  d_xNxG = r_xNxG - r_xNxG[..., :1]
  centred_xNxG = d_xNxG - d_xNxG.mean(-1, keepdims=True)
  if kind == "grpo":
    adv = centred_xNxG / (jnp.sqrt((centred_xNxG ** 2).mean(-1, keepdims=True)) + eps)
  elif kind == "dr_grpo":
    adv = centred_xNxG
  else:  # rloo: r_i - (sum - r_i)/(G-1)
    adv = centred_xNxG * group_size / (group_size - 1)
  return adv.reshape(r_xB.shape)
