"""Shapley credit: `phi_i = sum over coalitions C without i of |C|!(n-|C|-1)!/n! (v(C + i) - v(C))`.

The pure API works on any traceable `value_fn(mask_N) -> scalar`::

  shapley_values(value_fn, n)                                    exact: all 2^n coalitions, one vmap
  shapley_values(value_fn, n, key=key, num_permutations=P)       Monte Carlo over P random orders

Both evaluate coalition values, then combine them with one of two functions the `shapley` estimator
shares: `shapley_from_values` (the 2^n coalitions of `coalitions(n)`, in order) and
`shapley_from_permutations` (the n + 1 prefixes of each order, `prefix_coalitions(perm_PxN)`).

The estimator's coalition value v(S) is the team outcome with the roles outside S `absent`: every
coalition but the full one is one re-run (the full one is the sampled episode).  Exact up to
`max_exact_roles` roles (2^R - 1 re-runs); above it, the distinct prefixes of `num_permutations`
orders drawn with numpy from `permutation_seed` (static, since the re-runs are), at most P(R-1) + 1.

Its credits add up to v(all) - v(nobody): uncentred, every role of a winning episode gets credit however
often the team wins that problem.  `centre` (a group baseline of `baselines.py` that only subtracts:
`dr_grpo`, `rloo`) centres it on the group of samples of the same problem: phi'_r is the Shapley value
of the centred game v'(S) = v(S) - b(S), b(S) the group's mean of v(S) (`rloo`: of the other samples),
which by linearity is phi_r minus that baseline of phi_r::

  phi'_r = phi_r - b(phi_r),   sum_r phi'_r = v(all) - b(all)

(efficiency: sum_r phi'_r = v'(all) - v'(nobody), and v(nobody), every role absent, is the same in the
whole group: it depends on the problem alone).  A role that is a null player in every sample of the
group still gets 0, and a group whose coalitions all score the same gets 0 everywhere; splitting the
baseline equally instead (phi_r - (b(all) - v(nobody)) / R) would give every null player a share of it.
"""
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import checks
from marl_jax.credit import base, baselines, difference


def coalitions(num_agents: int) -> np.ndarray:
  """All 2^n coalitions, masks_CxN: agent i is in coalition c when bit i of c is set (c = 0 is the
  empty coalition, c = 2^n - 1 the full one)."""
  return (np.arange(2 ** num_agents)[:, None] >> np.arange(num_agents)) & 1 == 1


@functools.lru_cache(maxsize=None)
def _weights_NxC(num_agents: int) -> np.ndarray:
  # phi_i = sum_c W[i, c] v(c): +w(|c| - 1) where i is in c (the gain of joining c minus i), -w(|c|)
  # where it is not (the value c had before i joined); w(s) = s!(n-s-1)!/n! = 1/(n binom(n-1, s)).
  n = num_agents
  w_S = np.array([1.0 / (n * math.comb(n - 1, s)) for s in range(n)] + [0.0])  # w(n): never used
  masks_CxN = coalitions(n)
  size_C = masks_CxN.sum(1)
  return np.where(masks_CxN.T, w_S[np.maximum(size_C - 1, 0)], -w_S[size_C])


def shapley_from_values(values_Cx):
  """Exact Shapley values phi_Nx... from the values of all 2^n coalitions in `coalitions(n)` order
  (any trailing axes, e.g. a batch)."""
  values_Cx = jnp.asarray(values_Cx)
  num_agents = values_Cx.shape[0].bit_length() - 1
  if values_Cx.shape[0] != 2 ** num_agents:
    raise ValueError(f"{values_Cx.shape[0]} coalition values; exact Shapley needs 2^n of them")
  dtype = jnp.promote_types(values_Cx.dtype, jnp.float32)
  # HIGHEST: a TPU's default float32 matmul rounds the values to bfloat16.
  return jnp.tensordot(jnp.asarray(_weights_NxC(num_agents), dtype), values_Cx.astype(dtype), axes=1,
                       precision=jax.lax.Precision.HIGHEST)


def prefix_coalitions(perm_PxN):
  """The n + 1 prefixes of each order, masks_PxKxN (K = n + 1; prefix k holds the first k agents of
  perm[p]).  Works on numpy (static) or jax arrays."""
  num_agents = perm_PxN.shape[-1]
  return perm_PxN.argsort(-1)[:, None, :] < np.arange(num_agents + 1)[:, None]


def shapley_from_permutations(values_PxKx, perm_PxN):
  """Monte Carlo Shapley values phi_Nx...: each agent's mean marginal contribution over the orders,
  from the values of their `prefix_coalitions` (any trailing axes)."""
  values_PxKx = jnp.asarray(values_PxKx)
  gain_PxNx = values_PxKx[:, 1:] - values_PxKx[:, :-1]  # the gain of the k-th agent of each order
  # Agent i joins order p at position rank[p, i].
  gain_by_agent_PxNx = jax.vmap(lambda gain_Nx, rank_N: gain_Nx[rank_N])(gain_PxNx, perm_PxN.argsort(-1))
  return gain_by_agent_PxNx.mean(0)


def shapley_values(value_fn, num_agents: int, *, key=None, num_permutations: int | None = None):
  """Shapley values float[num_agents] of the game `value_fn` (bool mask [num_agents] -> scalar,
  traceable).  Exact over all 2^n coalitions when `num_permutations` is None (cost n 2^n); otherwise
  Monte Carlo over `num_permutations` random orders drawn from `key` (cost P (n + 1) evaluations)."""
  if num_permutations is None:
    return shapley_from_values(jax.vmap(value_fn)(coalitions(num_agents)))
  if num_permutations < 1:
    raise ValueError(f"num_permutations={num_permutations}; allowed: None (exact) or >= 1")
  if key is None:
    raise ValueError("Monte Carlo Shapley (num_permutations set) needs a key")
  keys = jax.random.split(key, num_permutations)
  perm_PxN = jax.vmap(lambda k: jax.random.permutation(k, num_agents))(keys)
  values_PxK = jax.vmap(jax.vmap(value_fn))(prefix_coalitions(perm_PxN))
  return shapley_from_permutations(values_PxK, perm_PxN)


CENTRES = ("none", "dr_grpo", "rloo")


@dataclasses.dataclass(frozen=True)
class _Plan:
  """The coalitions the estimator re-runs (changed_CxR: the roles outside each coalition) and, for
  Monte Carlo, its orders and where each prefix's value is: index_PxK into the re-run values followed
  by the sampled episode's (the full coalition)."""
  changed_CxR: np.ndarray
  perm_PxR: np.ndarray | None = None
  index_PxK: np.ndarray | None = None


@functools.lru_cache(maxsize=None)
def _plan(num_roles: int, exact: bool, num_permutations: int, seed: int) -> _Plan:
  if exact:
    return _Plan(~coalitions(num_roles)[:-1])
  rng = np.random.default_rng(seed)
  perm_PxR = np.stack([rng.permutation(num_roles) for _ in range(num_permutations)])
  masks_PxKxR = prefix_coalitions(perm_PxR)
  # np.unique sorts the masks, so the full coalition (all True) comes last: the sampled episode.
  unique_UxR, index = np.unique(masks_PxKxR.reshape(-1, num_roles), axis=0, return_inverse=True)
  return _Plan(~unique_UxR[:-1], perm_PxR, index.reshape(masks_PxKxR.shape[:2]))


@base.register("shapley")
@dataclasses.dataclass(frozen=True)
class Shapley(difference.OutcomeAndCredit):
  max_exact_roles: int = 6  # exact over all 2^R coalitions up to this many roles
  num_permutations: int = 16  # Monte Carlo orders above it (0: exact only)
  permutation_seed: int = 0
  centre: str = "none"  # none | dr_grpo | rloo: the group baseline phi_r is centred with (module doc)

  def check(self, num_roles, group_size):
    super().check(num_roles, group_size)
    if self.centre not in CENTRES:
      raise ValueError(f"config.credit.centre={self.centre!r} is unknown; allowed: {list(CENTRES)} (grpo's "
                       f"division by the group's spread would break the credits' sum)")
    if self.centre != "none" and group_size < 2:
      raise ValueError(f"config.credit.centre={self.centre!r} needs config.rl.group_size >= 2 (a group of one "
                       f"sample is its own baseline: every credit 0); allowed with group_size 1: 'none'")
    checks.integer("credit.max_exact_roles", self.max_exact_roles, 0)
    checks.integer("credit.num_permutations", self.num_permutations, 0,
                   note="0: exact only; Monte Carlo above config.credit.max_exact_roles")
    checks.integer("credit.permutation_seed", self.permutation_seed, 0, note="numpy's generator seed")
    if num_roles > self.max_exact_roles and self.num_permutations == 0:
      raise ValueError(f"config.credit.num_permutations=0 asks for exact Shapley, but the protocol has "
                       f"{num_roles} roles > config.credit.max_exact_roles={self.max_exact_roles} "
                       f"(2^R - 1 re-runs); raise config.credit.max_exact_roles to >= {num_roles} or "
                       f"set config.credit.num_permutations >= 1")

  def plan(self, num_roles: int) -> _Plan:
    return _plan(num_roles, num_roles <= self.max_exact_roles, self.num_permutations,
                 self.permutation_seed)

  def reruns(self, num_roles):
    return base.Reruns(tuple(map(tuple, self.plan(num_roles).changed_CxR.tolist())), "absent", 1)

  def advantages(self, state, outcome, counterfactuals):
    plan = self.plan(outcome.role_RxB.shape[0])
    values_CxB = jnp.concatenate([counterfactuals.team_CxKxB[:, 0], outcome.team_B[None]])
    if plan.perm_PxR is None:
      phi_RxB = shapley_from_values(values_CxB)
    else:
      phi_RxB = shapley_from_permutations(values_CxB[plan.index_PxK], plan.perm_PxR)
    phi_RxB = baselines.group_advantage(phi_RxB, outcome.group_size, self.centre)
    adv_RxB, metrics = self.mix(outcome, phi_RxB)
    return adv_RxB, {**metrics, "reruns_per_episode": jnp.float32(len(plan.changed_CxR))}
