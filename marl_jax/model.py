"""Decoder-only Linen transformer with an explicit KV cache, and stacked parameter sets.

Sequences live on a fixed canvas of `max_len` positions shared by every row of a batch, so a decoding
step writes the same cache slot for all rows (`lax.dynamic_update_slice`) and positions are canvas
indices.  Which keys a query may read is given by `key_ok_BxT` (valid token AND visible to the viewing
role) combined with causality, so one model serves every role's view of a transcript.
"""
import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from marl_jax import text


class SetStack:
  """The parameter sets of one agent model, stacked on a leading axis: what sampling, the update and
  the diagnostics do with every set at once, as vmaps over that axis.  A subclass says where the axis
  is, `set_axes(params_R)`: a `jax.vmap` in_axes prefix of params_R, 0 (every leaf stacked over the
  sets) or None for a part every set shares (a LoRA agent's frozen base).  A mixed team
  (`marl_jax.mixed_teams.Team`) does the same per model group."""

  def set_model(self, index: int):
    """The agent model of parameter set `index`: this one for every set."""
    del index
    return self

  def take_sets(self, params_R, index):
    """Sets `index` of params_R (an int: one set, unstacked; an index array: a stack of them); a part
    every set shares is passed as it is."""
    index = _as_slice(index)
    take = lambda axis, part: part if axis is None else jax.tree.map(lambda p: p[index], part)
    return jax.tree.map(take, self.set_axes(params_R), params_R, is_leaf=lambda x: x is None)

  def apply_sets(self, params_R, set_N, tokens_BxL, start, key_ok_NxBxT, readout_NxM=None):
    """logits_NxBxLxV: set `set_N[n]` (static) reading `tokens_BxL` with keys `key_ok_NxBxT[n]`; with
    `readout_NxM`, logits_NxBxMxV at the positions `readout_NxM[n]` alone."""
    params_N = self.take_sets(params_R, np.asarray(set_N))
    apply = lambda params, key_ok_BxT, readout_M: self.apply(params, tokens_BxL, start, key_ok_BxT,
                                                             readout_M=readout_M)
    readout_axis = None if readout_NxM is None else 0
    return jax.vmap(apply, in_axes=(self.set_axes(params_N), 0, readout_axis))(params_N, key_ok_NxBxT,
                                                                               readout_NxM)[0]

  def per_set(self, tx: optax.GradientTransformation, scale_S) -> optax.GradientTransformation:
    """`tx` on the parameters the model trains (`trainable`), with one state per parameter set (vmapped
    over the sets); set s's updates times `scale_S[s]` (a flag or a factor: 0 freezes the set, and for
    the optimisers of `experiment.make_optimizer` a factor is exactly a learning rate of its own)."""
    tx = self.trainable(tx)
    keep_S = np.asarray(scale_S, np.float32)

    def init(params_R):
      return jax.vmap(tx.init, in_axes=(self.set_axes(params_R),))(params_R)

    def update(grads_R, state, params_R):
      axes = self.set_axes(params_R)
      updates, state = jax.vmap(tx.update, in_axes=(axes, 0, axes), out_axes=(axes, 0))(
          grads_R, state, params_R)
      still = lambda axis, part: part if axis is None else jax.tree.map(
          lambda u: u * keep_S.reshape((-1,) + (1,) * (u.ndim - 1)), part)
      return jax.tree.map(still, axes, updates, is_leaf=lambda x: x is None), state

    return optax.GradientTransformation(init, update)

  def set_norms(self, tree_R):
    """norm_S: the global norm of each parameter set's part of a params-shaped tree (a gradient)."""
    return jax.vmap(optax.tree_utils.tree_norm, in_axes=(self.set_axes(tree_R),))(tree_R)

  def whole_pass_flops(self, length: int) -> int:
    """Forward FLOPs of one whole-canvas pass of `length` positions (no cache): every position attends
    over the whole canvas, as `flops_per_token` counts."""
    return length * self.flops_per_token(length)

  def rollout_params(self, params):
    """`params` (any sets of this model) as a rollout reads them token after token: every floating leaf
    wider than the compute dtype cast to it once, so that the message loop reads bfloat16 weights
    (half the bytes of float32) and converts none per token.  Float32 compute returns them as they are."""
    dtype = jnp.dtype(self.compute_dtype)
    wider = lambda p: jnp.issubdtype(p.dtype, jnp.floating) and p.dtype.itemsize > dtype.itemsize
    return jax.tree.map(lambda p: p.astype(dtype) if wider(p) else p, params)


def _as_slice(index):
  """A static run of consecutive sets (every set, in a team that isolates its roles) as a slice: XLA
  slices (or passes through) a stack where it would gather from an array of indices, and the gather's
  transpose in the update is a scatter-add."""
  if isinstance(index, np.ndarray) and index.ndim == 1 and len(index) and np.all(np.diff(index) == 1):
    return slice(int(index[0]), int(index[-1]) + 1)
  return index


@dataclasses.dataclass(frozen=True)
class ModelConfig(SetStack):
  vocab_size: int = text.VOCAB_SIZE
  d_model: int = 64
  n_layers: int = 2
  n_heads: int = 4
  d_ff: int = 256
  max_len: int = 64
  dtype: Any = jnp.float32  # compute dtype; parameters stay float32
  remat: bool = False  # whole-canvas passes recompute each block's activations in the backward pass

  @property
  def compute_dtype(self):
    return self.dtype

  def apply(self, params, tokens_BxL, start, key_ok_BxT, cache=None, readout_M=None, positions_L=None):
    logits_BxLxV, cache = Transformer(self).apply({"params": params}, tokens_BxL, start, key_ok_BxT, cache,
                                                  positions_L=positions_L)
    # All positions' logits, then those read out: the program a sampler slicing them has always
    # compiled, so its float rounding is unchanged (a 96-symbol unembedding costs little).
    return read_out(logits_BxLxV, readout_M), cache

  def empty_cache(self, batch: int, length: int, visible_T=None):
    """One buffer per layer over the whole canvas (`visible_T`, the positions the view may read, is
    for models whose caches keep only those)."""
    del visible_T
    shape = (batch, length, self.n_heads, self.d_model // self.n_heads)
    return [{"k": jnp.zeros(shape, self.dtype), "v": jnp.zeros(shape, self.dtype)}
            for _ in range(self.n_layers)]

  def init_stack(self, key, n_sets: int):
    return init_module_stack(Transformer(self), self.max_len, key, n_sets)

  def pretrained_stack(self, n_sets: int):
    return None  # the built-in model starts from random parameters (and the warm start)

  def trainable(self, tx):
    return tx  # every parameter trains

  def set_axes(self, params_R):
    del params_R
    return 0  # every parameter is stacked over the sets

  def flops_per_token(self, context_len: int) -> int:
    """Forward FLOPs of one token (a multiply-add is 2): the dense layers and the unembedding, and
    attention over `context_len` keys (the whole canvas: the mask hides keys, it does not skip them)."""
    D = self.d_model
    dense = self.n_layers * (4 * D ** 2 + 2 * D * self.d_ff) + D * self.vocab_size
    attention = self.n_layers * 2 * context_len * D  # q.k and att.v
    return 2 * (dense + attention)

  def whole_pass_flops(self, length: int) -> int:
    """As `SetStack.whole_pass_flops`, with the queries of each `causal_chunks` block attending over
    the keys up to the block's end alone (`attend`)."""
    return sum((end - begin) * self.flops_per_token(end) for begin, end in causal_chunks(length))


def read_out(x_BxLxF, readout_M):
  """x_BxMxF at the positions `readout_M` (static or traced; within the L read), or x_BxLxF as it is
  for None."""
  return x_BxLxF if readout_M is None else jnp.take(x_BxLxF, readout_M, axis=1)


def remat_layer(layer: type[nn.Module], remat: bool, scanned: bool = False) -> type[nn.Module]:
  """`layer`, or with `remat` a version whose activations the backward pass recomputes from its inputs
  (`nn.remat`; its call's second argument, the canvas start, static), as a layer of a whole-canvas pass
  without a cache is called.  Outside a scan XLA would merge the recomputation with the forward pass
  (common subexpressions) unless prevented; inside one it cannot, and preventing it costs speed."""
  return nn.remat(layer, prevent_cse=not scanned, static_argnums=(2,)) if remat else layer


def compute_dtype(name: str):
  """'auto' is float32 on CPU (exact tests) and bfloat16 on accelerators (speed)."""
  dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
  if name == "auto":
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  if name not in dtypes:
    raise ValueError(f"config.model.dtype={name!r} is unknown; allowed: {['auto', *dtypes]}")
  return dtypes[name]


def canvas_positions(start, length: int, positions_L=None):
  """The canvas positions of `length` tokens: start..start+length, or `positions_L` where given (the
  tokens a view reads gathered out of the canvas, `sampling.gathered_views`; its key mask, per query,
  is over the gathered tokens)."""
  return start + jnp.arange(length) if positions_L is None else positions_L


def visible_mask(positions_L, key_ok):
  """Query at canvas position p reads key position t when t <= p and the key is valid and visible:
  `key_ok` is key_ok_BxT (the same keys for every query) or key_ok_BxLxT (per query: one pass
  scoring several views, `sampling.scoring_passes`)."""
  causal_LxT = jnp.arange(key_ok.shape[-1])[None, :] <= positions_L[:, None]
  return causal_LxT[None] & (key_ok[:, None, :] if key_ok.ndim == 2 else key_ok)


def write_cache(cache, start, k_BxLxNxK, v_BxLxNxK):
  """Writes this layer's keys/values at canvas slot `start` and returns the keys/values to attend
  over (the whole canvas with a cache, just these L without) and the updated cache."""
  if cache is None:
    return k_BxLxNxK, v_BxLxNxK, None
  write = lambda old, new: jax.lax.dynamic_update_slice(old, new.astype(old.dtype), (0, start, 0, 0))
  cache = {"k": write(cache["k"], k_BxLxNxK), "v": write(cache["v"], v_BxLxNxK)}
  return cache["k"], cache["v"], cache


# A whole-canvas pass (no cache, the canvas from position 0) splits its queries into blocks of this
# many positions, each attending over the keys up to its block's end alone: a causal mask hides the
# later keys but computing them costs as much as reading them, and at the wide job's W = 64 (an
# 835-position canvas) attention over every key was as costly as the dense layers.  One block up to
# this length: shorter canvases (every job but the widest) compute exactly as before.
CAUSAL_CHUNK = 128


def causal_chunks(length: int) -> list[tuple[int, int]]:
  """The (begin, end) query blocks of a whole-canvas pass of `length` positions (`CAUSAL_CHUNK`)."""
  return [(begin, min(begin + CAUSAL_CHUNK, length)) for begin in range(0, length, CAUSAL_CHUNK)]


def attend(q_BxLxHxK, k_BxTxHxK, v_BxTxHxK, mask_BxLxT, dtype, causal: bool = False):
  """Softmax attention (in float32), one key/value head per query head (`lm.model.attend` groups
  query heads for grouped-query checkpoints).  `causal`: query i and key i are canvas position i and
  the mask hides every key after its query (a whole-canvas pass), so each block of `causal_chunks`
  reads the keys up to its end alone; the weights of the keys it skips are exactly 0 either way."""
  L = q_BxLxHxK.shape[1]
  if causal and L > CAUSAL_CHUNK:
    return jnp.concatenate([attend(q_BxLxHxK[:, begin:end], k_BxTxHxK[:, :end], v_BxTxHxK[:, :end],
                                   mask_BxLxT[:, begin:end, :end], dtype) for begin, end in causal_chunks(L)], 1)
  K = q_BxLxHxK.shape[3]
  att_BxHxLxT = jnp.einsum("blhk,bthk->bhlt", q_BxLxHxK, k_BxTxHxK) / jnp.sqrt(K).astype(dtype)
  att_BxHxLxT = jnp.where(mask_BxLxT[:, None], att_BxHxLxT.astype(jnp.float32), -1e9)
  att_BxHxLxT = jax.nn.softmax(att_BxHxLxT, axis=-1).astype(dtype)
  return jnp.einsum("bhlt,bthk->blhk", att_BxHxLxT, v_BxTxHxK)


def layer_norm(x, scale_D, bias_D, epsilon: float):
  """flax's `nn.LayerNorm` over the last axis: the same values (statistics in at least float32, the
  variance as E[x^2] - E[x]^2 clipped at 0), with the gradient of `_normalize`."""
  return _normalize(x.astype(jnp.promote_types(x.dtype, jnp.float32)), scale_D, bias_D, epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _normalize(x, scale_D, bias_D, epsilon: float):
  return _normalize_forward(x, scale_D, bias_D, epsilon)[0]


def _normalize_forward(x, scale_D, bias_D, epsilon: float):
  mean = x.mean(-1, keepdims=True)
  inv = jax.lax.rsqrt(jnp.maximum(0.0, jax.lax.square(x).mean(-1, keepdims=True) - jax.lax.square(mean))
                      + epsilon)
  centred = x - mean
  return centred * (inv * scale_D) + bias_D, (centred, inv, scale_D)


def _normalize_backward(epsilon: float, residuals, dy):
  """The textbook gradient, dx = (g - mean(g) - x_hat mean(g x_hat)) / std with g = dy * scale (the
  variance's clip at 0 is not differentiated: it binds only where a row's values are all equal).  Its
  two means over the features are products with a 1/D vector, which XLA:CPU runs as matrix-vector
  products, faster than the reductions over the feature axis that autodiff gives (the relay job's step
  about 4 % faster on two CPU devices: docs/throughput.md).  HIGHEST precision: a TPU would round a
  default-precision float32 product to bfloat16."""
  del epsilon
  centred, inv, scale_D = residuals
  x_hat = centred * inv
  g = dy * scale_D
  mean_of = lambda v: jnp.einsum("...d,d->...", v, jnp.full(v.shape[-1], 1 / v.shape[-1], v.dtype),
                                 precision=jax.lax.Precision.HIGHEST)[..., None]
  rows = tuple(range(dy.ndim - 1))
  return inv * (g - mean_of(g) - x_hat * mean_of(g * x_hat)), (dy * x_hat).sum(rows), dy.sum(rows)


_normalize.defvjp(_normalize_forward, _normalize_backward)


class LayerNorm(nn.Module):
  """`nn.LayerNorm` (the same parameters, names and forward values) computed by `layer_norm`."""
  dtype: Any = jnp.float32
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x):
    scale_D = self.param("scale", nn.initializers.ones, (x.shape[-1],))
    bias_D = self.param("bias", nn.initializers.zeros, (x.shape[-1],))
    return layer_norm(x, scale_D, bias_D, self.epsilon).astype(self.dtype)


class Block(nn.Module):
  cfg: ModelConfig
  whole_canvas: bool = False  # a whole-canvas pass: `attend`'s `causal`

  @nn.compact
  def __call__(self, x_BxLxD, start, mask_BxLxT, cache):
    cfg = self.cfg
    h = cfg.d_model // cfg.n_heads
    dense = lambda feats, name: nn.DenseGeneral(feats, dtype=cfg.dtype, name=name)
    y = LayerNorm(dtype=cfg.dtype)(x_BxLxD)
    q_BxLxHxK = dense((cfg.n_heads, h), "query")(y)
    k_BxTxHxK, v_BxTxHxK, cache = write_cache(cache, start, dense((cfg.n_heads, h), "key")(y),
                                              dense((cfg.n_heads, h), "value")(y))
    o_BxLxHxK = attend(q_BxLxHxK, k_BxTxHxK, v_BxTxHxK, mask_BxLxT, cfg.dtype, causal=self.whole_canvas)
    x_BxLxD = x_BxLxD + nn.DenseGeneral(cfg.d_model, axis=(-2, -1), dtype=cfg.dtype, name="out")(o_BxLxHxK)
    y = LayerNorm(dtype=cfg.dtype)(x_BxLxD)
    y = nn.gelu(nn.Dense(cfg.d_ff, dtype=cfg.dtype)(y))
    return x_BxLxD + nn.Dense(cfg.d_model, dtype=cfg.dtype)(y), cache


class Transformer(nn.Module):
  """`tokens_BxL` at canvas positions start..start+L (or `positions_L`: a gathered view's, without a
  cache); returns float32 logits and the updated cache, or with `features` the final features x_BxLxD
  instead of logits (the unembedding is then not built)."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxL, start, key_ok_BxT, cache=None, features=False, positions_L=None):
    cfg = self.cfg
    # The canvas from position 0 without a cache: query i and key i are position i (not a view's tokens
    # gathered out of the canvas, `positions_L`), so `attend` may skip the keys after a query's block.
    whole_canvas = cache is None and positions_L is None and isinstance(start, int) and start == 0
    positions_L = canvas_positions(start, tokens_BxL.shape[1], positions_L)
    mask_BxLxT = visible_mask(positions_L, key_ok_BxT)
    x = nn.Embed(cfg.vocab_size, cfg.d_model, name="embed")(tokens_BxL)
    x = x + nn.Embed(cfg.max_len, cfg.d_model, name="pos_embed")(positions_L)[None]
    x = x.astype(cfg.dtype)
    new_cache = []
    block = remat_layer(Block, cfg.remat and cache is None)
    for i in range(cfg.n_layers):
      x, c = block(cfg, whole_canvas, name=f"block{i}")(x, start, mask_BxLxT, None if cache is None else cache[i])
      new_cache.append(c)
    x = LayerNorm(dtype=cfg.dtype)(x)
    if not features:
      x = nn.Dense(cfg.vocab_size, dtype=cfg.dtype, name="unembed")(x).astype(jnp.float32)  # logits
    return x, (None if cache is None else new_cache)


class Value(nn.Module):
  """A value of whole canvases, value_B: the transformer's final features averaged over the non-PAD
  positions, then a linear head.  Every key is readable: a centralised critic reads every role."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxT):
    valid_BxT = tokens_BxT != text.PAD
    x_BxTxD, _ = Transformer(self.cfg, name="trunk")(tokens_BxT, 0, valid_BxT, features=True)
    weight_BxT = valid_BxT / jnp.maximum(valid_BxT.sum(1, keepdims=True), 1)
    pooled_BxD = jnp.einsum("bt,btd->bd", weight_BxT, x_BxTxD.astype(jnp.float32))
    return nn.Dense(1, name="head")(pooled_BxD)[:, 0]


def init_value(cfg: ModelConfig, key):
  return Value(cfg).init(key, jnp.zeros((1, cfg.max_len), jnp.int32))["params"]


def value(cfg: ModelConfig, params, tokens_BxT):
  return Value(cfg).apply({"params": params}, tokens_BxT)


def init_module_stack(module: nn.Module, max_len: int, key, n_sets: int):
  """Stacked independent initialisations of any module with the (tokens, start, key_ok) call."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  ok = jnp.ones((1, max_len), bool)
  init = lambda k: module.init(k, tokens, 0, ok)["params"]
  # One program: called outside a jit (tests, tools), the initialisers would otherwise compile op by op.
  return jax.jit(jax.vmap(init))(jax.random.split(key, n_sets))


# The agent-model interface that sampling, training and measurement call: `ModelConfig` (the built-in
# transformer) and `lm.agent.LMAgent` (a Qwen3/Llama checkpoint) both provide it, so either is
# `Experiment.model`; a mixed team (`team.Team`) provides the per-set part (`set_model` gives each
# set's own model for `apply`, `empty_cache` and `flops_per_token`).

def apply(model, params, tokens_BxL, start, key_ok_BxT, cache=None, readout_M=None, positions_L=None):
  """One parameter set (unstacked): logits over the engine's symbols and the updated cache; vmap this
  over a stacked leading axis.  `readout_M`: the logits of these positions alone (logits_BxMxV), such as
  the last, all a prefill chunk's reader needs.  `positions_L` (without a cache): the canvas positions
  of tokens gathered from anywhere on it, `key_ok` then per query over them (key_ok_BxLxL)."""
  return model.apply(params, tokens_BxL, start, key_ok_BxT, cache, readout_M=readout_M, positions_L=positions_L)


def empty_cache(model, batch: int, length: int, visible_T=None):
  """The KV cache of `batch` rows over a canvas of `length`, for a view that reads the positions
  `visible_T` (static; None: all)."""
  return model.empty_cache(batch, length, visible_T)


def init_stack(model, key, n_sets: int):
  """`n_sets` independent random initialisations stacked on a leading axis: params_R."""
  return model.init_stack(key, n_sets)


def pretrained_stack(model, n_sets: int):
  """`n_sets` stacked copies of the model's pretrained parameters (host arrays), or None when it has
  none and starts from `init_stack`."""
  return model.pretrained_stack(n_sets)


def set_model(model, index: int):
  """The agent model of parameter set `index` (in a mixed team, its group's)."""
  return model.set_model(index)


def take_sets(model, params_R, index):
  """Sets `index` of params_R (an int: one set, unstacked, for `set_model(model, index)`; an index
  array: a stack of them, within one model group); a part every set shares is passed as it is."""
  return model.take_sets(params_R, index)


def rollout_params(model, params):
  """`params` cast once to the model's compute dtype where it is narrower, as a rollout reads them."""
  return model.rollout_params(params)


def apply_sets(model, params_R, set_N, tokens_BxL, start, key_ok_NxBxT, readout_NxM=None):
  """logits_NxBxLxV: parameter set `set_N[n]` (a static index) reading the same `tokens_BxL` through
  its own keys `key_ok_NxBxT[n]`, all sets of one model group in one vmap; with `readout_NxM` (static),
  logits_NxBxMxV, only those positions' logits (`apply`'s `readout_M`)."""
  return model.apply_sets(params_R, set_N, tokens_BxL, start, key_ok_NxBxT, readout_NxM)


def per_set(model, tx, scale_S) -> optax.GradientTransformation:
  """`tx` on the trained parameters (`trainable`) with one optimiser state per parameter set, set s's
  updates times `scale_S[s]` (0 or False: frozen)."""
  return model.per_set(tx, scale_S)


def set_norms(model, tree_R):
  """norm_S: the global norm of each parameter set's part of a params-shaped tree."""
  return model.set_norms(tree_R)


def trainable(model, tx):
  """The optimiser `tx` restricted to the parameters the model trains (a LoRA agent's adapters)."""
  return model.trainable(tx)


def flops_per_token(model, context_len: int) -> int:
  return model.flops_per_token(context_len)


def whole_pass_flops(model, length: int) -> int:
  """Forward FLOPs of one pass over a whole canvas of `length` positions, without a cache."""
  return model.whole_pass_flops(length)


def count_params(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
