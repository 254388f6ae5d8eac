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
  """Log-probs of the policy that samples at `temperature`; training uses the same distribution.
  Canvas values past the engine's symbols (a free-text agent's other tokens) are the policy's."""
  env_only_V = np.pad(_ENV_ONLY_V, (0, logits_xV.shape[-1] - len(_ENV_ONLY_V)))
  return jax.nn.log_softmax(jnp.where(env_only_V, -1e9, logits_xV / temperature), axis=-1)


def gather_params(params_R, view_set_V):
  """The stacked entries `view_set_V` of any stacked tree (parameter sets, or the views' caches)."""
  return jax.tree.map(lambda p: p[np.asarray(view_set_V)], params_R)


def last_turn_end_V(layout: Layout) -> np.ndarray:
  """The end (exclusive) of each view's last turn; 0 for a view without turns."""
  end_V = np.zeros(len(layout.view_set_V), int)
  np.maximum.at(end_V, np.asarray(layout.turn_view_N, int), [stop for _, stop in layout.turn_slices])
  return end_V


def decode_segments(layout: Layout):
  """Runs of decoding positions P..T-1 with the same *live* views: [(start, stop, live_views)], where
  view v reads position t (writes it to its KV cache and gives the next logits) only when it can see
  t and a turn of v is still to come or running (t < the end of v's last turn).  A view never reads
  what it cannot see (its cache slot stays empty and masked) nor anything after its last turn, and a
  view without turns reads nothing here."""
  P, T = layout.prompt_len, layout.length
  live_VxT = layout.visible_VxT & (np.arange(T)[None] < last_turn_end_V(layout)[:, None])
  segments = []
  for t in range(P, T):
    live = tuple(np.flatnonzero(live_VxT[:, t]).tolist())
    if segments and segments[-1][2] == live:
      segments[-1] = (segments[-1][0], t + 1, live)
    else:
      segments.append((t, t + 1, live))
  return segments


def token_reads(layout: Layout) -> int:
  """Model token-reads of one episode's `generate`: every view's prompt prefill, then each decoding
  position's live views (what the lockstep decoder's `len(views) * length` shrank to)."""
  return len(layout.view_set_V) * layout.prompt_len + sum(
      (stop - start) * len(live) for start, stop, live in decode_segments(layout))


def needed_reads_VxT(layout: Layout) -> np.ndarray:
  """The positions view v must read in any sampler: those it sees, up to the last one whose logits it
  gives (the position before its last turn's last token); the floor `token_reads` is measured against."""
  return layout.visible_VxT & (np.arange(layout.length)[None] <= last_turn_end_V(layout)[:, None] - 2)


def episode_flops(cfg: model_lib.ModelConfig, layout: Layout) -> dict:
  """Model FLOPs of one episode's `generate`, three ways:
  - `lockstep`: every view reads every position (the sampler before `decode_segments`);
  - `computed`: this sampler (`token_reads`, attention over the whole canvas, as computed);
  - `minimum`: each view reads only `needed_reads_VxT`, attending to only the keys it sees so far."""
  T = layout.length
  keys_VxT = np.cumsum(layout.visible_VxT, axis=1)  # keys a view sees at or before each position
  needed_VxT = needed_reads_VxT(layout)
  return {"lockstep": len(layout.view_set_V) * T * model_lib.flops_per_token(cfg, T),
          "computed": token_reads(layout) * model_lib.flops_per_token(cfg, T),
          "minimum": sum(model_lib.flops_per_token(cfg, int(k)) for k in keys_VxT[needed_VxT])}


def generate(cfg: model_lib.ModelConfig, layout: Layout, params_R, canvas_BxT, force_BxT, key_B,
             temperature: float, greedy=False):
  """Fills the canvas; returns tokens_BxT, the sampling log-probs logp_BxT and the mask sampled_BxT.

  `greedy` (a bool, or a traced scalar bool) picks each sampled token as the policy's mode.

  `canvas_BxT` holds the prompt and any forced tokens (where `force_BxT`); environment positions
  (role markers) come from the layout.  A message closes at EOS (the rest of its slot is PAD); a token
  in the turn's `ends_episode_on` closes the episode (every later position is PAD).  After the prompt,
  each run of positions with the same live views (`decode_segments`) is one `lax.scan` over only
  those views, so a view costs nothing where it cannot see or after its last turn; what a view
  computes where it is live is unchanged (the same single-token step), so the tokens are too.
  """
  P, T = layout.prompt_len, layout.length
  B = canvas_BxT.shape[0]
  params_V = gather_params(params_R, layout.view_set_V)
  visible_VxT = jnp.asarray(layout.visible_VxT)
  env_T, author_view_T = jnp.asarray(layout.env_T), layout.author_view_T
  turn_start_T, ends_TxV = jnp.asarray(layout.turn_start_T), jnp.asarray(layout.ends_episode_TxV)
  canvas_BxT = jnp.where(layout.env_T[None] & (layout.turn_T[None] >= 0), layout.marker_T[None],
                         canvas_BxT)
  apply_V = jax.vmap(functools.partial(model_lib.apply, cfg), in_axes=(0, None, None, 0, 0))

  # Prefill: the prompt in one parallel pass writes every view's cache for positions 0..P-1.
  valid_BxT = jnp.zeros((B, T), bool).at[:, :P].set(canvas_BxT[:, :P] != text.PAD)
  cache_V = jax.vmap(lambda _: model_lib.empty_cache(cfg, B, T))(jnp.arange(len(layout.view_set_V)))
  key_ok_VxBxT = valid_BxT[None] & visible_VxT[:, None]
  logits_VxBxPxV, cache_V = apply_V(params_V, canvas_BxT[:, :P], 0, key_ok_VxBxT, cache_V)
  logits_VxBxV = logits_VxBxPxV[:, :, -1]

  def write(params_L, visible_LxT, author_T, carry, t):
    """Position t, with the live views' parameters, caches and latest logits (L of them);
    `author_T` is the author's index among the live views."""
    tokens_BxT, valid_BxT, cache_L, logits_LxBxV, ended_B, done_B = carry
    logp_BxV = policy_log_probs(logits_LxBxV[author_T[t]], temperature)
    keys_B = jax.vmap(jax.random.fold_in, in_axes=(0, None))(key_B, t)
    # A select, not a Python branch, so evaluation compiles one program for both decodings; with a
    # constant `greedy` XLA drops the branch not taken.
    choice_B = jnp.where(greedy, jnp.argmax(logp_BxV, axis=-1),
                         jax.vmap(jax.random.categorical)(keys_B, logp_BxV))
    forced_B = force_BxT[:, t] | env_T[t]
    token_B = jnp.where(forced_B, canvas_BxT[:, t], choice_B)
    is_message = ~env_T[t]
    ended_B = ended_B & ~turn_start_T[t]
    blank_B = done_B | (is_message & ended_B)
    token_B = jnp.where(blank_B, text.PAD, token_B)
    sampled_B = is_message & ~forced_B & ~blank_B
    logp_B = jnp.where(sampled_B, jnp.take_along_axis(logp_BxV, token_B[:, None], 1)[:, 0], 0.0)
    # Only engine symbols end an episode (a free-text token past them never does).
    closes_episode_B = (is_message & ~blank_B & (token_B < text.VOCAB_SIZE)
                        & ends_TxV[t][jnp.minimum(token_B, text.VOCAB_SIZE - 1)])
    ended_B = ended_B | (is_message & (token_B == text.EOS)) | closes_episode_B
    done_B = done_B | closes_episode_B
    tokens_BxT = tokens_BxT.at[:, t].set(token_B)
    valid_BxT = valid_BxT.at[:, t].set(token_B != text.PAD)
    key_ok_LxBxT = valid_BxT[None] & visible_LxT[:, None]
    logits_LxBx1xV, cache_L = apply_V(params_L, token_B[:, None], t, key_ok_LxBxT, cache_L)
    carry = (tokens_BxT, valid_BxT, cache_L, logits_LxBx1xV[:, :, 0], ended_B, done_B)
    return carry, (logp_B, sampled_B)

  tokens_BxT, ended_B, done_B = canvas_BxT, jnp.zeros(B, bool), jnp.zeros(B, bool)
  logp_TxB, sampled_TxB = [], []
  for start, stop, live in decode_segments(layout):
    idx = np.asarray(live, int)
    # The author's view is live at its message positions (it sees its own turn); an environment
    # position's token is forced, so which live view's logits it reads there does not matter.
    author_T = jnp.asarray([live.index(v) if v in live else 0 for v in author_view_T])
    step = functools.partial(write, gather_params(params_V, live), visible_VxT[idx], author_T)
    carry = (tokens_BxT, valid_BxT, gather_params(cache_V, live), logits_VxBxV[idx], ended_B, done_B)
    carry, (logp_xB, sampled_xB) = jax.lax.scan(step, carry, jnp.arange(start, stop))
    tokens_BxT, valid_BxT, cache_L, logits_LxBxV, ended_B, done_B = carry
    cache_V = jax.tree.map(lambda c, new: c.at[idx].set(new), cache_V, cache_L)
    logits_VxBxV = logits_VxBxV.at[idx].set(logits_LxBxV)
    logp_TxB.append(logp_xB)
    sampled_TxB.append(sampled_xB)
  pad = jnp.zeros((B, P))
  logp_BxT = jnp.concatenate([pad, jnp.concatenate(logp_TxB).T], axis=1)
  sampled_BxT = jnp.concatenate([pad.astype(bool), jnp.concatenate(sampled_TxB).T], axis=1)
  return tokens_BxT, logp_BxT, sampled_BxT


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
