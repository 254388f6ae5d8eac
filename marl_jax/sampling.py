"""Sampling a whole protocol transcript, turn by turn: only the acting view computes.

Before a turn, its view (parameter set x visibility) reads what it has not read yet and can see — the
prompt, other roles' turns, its turn's header (the role marker) — in parallel prefill chunks (one per run of visible
positions; what it cannot see it never computes); it then writes
its message one token at a time, reading each token it writes but the last (which the next chunk
reads, or no one needs).  No other view computes during the turn, and a view without turns computes
nothing.  The next token is written by the environment (role markers, forced overrides) or sampled
from the acting view.  Teacher-forced tokens take the same path, so a counterfactual re-run is just
`generate` with more of the canvas forced.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import model as model_lib
from marl_jax import text
from marl_jax.protocols.engine import Layout, VerdictReadout

# Tokens a policy never writes: padding, BOS and role markers (the environment's), the counterfactual
# <absent> message, and the reserved tail of the vocabulary.
_ENV_ONLY_V = np.array([t.startswith(("<role", "<unused")) for t in text.TOKENS])
_ENV_ONLY_V[[text.PAD, text.BOS, text.ABSENT]] = True


def policy_log_probs(logits_xV, temperature: float, allowed_xV=None):
  """Log-probs of the policy that samples at `temperature`; training uses the same distribution.
  Canvas values past the engine's symbols (a free-text agent's other tokens) are the policy's.
  `allowed_xV` (broadcast against the logits; the layout's `allowed_TxV` at the positions written), if
  given, narrows a turn's vocabulary further."""
  banned_xV = np.pad(_ENV_ONLY_V, (0, logits_xV.shape[-1] - len(_ENV_ONLY_V)))
  if allowed_xV is not None:
    pad = [(0, 0)] * (jnp.ndim(allowed_xV) - 1) + [(0, logits_xV.shape[-1] - allowed_xV.shape[-1])]
    banned_xV = banned_xV | ~jnp.pad(allowed_xV, pad)
  return jax.nn.log_softmax(jnp.where(banned_xV, -1e9, logits_xV / temperature), axis=-1)


def _allowed_at(layout: Layout, t):
  """The tokens position t (an int, or an array of positions: the result is t's shape x V) may hold;
  None when no turn narrows them."""
  return None if layout.allowed_TxV is None else jnp.asarray(layout.allowed_TxV)[t]


def last_turn_end_V(layout: Layout) -> np.ndarray:
  """The end (exclusive) of each view's last turn; 0 for a view without turns."""
  end_V = np.zeros(len(layout.view_set_V), int)
  np.maximum.at(end_V, np.asarray(layout.turn_view_N, int), [stop for _, stop in layout.turn_slices])
  return end_V


def read_schedule(layout: Layout) -> list[tuple[int, tuple[tuple[int, int], ...], int, int]]:
  """Per turn, (view, chunks, start, stop): before the turn's message [start, stop) its view prefills
  what it has not read yet and can see — `chunks`, runs [a, b) of visible positions, the last ending
  with its header (ending at start - 1) — then reads its own tokens start..stop-2 as it writes them (the last
  one is read by its next turn's first chunk, or by no one)."""
  visible_VxT = layout.visible_VxT
  read_V = [0] * len(layout.view_set_V)
  schedule = []
  for (start, stop), v in zip(layout.turn_slices, layout.turn_view_N):
    unread = np.arange(read_V[v], start)
    unread = unread[visible_VxT[v, unread]]
    breaks = np.flatnonzero(np.diff(unread) > 1) + 1
    chunks = tuple((int(run[0]), int(run[-1]) + 1) for run in np.split(unread, breaks))
    schedule.append((v, chunks, start, stop))
    read_V[v] = stop - 1
  return schedule


def view_models(cfg, layout: Layout) -> list:
  """The agent model of each view: its parameter set's (a mixed team's views may differ)."""
  return [model_lib.set_model(cfg, s) for s in layout.view_set_V]


def token_reads_V(layout: Layout) -> np.ndarray:
  """Model token-reads of one episode's `generate` per view: each turn's chunks and decoding reads."""
  reads_V = np.zeros(len(layout.view_set_V), int)
  for v, chunks, start, stop in read_schedule(layout):
    reads_V[v] += sum(b - a for a, b in chunks) + (stop - 1 - start)
  return reads_V


def token_reads(layout: Layout) -> int:
  """Model token-reads of one episode's `generate`."""
  return int(token_reads_V(layout).sum())


def needed_reads_VxT(layout: Layout) -> np.ndarray:
  """The positions view v must read in any sampler: those it sees, up to the last one whose logits it
  gives (the position before its last turn's last token); the floor `token_reads` is measured against."""
  return layout.visible_VxT & (np.arange(layout.length)[None] <= last_turn_end_V(layout)[:, None] - 2)


def episode_flops(cfg: model_lib.ModelConfig, layout: Layout) -> dict:
  """Model FLOPs of one episode's `generate`, three ways (each view at its set's model):
  - `lockstep`: every view reads every position (the first sampler);
  - `computed`: this sampler (`token_reads_V`, attention over the whole canvas, as computed);
  - `minimum`: each view reads only `needed_reads_VxT`, attending to only the keys it sees so far."""
  T = layout.length
  keys_VxT = np.cumsum(layout.visible_VxT, axis=1)  # keys a view sees at or before each position
  needed_VxT = needed_reads_VxT(layout)
  model_V = view_models(cfg, layout)
  flops_V = [model_lib.flops_per_token(model, T) for model in model_V]
  return {"lockstep": T * sum(flops_V),
          "computed": int(np.dot(token_reads_V(layout), flops_V)),
          "minimum": sum(model_lib.flops_per_token(model, int(k))
                         for v, model in enumerate(model_V) for k in keys_VxT[v][needed_VxT[v]])}


def generate(cfg: model_lib.ModelConfig, layout: Layout, params_R, canvas_BxT, force_BxT, key_B,
             temperature: float, greedy=False):
  """Fills the canvas; returns tokens_BxT, the sampling log-probs logp_BxT and the mask sampled_BxT.

  `greedy` (a bool, or a traced scalar bool) picks each sampled token as the policy's mode.

  `canvas_BxT` holds the prompt and any forced tokens (where `force_BxT`); turn headers (role
  markers) come from the layout.  A message closes at EOS (the rest of its slot is PAD); a token in the turn's
  `ends_episode_on` closes the episode (every later position is PAD, headers included).  Each turn is
  its view's prefill chunks (of which only the last position's logits are computed) and one
  `lax.while_loop` over its message (`read_schedule`), which stops once every row has ended; the KV
  cache is its carry, written in place.  Each parameter set's weights are made ready for the rollout
  once (`model.rollout_params`: cast to the compute dtype, and an LM's kernels split per layer on CPU),
  before the first turn that reads them, not per view, turn or token.
  """
  B, T = canvas_BxT.shape
  ends_TxV = jnp.asarray(layout.ends_episode_TxV)
  canvas_BxT = jnp.where(layout.env_T[None] & (layout.turn_T[None] >= 0), layout.marker_T[None],
                         canvas_BxT)

  def write(carry, t):
    """Message position t of the acting view, from its latest logits."""
    tokens_BxT, valid_BxT, cache, logits_BxV, ended_B, done_B = carry
    logp_BxV = policy_log_probs(logits_BxV, temperature, _allowed_at(layout, t))
    keys_B = jax.vmap(jax.random.fold_in, in_axes=(0, None))(key_B, t)
    # A select, not a Python branch, so evaluation compiles one program for both decodings; with a
    # constant `greedy` XLA drops the branch not taken.
    choice_B = jnp.where(greedy, jnp.argmax(logp_BxV, axis=-1),
                         jax.vmap(jax.random.categorical)(keys_B, logp_BxV))
    forced_B = force_BxT[:, t]
    blank_B = done_B | ended_B
    token_B = jnp.where(blank_B, text.PAD, jnp.where(forced_B, canvas_BxT[:, t], choice_B))
    sampled_B = ~forced_B & ~blank_B
    logp_B = jnp.where(sampled_B, jnp.take_along_axis(logp_BxV, token_B[:, None], 1)[:, 0], 0.0)
    # Only engine symbols end an episode (a free-text token past them never does).
    closes_episode_B = (~blank_B & (token_B < text.VOCAB_SIZE)
                        & ends_TxV[t][jnp.minimum(token_B, text.VOCAB_SIZE - 1)])
    ended_B = ended_B | (token_B == text.EOS) | closes_episode_B
    done_B = done_B | closes_episode_B
    carry = (tokens_BxT.at[:, t].set(token_B), valid_BxT.at[:, t].set(token_B != text.PAD), cache,
             logits_BxV, ended_B, done_B)
    return carry, (logp_B, sampled_B)

  def write_and_read(apply, visible_T, state):
    """Writes position t, then the acting view reads it (`apply`: its set) for the logits of t + 1."""
    t, carry, logp_BxT, sampled_BxT = state
    carry, (logp_B, sampled_B) = write(carry, t)
    tokens_BxT, valid_BxT, cache, _, ended_B, done_B = carry
    logits_Bx1xV, cache = apply(tokens_BxT[:, t][:, None], t, valid_BxT & visible_T, cache)
    return (t + 1, (tokens_BxT, valid_BxT, cache, logits_Bx1xV[:, 0], ended_B, done_B),
            logp_BxT.at[:, t].set(logp_B), sampled_BxT.at[:, t].set(sampled_B))

  def writing(stop, state):
    """Whether the message loop goes on: positions left and a row still writing."""
    t, (_, _, _, _, ended_B, done_B), _, _ = state
    return (t < stop - 1) & any_row(~(ended_B | done_B))

  tokens_BxT = canvas_BxT
  valid_BxT = jnp.zeros((B, T), bool).at[:, :layout.prompt_len].set(
      canvas_BxT[:, :layout.prompt_len] != text.PAD)
  done_B = jnp.zeros(B, bool)
  # A view's set may belong to any model group of a mixed team: its cache and calls are that model's.
  model_V = view_models(cfg, layout)
  # Each view's cache holds only what it may read (where its model keeps blocks of the canvas).
  cache_V = [model_lib.empty_cache(model, B, T, layout.visible_VxT[v]) for v, model in enumerate(model_V)]
  # Each parameter set as a rollout reads it, made once for every turn of every view that reads it.
  params_S = {s: model_lib.rollout_params(model, model_lib.take_sets(cfg, params_R, s))
              for s, model in dict(zip(layout.view_set_V, model_V)).items()}
  logp_BxT, sampled_BxT = jnp.zeros((B, T)), jnp.zeros((B, T), bool)
  for (v, chunks, start, stop), header_start in zip(read_schedule(layout), layout.header_starts):
    apply = functools.partial(model_lib.apply, model_V[v], params_S[layout.view_set_V[v]])
    visible_T = jnp.asarray(layout.visible_VxT[v])
    # The turn's header (its role marker), none once the episode is over.
    header_BxH = jnp.where(done_B[:, None], text.PAD, canvas_BxT[:, header_start:start])
    tokens_BxT = tokens_BxT.at[:, header_start:start].set(header_BxH)
    valid_BxT = valid_BxT.at[:, header_start:start].set(header_BxH != text.PAD)
    for a, b in chunks:  # the last chunk ends with the header: its last logits give the first token
      logits_Bx1xV, cache_V[v] = apply(tokens_BxT[:, a:b], a, valid_BxT & visible_T, cache_V[v],
                                       readout_M=np.array([b - a - 1]))
    carry = (tokens_BxT, valid_BxT, cache_V[v], logits_Bx1xV[:, 0], jnp.zeros(B, bool), done_B)
    t, carry, logp_BxT, sampled_BxT = jax.lax.while_loop(
        functools.partial(writing, stop), functools.partial(write_and_read, apply, visible_T),
        (jnp.int32(start), carry, logp_BxT, sampled_BxT))
    # Once every row has ended, the rest of the message is PAD (never valid, never sampled, log-prob
    # 0), as `write` would have made it.
    tokens_BxT, valid_BxT, cache_V[v], logits_BxV, ended_B, done_B = carry
    rest_T = (jnp.arange(T) >= t) & (jnp.arange(T) < stop - 1)
    carry = (jnp.where(rest_T, text.PAD, tokens_BxT), valid_BxT, cache_V[v], logits_BxV, ended_B, done_B)
    carry, (logp_B, sampled_B) = write(carry, stop - 1)  # its logits would predict the next turn's header
    tokens_BxT, valid_BxT, cache_V[v], _, _, done_B = carry
    logp_BxT = logp_BxT.at[:, stop - 1].set(logp_B)
    sampled_BxT = sampled_BxT.at[:, stop - 1].set(sampled_B)
  return tokens_BxT, logp_BxT, sampled_BxT


@jax.custom_batching.custom_vmap
def any_row(flags_B):
  """Whether any flag is set.  Under `jax.vmap` (generate runs vmapped over seeds) the flags of every
  vmapped instance count and the answer stays unbatched: a batched while-loop predicate would make JAX
  select between the old and the new carry every iteration, a copy of the whole KV cache per token.
  The message loop's body leaves a row that has ended as it is, so looping on for another instance's
  rows changes nothing."""
  return jnp.any(flags_B)


@any_row.def_vmap
def _any_row_vmap(axis_size, in_batched, flags_xB):
  del axis_size, in_batched
  return any_row(flags_xB), False


def scoring_passes(layout: Layout, group_V) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Teacher-forced scoring in fewer whole-canvas passes than views.  Views of one group (`group_V`:
  the parameter set, when a pass applies one set) share a pass when every position both of them read
  has the same visible keys before it in each: parallel voters, the debaters of one round, workers that
  each read only their own assignment.  Only the positions a view must read count (`needed_reads_VxT`:
  what it sees up to its last logits; a round-0 debater's later rounds do not).  In the pass, each
  position reads the keys of the first view of the pass that reads it, so every view of the pass gets
  exactly the hidden states (and logits) its own pass would; a position no view of the pass reads is
  computed but never used.

  Returns pass_V (the pass scoring each view; passes numbered in order of their first view),
  visible_PxTxT (the keys each position reads in each pass, before the causal mask) and first_view_P
  (each pass's first view: its parameter set and model are the pass's)."""
  visible_VxT = needed_reads_VxT(layout)

  def compatible(v, w):
    mismatch_T = visible_VxT[v] != visible_VxT[w]
    mismatches_before_T = np.cumsum(mismatch_T) - mismatch_T
    return not np.any(visible_VxT[v] & visible_VxT[w] & (mismatches_before_T > 0))

  passes: list[list[int]] = []
  for v in range(len(visible_VxT)):
    fits = [p for p in passes if group_V[p[0]] == group_V[v] and all(compatible(v, w) for w in p)]
    if fits:
      fits[0].append(v)
    else:
      passes.append([v])
  pass_V = np.zeros(len(visible_VxT), int)
  query_view_PxT = np.zeros((len(passes), layout.length), int)
  for p, views in enumerate(passes):
    pass_V[views] = p
    sees_VxT = visible_VxT[views]
    query_view_PxT[p] = np.asarray(views)[np.argmax(sees_VxT, axis=0)]  # views[0] where none sees
  return pass_V, visible_VxT[query_view_PxT], np.array([views[0] for views in passes])


def author_readouts(layout: Layout, pass_V, targets_N=None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Where `token_log_probs` reads each written token's logits: the positions t a role wrote (t >= 1;
  or only `targets_N`, positions a role wrote), each predicted at t-1 through its author's view, whose
  scoring pass (`pass_V`, from `scoring_passes`) reads out only the positions of its own authors'
  tokens.  Returns (targets_N, readout_PxM: each pass's positions, padded to the longest with its
  first, pass_N and slot_N: where target n's logits are), all static."""
  if targets_N is None:
    targets_N = np.flatnonzero(layout.author_T[1:] >= 0) + 1
  targets_N = np.asarray(targets_N)
  pass_N = pass_V[layout.author_view_T[targets_N]]
  reads_P = [targets_N[pass_N == p] - 1 for p in range(pass_V.max() + 1)]
  width = max(1, max(len(r) for r in reads_P))
  readout_PxM = np.stack([np.pad(r, (0, width - len(r)), mode="edge") if len(r) else np.zeros(width, int)
                          for r in reads_P])
  slot_N = np.zeros(len(targets_N), int)
  for p in range(len(reads_P)):
    slot_N[pass_N == p] = np.arange(np.sum(pass_N == p))
  return targets_N, readout_PxM, pass_N, slot_N


def gathered_reads(layout: Layout, views) -> tuple[np.ndarray, np.ndarray]:
  """The positions each of `views` must read (`needed_reads_VxT`), in canvas order: index_VxL, padded
  to the longest with its last, and real_VxL (False on the padding)."""
  needed_VxT = needed_reads_VxT(layout)
  reads = [np.flatnonzero(needed_VxT[v]) for v in views]
  width = max(1, max(len(r) for r in reads))
  index_VxL = np.stack([np.pad(r, (0, width - len(r)), mode="edge") if len(r) else np.zeros(width, int)
                        for r in reads])
  return index_VxL, np.arange(width)[None] < np.array([len(r) for r in reads])[:, None]


def pass_flops(cfg: model_lib.ModelConfig, layout: Layout, pass_V, first_view_P) -> tuple[np.ndarray, np.ndarray]:
  """(whole_P, gathered_P): the forward model FLOPs of one episode of each scoring pass over the whole
  canvas, and with each of its views (those that read anything) reading its own positions gathered
  (`gathered_reads`: the views padded to the longest), at the pass's first view's model."""
  model_V = view_models(cfg, layout)
  reads_V = needed_reads_VxT(layout).any(1)
  flops = lambda p, length: length * model_lib.flops_per_token(model_V[first_view_P[p]], length)
  whole_P = np.array([model_lib.whole_pass_flops(model_V[first_view_P[p]], layout.length)
                      for p in range(len(first_view_P))], float)
  gathered_P = np.zeros(len(first_view_P))
  for p in range(len(first_view_P)):
    views = np.flatnonzero((pass_V == p) & reads_V)
    if len(views):
      gathered_P[p] = len(views) * flops(p, gathered_reads(layout, views)[0].shape[1])
  return whole_P, gathered_P


def gathered_passes(cfg: model_lib.ModelConfig, layout: Layout, pass_V, first_view_P) -> np.ndarray:
  """gathered_P: whether scoring pass p reads each of its views' own positions gathered out of the
  canvas (`gathered_reads`, one short sequence per view) rather than the whole canvas: where that
  costs at most half the model FLOPs (`pass_flops`).  Attention over the whole canvas costs each
  position the keys up to its block's end (`model.causal_chunks`; the LM agent's, the whole canvas's),
  hidden or not, so a pass of many views that each read a few positions — 64 workers, each its
  assignment and its report — grew with the team; gathered, each view costs what its own reads cost."""
  return _gathers(*pass_flops(cfg, layout, pass_V, first_view_P))


def _gathers(whole_P, gathered_P) -> np.ndarray:
  return (gathered_P > 0) & (2 * gathered_P <= whole_P)


def scoring_flops(cfg: model_lib.ModelConfig, layout: Layout) -> float:
  """Forward model FLOPs of one episode's teacher-forced scoring (`written_log_probs`, every written
  position): each pass holding a target, over the whole canvas or its views gathered."""
  pass_V, _, first_view_P = scoring_passes(layout, layout.view_set_V)
  whole_P, gathered_P = pass_flops(cfg, layout, pass_V, first_view_P)
  chosen_P = np.where(_gathers(whole_P, gathered_P), gathered_P, whole_P)
  return float(chosen_P[np.unique(pass_V[layout.author_view_T[author_readouts(layout, pass_V)[0]]])].sum())


def _gathered_logits(cfg: model_lib.ModelConfig, layout: Layout, params_R, tokens_BxT, view_X, position_X):
  """logits_XxBxV: the logits at canvas position `position_X[x]` through view `view_X[x]` (views of one
  parameter set), each view reading only its own positions (`gathered_reads`) in one vmap over views."""
  views = np.unique(view_X)
  index_VxL, real_VxL = gathered_reads(layout, views)
  rank_X = np.searchsorted(views, view_X)
  slot_X = np.array([np.searchsorted(index_VxL[r], t) for r, t in zip(rank_X, position_X)])
  width = max(np.sum(rank_X == r) for r in range(len(views)))
  readout_VxM = np.zeros((len(views), width), int)
  column_X = np.zeros(len(view_X), int)
  for r in range(len(views)):
    mine = np.flatnonzero(rank_X == r)
    readout_VxM[r, :len(mine)], column_X[mine] = slot_X[mine], np.arange(len(mine))
  s = layout.view_set_V[views[0]]
  model, params = view_models(cfg, layout)[views[0]], model_lib.take_sets(cfg, params_R, s)
  tokens_VxBxL = jnp.moveaxis(tokens_BxT[:, index_VxL], 1, 0)
  # Keys per query over the gathered positions: real, not PAD, and not after the query.
  causal_LxL = np.tril(np.ones((index_VxL.shape[1],) * 2, bool))
  key_ok_VxBxLxL = ((tokens_VxBxL != text.PAD) & real_VxL[:, None])[:, :, None, :] & causal_LxL
  read = lambda tokens_BxL, key_ok_BxLxL, positions_L, readout_M: model_lib.apply(
      model, params, tokens_BxL, 0, key_ok_BxLxL, readout_M=readout_M, positions_L=positions_L)[0]
  logits_VxBxMxV = jax.vmap(read)(tokens_VxBxL, key_ok_VxBxLxL, jnp.asarray(index_VxL), readout_VxM)
  return logits_VxBxMxV[rank_X, :, column_X]


def written_log_probs(cfg: model_lib.ModelConfig, layout: Layout, params_R, tokens_BxT, temperature: float,
                      targets_N=None):
  """(targets_N, logp_NxBxV): the policy's log-probs over the vocabulary at each written position
  (or only `targets_N`), teacher-forced, each predicted at t-1 through its author's view.

  One whole-canvas pass per group of compatible views that holds a target (`scoring_passes`), each
  unembedding only the positions that predict its authors' tokens (`author_readouts`): at Qwen3's
  151 936 words the logits of every position of every pass were most of the update's memory.  A pass
  of many views that each read little reads each view's positions gathered instead
  (`gathered_passes`)."""
  pass_V, visible_PxTxT, first_view_P = scoring_passes(layout, layout.view_set_V)
  targets_N, readout_PxM, pass_N, slot_N = author_readouts(layout, pass_V, targets_N)
  gathered_P = gathered_passes(cfg, layout, pass_V, first_view_P)
  pieces, order = [], []  # the logits of some targets each, and which
  whole_U = np.array([p for p in np.unique(pass_N) if not gathered_P[p]], int)  # whole passes that read a target out
  if len(whole_U):
    set_U = [layout.view_set_V[v] for v in first_view_P[whole_U]]
    valid_BxT = tokens_BxT != text.PAD
    key_ok_UxBxTxT = valid_BxT[None, :, None, :] & jnp.asarray(visible_PxTxT[whole_U])[:, None]
    logits_UxBxMxV = model_lib.apply_sets(cfg, params_R, set_U, tokens_BxT, 0, key_ok_UxBxTxT,
                                          readout_PxM[whole_U])
    whole_N = np.flatnonzero(np.isin(pass_N, whole_U))
    pieces.append(logits_UxBxMxV[np.searchsorted(whole_U, pass_N[whole_N]), :, slot_N[whole_N]])
    order.extend(whole_N)
  for p in np.unique(pass_N[gathered_P[pass_N]]):
    mine_N = np.flatnonzero(pass_N == p)
    pieces.append(_gathered_logits(cfg, layout, params_R, tokens_BxT, layout.author_view_T[targets_N[mine_N]],
                                   targets_N[mine_N] - 1))
    order.extend(mine_N)
  logits_NxBxV = jnp.concatenate(pieces)
  if not np.array_equal(order, np.arange(len(order))):
    logits_NxBxV = logits_NxBxV[np.argsort(order)]
  return targets_N, policy_log_probs(logits_NxBxV, temperature, _allowed_at(layout, targets_N[:, None]))


def token_log_probs(cfg: model_lib.ModelConfig, layout: Layout, params_R, tokens_BxT,
                    temperature: float):
  """Teacher-forced log-prob and entropy of each token under its author's view: logp_BxT, ent_BxT.

  Position t is predicted from the logits at t-1; positions no role wrote (0, the environment's) get 0.
  """
  return sampled_log_probs(*written_log_probs(cfg, layout, params_R, tokens_BxT, temperature), tokens_BxT)


def sampled_log_probs(targets_N, logp_NxBxV, tokens_BxT):
  """(logp_BxT, ent_BxT) of the tokens at `targets_N` from `written_log_probs`; 0 elsewhere."""
  logp_NxB = jnp.take_along_axis(logp_NxBxV, tokens_BxT.T[targets_N, :, None], -1)[..., 0]
  entropy_NxB = -jnp.sum(jnp.exp(logp_NxBxV) * logp_NxBxV, -1)
  zero_BxT = jnp.zeros(tokens_BxT.shape)
  return zero_BxT.at[:, targets_N].set(logp_NxB.T), zero_BxT.at[:, targets_N].set(entropy_NxB.T)


def levels_at(readout: VerdictReadout, targets_N, logp_NxBxV):
  """level_logp_JxKxBxL: the log-probs of the level tokens at each verdict position, out of
  `written_log_probs` (whose `targets_N` hold every verdict position), normalised over the levels: a
  judge's distribution over its statements given that it states one."""
  index_JxK = np.searchsorted(targets_N, readout.position_JxK)
  return jax.nn.log_softmax(logp_NxBxV[index_JxK][..., np.asarray(readout.token_L)], axis=-1)


def level_log_probs(cfg: model_lib.ModelConfig, layout: Layout, readout: VerdictReadout, params_R, tokens_BxT,
                    temperature: float):
  """level_logp_JxKxBxL: each judge's distribution over its levels at its verdict positions, reading
  `tokens_BxT` teacher-forced (only the passes of the judges' views compute)."""
  targets_N = np.unique(readout.position_JxK)
  return levels_at(readout, targets_N, written_log_probs(cfg, layout, params_R, tokens_BxT, temperature,
                                                         targets_N)[1])


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
  # Every set reads through every view, so any compatible views share a pass, whatever their sets.
  pass_V, visible_PxTxT, _ = scoring_passes(layout, np.zeros(len(layout.view_set_V), int))
  valid_BxT = tokens_BxT != text.PAD
  key_ok_PxBxTxT = valid_BxT[None, :, None, :] & jnp.asarray(visible_PxTxT)[:, None]
  S = len(set(role_set_R))
  every_set = lambda key_ok_BxTxT: model_lib.apply_sets(cfg, params_S, range(S), tokens_BxT, 0,
                                                         jnp.broadcast_to(key_ok_BxTxT, (S,) + key_ok_BxTxT.shape))
  logits_PxSxBxTxN = jax.vmap(every_set)(key_ok_PxBxTxT)
  # Position t (t >= 1) is predicted at t-1 through its author's view.
  author_pass_T, author_T = pass_V[layout.author_view_T[1:]], layout.author_T[1:]
  T1 = len(author_T)
  logp_TxSxBxN = policy_log_probs(logits_PxSxBxTxN[author_pass_T, :, :, np.arange(T1)], temperature,
                                  _allowed_at(layout, np.arange(1, T1 + 1)[:, None, None]))
  own_set_T = np.asarray(role_set_R)[np.maximum(author_T, 0)]
  js_TxSxB = js_divergence(logp_TxSxBxN[np.arange(T1), own_set_T][:, None], logp_TxSxBxN)
  message_TxR = ((~layout.env_T[1:] & (author_T >= 0))[:, None]
                 & (author_T[:, None] == np.arange(len(role_set_R)))).astype(np.float32)
  counted_TxB = valid_BxT[:, 1:].T.astype(jnp.float32)
  js_sum_RxS = jnp.einsum("tsb,tb,tr->rs", js_TxSxB, counted_TxB, message_TxR)
  return js_sum_RxS, jnp.einsum("tb,tr->r", counted_TxB, message_TxR)
