"""Exact credit references, to grade estimators against: per episode, from the roles' outcomes (a success
mask, or a joint action) and a value function of them (e.g. `Contribution.game_value`,
`MatrixGame.payoffs()`).  Pure jnp, jit- and vmap-friendly. ::

  Shapley (absent semantics): v(S) = value of the outcome with every role outside S failing.
  Expected difference (resample semantics, under the current policy):
    D_r = v(a) - E_{a'_r ~ pi_r} v(a with a_r replaced by a'_r), the others' actions held fixed
  (COMA's counterfactual advantage with the exact Q; for a success mask with success probability p_r,
  D_r = (m_r - p_r) (v(m, m_r = 1) - v(m, m_r = 0))).
"""
import jax
import jax.numpy as jnp

from marl_jax.credit.shapley import shapley_values


def exact_shapley(game_value_fn, success_BxR):
  """phi_BxR: each role's exact Shapley value of the game on its episode's success mask (roles outside
  a coalition fail, as if absent)."""
  success_BxR = jnp.asarray(success_BxR, bool)
  num_roles = success_BxR.shape[-1]
  return jax.vmap(lambda success_R: shapley_values(
      lambda coalition_R: game_value_fn(success_R & coalition_R), num_roles))(success_BxR)


def expected_difference(value_fn, action_R, probs_RxA):
  """D_R: v(a) - sum_{a'} probs[r, a'] v(a with a_r = a'), for a joint action a (int[R]) of a game
  `value_fn(action_R) -> scalar` and each role's action distribution `probs_RxA`."""
  R, A = probs_RxA.shape
  replaced = lambda r, a: value_fn(action_R.at[r].set(a))
  value_RxA = jax.vmap(jax.vmap(replaced, (None, 0)), (0, None))(jnp.arange(R), jnp.arange(A))
  return value_fn(action_R) - (probs_RxA * value_RxA).sum(1)


def exact_difference(game_value_fn, success_BxR, p_R):
  """D_BxR: exact expected difference credit of each role under the current policy, role r succeeding
  with probability p_r (`p_R`, or per episode `p_BxR`), the other roles' outcomes held fixed."""
  success_BxR = jnp.asarray(success_BxR, jnp.int32)
  p_BxR = jnp.broadcast_to(jnp.asarray(p_R, jnp.float32), success_BxR.shape)
  probs_BxRx2 = jnp.stack([1.0 - p_BxR, p_BxR], -1)
  return jax.vmap(lambda s_R, probs_Rx2: expected_difference(game_value_fn, s_R, probs_Rx2))(
      success_BxR, probs_BxRx2)


def matrix_game_difference(payoffs_AxA, row, column, row_probs_A, column_probs_A):
  """D_2: the row and the column player's exact expected difference credit of the joint action
  (row, column) when the row player plays `row_probs_A` and the column player `column_probs_A`."""
  payoffs_AxA = jnp.asarray(payoffs_AxA)
  return expected_difference(lambda a_2: payoffs_AxA[a_2[0], a_2[1]], jnp.array([row, column]),
                             jnp.stack([row_probs_A, column_probs_A]))
