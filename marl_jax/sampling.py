"""Sampling a whole protocol transcript: prefill the prompt, then one `lax.scan` over canvas positions.

At each position every view (parameter set x visibility) reads the new token into its KV cache; the
next token is written by the environment (prompt, role markers, forced overrides) or sampled from
the author role's view.  Teacher-forced tokens take the same path, so a counterfactual re-run is
just `generate` with more of the canvas forced.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import model as model_lib
from marl_jax import text
from marl_jax.protocols.engine import Layout

# Tokens a policy never writes: padding, BOS and role markers (the environment's), the counterfactual
# <absent> message, and the reserved tail of the vocabulary.
_ENV_ONLY_V = np.array([t.startswith(("<role", "<unused")) for t in text.TOKENS])
_ENV_ONLY_V[[text.PAD, text.BOS, text.ABSENT]] = True


def policy_log_probs(logits_xV, temperature: float):
  """Log-probs of the policy that samples at `temperature`; training uses the same distribution."""
  return jax.nn.log_softmax(jnp.where(_ENV_ONLY_V, -1e9, logits_xV / temperature), axis=-1)


def gather_params(params_R, view_set_V):
  return jax.tree.map(lambda p: p[np.asarray(view_set_V)], params_R)


def generate(cfg: model_lib.ModelConfig, layout: Layout, params_R, canvas_BxT, force_BxT, key_B,
             temperature: float, greedy: bool = False):
  """Fills the canvas; returns tokens_BxT, the sampling log-probs logp_BxT and the mask sampled_BxT.

  `canvas_BxT` holds the prompt and any forced tokens (where `force_BxT`); environment positions
  (role markers) come from the layout.  A message closes at EOS (the rest of its slot is PAD); a token
  in the turn's `ends_episode_on` closes the episode (every later position is PAD).
  """
  P, T = layout.prompt_len, layout.length
  B = canvas_BxT.shape[0]
  params_V = gather_params(params_R, layout.view_set_V)
  visible_VxT = jnp.asarray(layout.visible_VxT)
  env_T, author_view_T = jnp.asarray(layout.env_T), jnp.asarray(layout.author_view_T)
  turn_start_T, ends_TxV = jnp.asarray(layout.turn_start_T), jnp.asarray(layout.ends_episode_TxV)
  canvas_BxT = jnp.where(layout.env_T[None] & (layout.turn_T[None] >= 0), layout.marker_T[None],
                         canvas_BxT)
  apply_V = jax.vmap(functools.partial(model_lib.apply, cfg), in_axes=(0, None, None, 0, 0))

  # Prefill: the prompt in one parallel pass writes every view's cache for positions 0..P-1.
  valid_BxT = jnp.zeros((B, T), bool).at[:, :P].set(canvas_BxT[:, :P] != text.PAD)
  cache_V = jax.vmap(lambda _: model_lib.empty_cache(cfg, B, T))(jnp.arange(len(layout.view_set_V)))
  key_ok_VxBxT = valid_BxT[None] & visible_VxT[:, None]
  logits_VxBxPxV, cache_V = apply_V(params_V, canvas_BxT[:, :P], 0, key_ok_VxBxT, cache_V)

  def write(carry, t):
    tokens_BxT, valid_BxT, cache_V, logits_VxBxV, ended_B, done_B = carry
    logp_BxV = policy_log_probs(logits_VxBxV[author_view_T[t]], temperature)
    if greedy:
      choice_B = jnp.argmax(logp_BxV, axis=-1)
    else:
      keys_B = jax.vmap(jax.random.fold_in, in_axes=(0, None))(key_B, t)
      choice_B = jax.vmap(jax.random.categorical)(keys_B, logp_BxV)
    forced_B = force_BxT[:, t] | env_T[t]
    token_B = jnp.where(forced_B, canvas_BxT[:, t], choice_B)
    is_message = ~env_T[t]
    ended_B = ended_B & ~turn_start_T[t]
    blank_B = done_B | (is_message & ended_B)
    token_B = jnp.where(blank_B, text.PAD, token_B)
    sampled_B = is_message & ~forced_B & ~blank_B
    logp_B = jnp.where(sampled_B, jnp.take_along_axis(logp_BxV, token_B[:, None], 1)[:, 0], 0.0)
    closes_episode_B = is_message & ends_TxV[t][token_B] & ~blank_B
    ended_B = ended_B | (is_message & (token_B == text.EOS)) | closes_episode_B
    done_B = done_B | closes_episode_B
    tokens_BxT = tokens_BxT.at[:, t].set(token_B)
    valid_BxT = valid_BxT.at[:, t].set(token_B != text.PAD)
    key_ok_VxBxT = valid_BxT[None] & visible_VxT[:, None]
    logits_VxBx1xV, cache_V = apply_V(params_V, token_B[:, None], t, key_ok_VxBxT, cache_V)
    carry = (tokens_BxT, valid_BxT, cache_V, logits_VxBx1xV[:, :, 0], ended_B, done_B)
    return carry, (logp_B, sampled_B)

  carry = (canvas_BxT, valid_BxT, cache_V, logits_VxBxPxV[:, :, -1], jnp.zeros(B, bool),
           jnp.zeros(B, bool))
  carry, (logp_TxB, sampled_TxB) = jax.lax.scan(write, carry, jnp.arange(P, T))
  pad = jnp.zeros((B, P))
  logp_BxT = jnp.concatenate([pad, logp_TxB.T], axis=1)
  sampled_BxT = jnp.concatenate([pad.astype(bool), sampled_TxB.T], axis=1)
  return carry[0], logp_BxT, sampled_BxT


def token_log_probs(cfg: model_lib.ModelConfig, layout: Layout, params_R, tokens_BxT,
                    temperature: float):
  """Teacher-forced log-prob and entropy of each token under its author's view: logp_BxT, ent_BxT.

  Position t is predicted from the logits at t-1; positions 0 and environment tokens get values that
  callers mask out.
  """
  params_V = gather_params(params_R, layout.view_set_V)
  valid_BxT = tokens_BxT != text.PAD
  key_ok_VxBxT = valid_BxT[None] & jnp.asarray(layout.visible_VxT)[:, None]
  apply_V = jax.vmap(functools.partial(model_lib.apply, cfg), in_axes=(0, None, None, 0))
  logits_VxBxTxV, _ = apply_V(params_V, tokens_BxT, 0, key_ok_VxBxT)
  # Position t (t >= 1) uses its author's view at t-1.
  author_view_T = layout.author_view_T[1:]
  T1 = len(author_view_T)
  logits_TxBxV = logits_VxBxTxV[author_view_T, :, np.arange(T1)]
  logp_TxBxV = policy_log_probs(logits_TxBxV, temperature)
  logp_BxT = jnp.take_along_axis(logp_TxBxV, tokens_BxT.T[1:, :, None], -1)[..., 0].T
  entropy_BxT = -jnp.sum(jnp.exp(logp_TxBxV) * logp_TxBxV, -1).T
  zero = jnp.zeros((tokens_BxT.shape[0], 1))
  return jnp.concatenate([zero, logp_BxT], 1), jnp.concatenate([zero, entropy_BxT], 1)


def js_divergence(logp_xN, logq_xN):
  """Jensen-Shannon divergence (nats) between two distributions given as log-probs over the last axis."""
  log_m = jnp.logaddexp(logp_xN, logq_xN) - jnp.log(2.0)
  kl = lambda log_a: jnp.sum(jnp.exp(log_a) * (log_a - log_m), -1)
  return 0.5 * (kl(logp_xN) + kl(logq_xN))


def next_token_divergence(cfg: model_lib.ModelConfig, layout: Layout, role_set_R, params_S, tokens_BxT,
                          temperature: float):
  """Role-collapse diagnostic on the same inputs: at each message token of role r, the Jensen-Shannon
  divergence between the next-token distribution of r's parameter set and that of every set s, all
  reading the transcript through r's view there (so another set answers as if it were r).

  Returns (js_sum_RxS, count_R): the divergences summed over role r's message tokens (rows of
  `tokens_BxT`) and the number of those tokens, so devices can add theirs before dividing.
  """
  valid_BxT = tokens_BxT != text.PAD
  key_ok_VxBxT = valid_BxT[None] & jnp.asarray(layout.visible_VxT)[:, None]
  apply_S = jax.vmap(functools.partial(model_lib.apply, cfg), in_axes=(0, None, None, None))
  logits_VxSxBxTxN = jax.vmap(lambda key_ok_BxT: apply_S(params_S, tokens_BxT, 0, key_ok_BxT)[0])(
      key_ok_VxBxT)
  # Position t (t >= 1) is predicted at t-1 through its author's view.
  author_view_T, author_T = layout.author_view_T[1:], layout.author_T[1:]
  T1 = len(author_T)
  logp_TxSxBxN = policy_log_probs(logits_VxSxBxTxN[author_view_T, :, :, np.arange(T1)], temperature)
  own_set_T = np.asarray(role_set_R)[np.maximum(author_T, 0)]
  js_TxSxB = js_divergence(logp_TxSxBxN[np.arange(T1), own_set_T][:, None], logp_TxSxBxN)
  message_TxR = ((~layout.env_T[1:] & (author_T >= 0))[:, None]
                 & (author_T[:, None] == np.arange(len(role_set_R)))).astype(np.float32)
  counted_TxB = valid_BxT[:, 1:].T.astype(jnp.float32)
  js_sum_RxS = jnp.einsum("tsb,tb,tr->rs", js_TxSxB, counted_TxB, message_TxR)
  return js_sum_RxS, jnp.einsum("tb,tr->r", counted_TxB, message_TxR)
