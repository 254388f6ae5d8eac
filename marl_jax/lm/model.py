"""Qwen3- and Llama-family decoders with the built-in model's call contract (`marl_jax.model`).

The same fixed canvas, `key_ok_BxT` & causal mask, KV cache contract (`empty_cache`, passed to
`apply` and handed back written) and stacked parameter sets, so sampling and training code can hold
either model.  RoPE positions are canvas positions: a row whose
text starts later on the canvas (left padding) gets the same attention scores, since RoPE only sees
the distance between query and key.  Parameters are float32; `dtype` is the compute dtype.
"""
import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import model as model_lib

# The decoder's layer scan: every layer parameter lives under this name, stacked on a leading layer axis.
LAYERS = "layers"
# Each layer's projections (the checkpoint's names); `split_kernels` hands a rollout their kernels one
# buffer per layer, in this collection.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LAYER_KERNELS = "layer_kernels"
POSITION_AXIS = {"k": 3, "v": 2}  # the canvas positions' axis in a cache block's k_BxNxKxS and v_BxNxSxK
MODEL_TYPES = ("llama", "qwen3")  # the HF `model_type`s this architecture covers
ROPE_TYPES = ("default", "llama3")


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
  """Llama-3.1's frequency-dependent RoPE interpolation (`rope_type: llama3`)."""
  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class LMConfig:
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  rms_norm_eps: float
  rope_theta: float
  rope_scaling: Llama3RopeScaling | None
  tie_word_embeddings: bool
  qk_norm: bool  # Qwen3's RMSNorm of each query and key head before RoPE
  max_len: int  # canvas length used by `init_stack`; not a limit of the checkpoint
  dtype: Any = jnp.float32  # compute dtype
  remat: bool = False  # whole-canvas passes recompute each layer's activations in the backward pass

  @property
  def model_type(self) -> str:
    return "qwen3" if self.qk_norm else "llama"

  @classmethod
  def from_hf_config(cls, hf: dict, *, max_len: int = 256, dtype: Any = jnp.float32,
                     remat: bool = False) -> "LMConfig":
    """From a Hugging Face `config.json` dict, in either the transformers-4 layout (`rope_theta`,
    `rope_scaling`) or the transformers-5 one (`rope_parameters` holding both)."""
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
      raise ValueError(f"config.json model_type={model_type!r} is not supported; "
                       f"allowed: {list(MODEL_TYPES)}")
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if k not in hf]
    if missing:
      raise ValueError(f"config.json lacks {missing}, required for model_type={model_type!r}")
    # Features of these families that this decoder does not implement are refused, not ignored.
    if "quantization_config" in hf:
      method = hf["quantization_config"].get("quant_method")
      raise ValueError(f"config.json quantization_config (quant_method={method!r}) is not supported: its "
                       "tensors are not the weights; allowed: an unquantised checkpoint")
    for key, allowed in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False),
                         ("use_sliding_window", False), ("partial_rotary_factor", 1.0)):
      if hf.get(key, allowed) != allowed:
        raise ValueError(f"config.json {key}={hf[key]!r} is not supported; allowed: {allowed!r}")
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    if heads % kv_heads:
      raise ValueError(f"config.json num_key_value_heads={kv_heads} must divide "
                       f"num_attention_heads={heads}")
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    return cls(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=float(hf.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        rope_scaling=_rope_scaling(rope, hf.get("max_position_embeddings")),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=model_type == "qwen3", max_len=max_len, dtype=dtype, remat=remat)

  def to_hf_config(self) -> dict:
    """The `config.json` dict that `from_hf_config` (and transformers) reads back as this config."""
    hf = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
          if f.name not in ("qk_norm", "max_len", "dtype", "remat", "rope_scaling")}
    if self.rope_scaling is not None:
      hf["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
    architecture = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[self.model_type]
    return {"model_type": self.model_type, "architectures": [architecture], "hidden_act": "silu", **hf}


def _rope_scaling(rope: dict, max_position_embeddings: int | None) -> Llama3RopeScaling | None:
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type not in ROPE_TYPES:
    raise ValueError(f"config.json rope_scaling.rope_type={rope_type!r} is not supported; "
                     f"allowed: {list(ROPE_TYPES)}")
  if rope_type == "default":
    return None
  # transformers falls back to max_position_embeddings when the original length is not given.
  original = rope.get("original_max_position_embeddings", max_position_embeddings)
  missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in rope]
  if missing or original is None:
    raise ValueError(f"config.json rope_type='llama3' lacks {missing or ['original_max_position_embeddings']}")
  return Llama3RopeScaling(float(rope["factor"]), float(rope["low_freq_factor"]),
                           float(rope["high_freq_factor"]), int(original))


def rope_frequencies(cfg: LMConfig) -> np.ndarray:
  """Inverse frequencies inv_freq_K2 (head_dim/2 of them), rescaled as Llama-3.1 does when asked:
  long wavelengths are divided by `factor`, short ones kept, those between interpolated smoothly."""
  inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2) / cfg.head_dim)
  s = cfg.rope_scaling
  if s is not None:
    wavelen = 2 * math.pi / inv_freq
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    interpolated = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    inv_freq = np.where(wavelen > s.original_max_position_embeddings / s.low_freq_factor,
                        inv_freq / s.factor,
                        np.where(wavelen < s.original_max_position_embeddings / s.high_freq_factor,
                                 inv_freq, interpolated))
  return inv_freq.astype(np.float32)


def rope(x_BxLxHxK, positions_L, inv_freq_K2):
  """Rotates each (i, i + K/2) pair of features by position * inv_freq_i (the "rotate half" layout of
  HF checkpoints), in float32."""
  angle_1xLx1xK2 = (positions_L.astype(jnp.float32)[:, None] * inv_freq_K2)[None, :, None]
  cos, sin = jnp.cos(angle_1xLx1xK2), jnp.sin(angle_1xLx1xK2)
  x1, x2 = jnp.split(x_BxLxHxK.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x_BxLxHxK.dtype)


def attend(q_BxLxHxK, k_BxLxNxK, v_BxLxNxK, mask_BxLxT, start, layer_cache, dtype):
  """Softmax attention (in float32) where N key/value heads serve groups of G = H/N query heads: query
  head h reads key/value head h // G, as grouped-query checkpoints are laid out.  The query heads are
  grouped in the einsums (q_BxLxNxGxK), so keys and values are never repeated to every head.

  Without `layer_cache` the L queries read the L new keys (`mask_BxLxT` over them, T = L).  With it
  (one layer's cache: its blocks of canvas positions, `empty_cache`) they read the cached positions
  before `start` and the new keys at start..start+L-1 (`mask_BxLxT` over the canvas): one softmax over
  both, so nothing has to be written before it is read, and the cache is only read here (`Decoder`
  writes it once).  A `start` known when tracing (a prefill chunk's) reads only the positions before
  it; a traced one (a decode step's) reads each block that holds a position before it, and skips the
  rest through a `lax.cond` when the cache has several blocks: a token costs the keys written so far,
  not the whole canvas's.  Positions in no block (a view's cache holds only the blocks it can see) are
  never read."""
  B, L, H, K = q_BxLxHxK.shape
  N = k_BxLxNxK.shape[2]
  q_BxLxNxGxK = q_BxLxHxK.reshape(B, L, N, H // N, K)
  # Keys are cached [B, N, K, T] (positions minor): XLA:CPU ran this product 30x faster than with the
  # positions major, [B, N, T, K], at a 384-position canvas.
  read_scores = lambda k_BxNxKxS: jnp.einsum("blngk,bnks->bnlgs", q_BxLxNxGxK, k_BxNxKxS)
  read_values = lambda v_BxNxSxK: lambda w: jnp.einsum("bnlgs,bnsk->bnlgk", w, v_BxNxSxK)
  skip = lambda shape: lambda *_: jnp.zeros(shape, q_BxLxNxGxK.dtype)  # a skipped block's scores or values
  # One part per key source: (scores, their mask, the product of their weights with the values).
  parts = []
  new_mask_BxLxL = mask_BxLxT
  if layer_cache is not None:
    static = isinstance(start, (int, np.integer))
    skips = not static and len(layer_cache) > 1
    for offset, block in layer_cache.items():
      k_BxNxKxS, v_BxNxSxK = block["k"], block["v"]
      S = v_BxNxSxK.shape[POSITION_AXIS["v"]]
      mask_BxLxS = mask_BxLxT[..., offset:offset + S]
      if static:
        S = min(S, start - offset)
        if S <= 0:
          continue
        k_BxNxKxS, v_BxNxSxK, mask_BxLxS = k_BxNxKxS[..., :S], v_BxNxSxK[:, :, :S], mask_BxLxS[..., :S]
      else:
        mask_BxLxS = mask_BxLxS & (offset + jnp.arange(S) < start)
      if not skips:
        parts.append((read_scores(k_BxNxKxS), mask_BxLxS, read_values(v_BxNxSxK)))
      else:  # a block that holds no position before `start` is neither read nor weighed
        read = offset < start
        parts.append((jax.lax.cond(read, read_scores, skip((B, N, L, H // N, S)), k_BxNxKxS), mask_BxLxS,
                      functools.partial(jax.lax.cond, read, read_values(v_BxNxSxK), skip((B, N, L, H // N, K)))))
    new_mask_BxLxL = (mask_BxLxT[..., start:start + L] if static
                      else jax.lax.dynamic_slice_in_dim(mask_BxLxT, start, L, 2))
  parts.append((jnp.einsum("blngk,bmnk->bnlgm", q_BxLxNxGxK, k_BxLxNxK), new_mask_BxLxL,
                lambda w: jnp.einsum("bnlgm,bmnk->bnlgk", w, v_BxLxNxK)))
  scale = np.sqrt(K).astype(np.float32)
  att_BxNxLxGxS = jnp.concatenate(
      [jnp.where(m_BxLxS[:, None, :, None], s.astype(jnp.float32) / scale, -1e9) for s, m_BxLxS, _ in parts],
      -1)
  att_BxNxLxGxS = jax.nn.softmax(att_BxNxLxGxS, axis=-1).astype(dtype)
  widths = [m_BxLxS.shape[-1] for _, m_BxLxS, _ in parts]
  weights = jnp.split(att_BxNxLxGxS, np.cumsum(widths)[:-1], axis=-1)
  o_BxNxLxGxK = sum(weigh(w) for w, (_, _, weigh) in zip(weights, parts))
  # Heads before positions in the product's output: XLA:CPU computed [B, L, N, G, K] directly as a
  # slower transposed product (12x at a 384-position canvas), so the small result is transposed after.
  return jnp.transpose(o_BxNxLxGxK, (0, 2, 1, 3, 4)).reshape(B, L, H, K)


class Projection(nn.DenseGeneral):
  """A layer's projection (a `DenseGeneral`, which `lm.lora` adapts): its layer's slice of the stacked
  kernel, or, where the `LAYER_KERNELS` collection holds its kernel one buffer per layer
  (`split_kernels`), the buffer of layer `layer` (traced), read through a `lax.switch` where it lies.
  Slicing a stacked kernel at a traced layer copies the slice into a fresh buffer before the product
  reads it: in a decode token at Qwen3-0.6B's shapes (batch 32, float32, 2-core CPU) those copies took
  0.9x the time of the layers' products themselves (268 against 287 ms of traced thunks)."""

  @nn.compact
  def __call__(self, inputs, layer):
    if not self.has_variable(LAYER_KERNELS, "kernel"):
      # DenseGeneral's body as a function, not as a second method call: `lm.lora`'s interceptor would
      # adapt the projection once per call.
      return nn.DenseGeneral.__call__.__wrapped__(self, inputs)
    axis = tuple(np.atleast_1d(self.axis) % inputs.ndim)
    product = lambda kernel, x: jax.lax.dot_general(
        *self.promote_dtype(x, kernel, dtype=self.dtype), ((axis, tuple(range(len(axis)))), ((), ())))
    return jax.lax.switch(layer, [functools.partial(product, kernel)
                                  for kernel in self.get_variable(LAYER_KERNELS, "kernel")], inputs)


class Layer(nn.Module):
  """Pre-norm attention and SwiGLU MLP; submodule names are the checkpoint's (see checkpoint.py).

  The carry is (x_BxLxD, this layer's index); with a cache the layer returns its new keys and values
  (rotated) rather than a written cache, and reads its own cache through a `lax.switch` on the index:
  each layer's cache is its own buffer, which a branch reads where it lies, where slicing a stacked
  cache at a traced layer copies the slice (on CPU, 3x the time of the read itself).  Its projections
  read their kernels the same way when they come one buffer per layer (`Projection`, `split_kernels`)."""
  cfg: LMConfig

  @nn.compact
  def __call__(self, carry, start, positions_L, mask_BxLxT, cache):
    cfg = self.cfg
    x_BxLxD, layer = carry
    norm = lambda name: nn.RMSNorm(epsilon=cfg.rms_norm_eps, dtype=cfg.dtype, name=name)
    dense = lambda feats, name, y: Projection(feats, use_bias=False, dtype=cfg.dtype, name=name)(y, layer)
    heads_q, heads_kv = (cfg.num_attention_heads, cfg.head_dim), (cfg.num_key_value_heads, cfg.head_dim)
    y_BxLxD = norm("input_layernorm")(x_BxLxD)
    q_BxLxHxK = dense(heads_q, "q_proj", y_BxLxD)
    k_BxLxNxK = dense(heads_kv, "k_proj", y_BxLxD)
    if cfg.qk_norm:
      q_BxLxHxK, k_BxLxNxK = norm("q_norm")(q_BxLxHxK), norm("k_norm")(k_BxLxNxK)
    inv_freq_K2 = rope_frequencies(cfg)
    # Keys enter the cache already rotated to their own canvas position.
    q_BxLxHxK = rope(q_BxLxHxK, positions_L, inv_freq_K2)
    k_BxLxNxK = rope(k_BxLxNxK, positions_L, inv_freq_K2)
    v_BxLxNxK = dense(heads_kv, "v_proj", y_BxLxD)
    attention = lambda layer_cache: attend(q_BxLxHxK, k_BxLxNxK, v_BxLxNxK, mask_BxLxT, start, layer_cache,
                                           cfg.dtype)
    if cache is None:
      o_BxLxHxK, new_kv = attention(None), None
    else:
      o_BxLxHxK = jax.lax.switch(layer, [functools.partial(attention, c) for c in cache])
      new_kv = (k_BxLxNxK, v_BxLxNxK)
    x_BxLxD = x_BxLxD + Projection(cfg.hidden_size, axis=(-2, -1), use_bias=False, dtype=cfg.dtype,
                                   name="o_proj")(o_BxLxHxK, layer)
    y_BxLxD = norm("post_attention_layernorm")(x_BxLxD)
    y_BxLxF = nn.silu(dense(cfg.intermediate_size, "gate_proj", y_BxLxD)) * dense(
        cfg.intermediate_size, "up_proj", y_BxLxD)
    return (x_BxLxD + dense(cfg.hidden_size, "down_proj", y_BxLxF), layer + 1), new_kv


class Decoder(nn.Module):
  """`tokens_BxL` at canvas positions start..start+L; returns float32 logits and the updated cache,
  or with `features` the final normed features x_BxLxD instead of logits (no unembedding is applied:
  `lm.agent` applies only the rows of the tokens it reads out).  With `readout_M` only those positions'
  (logits_BxMxV or x_BxMxD): a prefill chunk reads only its last, the update only the positions whose
  tokens a policy wrote.

  The layers are one `nn.scan`: every layer's parameters (and `lm.lora`'s adapters in the `lora`
  collection) are stacked on a leading layer axis ("layers/q_proj/kernel" is
  [layers, hidden, heads, head_dim]), and each program holds one layer's code whatever the depth.
  Written out layer by layer, compiling grew with depth (a 28-layer model's tiny solver-verifier run:
  147 s on 2 CPU cores, 38 s scanned; a Qwen3-0.6B-shaped run on an H200 had not compiled its first
  evaluation after 4 minutes).  The scan reads the cache and hands out the new keys and values; they
  are written after it, one `dynamic_update_slice` per layer, in place where the cache is a decode
  loop's carry (the scan taking the cache in and handing a new one out copied the whole cache every
  token)."""
  cfg: LMConfig

  @nn.compact
  def __call__(self, tokens_BxL, start, key_ok_BxT, cache=None, features=False, readout_M=None,
               positions_L=None):
    cfg = self.cfg
    positions_L = model_lib.canvas_positions(start, tokens_BxL.shape[1], positions_L)
    mask_BxLxT = model_lib.visible_mask(positions_L, key_ok_BxT)
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype, name="embed_tokens")
    x_BxLxD = embed(tokens_BxL)
    # `remat` in whole-canvas passes (no cache; `start` static, as `attend` needs it): the backward pass
    # recomputes each layer from its input, so only the layers' inputs are kept.
    layer = model_lib.remat_layer(Layer, cfg.remat and cache is None, scanned=True)
    layers = nn.scan(layer, variable_axes={"params": 0, "lora": 0}, variable_broadcast=LAYER_KERNELS,
                     split_rngs={"params": True}, in_axes=(nn.broadcast,) * 4, length=cfg.num_hidden_layers)
    (x_BxLxD, _), new_kv = layers(cfg, name=LAYERS)((x_BxLxD, jnp.int32(0)), start, positions_L,
                                                    mask_BxLxT, cache)
    if cache is not None:
      cache = [write_cache(c, start, k_BxLxNxK, v_BxLxNxK) for c, k_BxLxNxK, v_BxLxNxK in zip(cache, *new_kv)]
    x_BxLxD = model_lib.read_out(x_BxLxD, readout_M)
    x_BxLxD = nn.RMSNorm(epsilon=cfg.rms_norm_eps, dtype=cfg.dtype, name="norm")(x_BxLxD)
    if features:
      return x_BxLxD, cache
    if cfg.tie_word_embeddings:
      logits_BxLxV = embed.attend(x_BxLxD)
    else:
      logits_BxLxV = nn.Dense(cfg.vocab_size, use_bias=False, dtype=cfg.dtype, name="lm_head")(x_BxLxD)
    return logits_BxLxV.astype(jnp.float32), cache


def empty_cache(cfg: LMConfig, batch: int, length: int, block: int | None = None, visible_T=None):
  """Keys and values of every layer (a list), each layer's its own buffers, in blocks of `block`
  canvas positions (the last block shorter; one block of the whole canvas without `block`): per layer
  a dict {the block's first position: {"k": k_BxNxKxS, "v": v_BxNxSxK}}, keys rotated and with the
  positions minor (the layout the decode step's q.k reads fastest).  With `visible_T` (the positions a
  view may read) only the blocks holding one of them: a voter's cache holds no other voter's message.
  A decode step reads only the blocks written so far (`attend`); each block is its own buffer because
  reading part of one buffer copies that part first (XLA:CPU)."""
  B, N, K = batch, cfg.num_key_value_heads, cfg.head_dim
  offsets = np.arange(0, length, block or length)
  widths = np.diff(np.r_[offsets, length])
  seen = np.ones(length, bool) if visible_T is None else np.asarray(visible_T, bool)
  kept = [(int(o), int(S)) for o, S in zip(offsets, widths) if seen[o:o + S].any()]
  return [{o: {"k": jnp.zeros((B, N, K, S), cfg.dtype), "v": jnp.zeros((B, N, S, K), cfg.dtype)} for o, S in kept}
          for _ in range(cfg.num_hidden_layers)]


def write_cache(layer_cache, start, k_BxLxNxK, v_BxLxNxK):
  """One layer's cache with the L new keys and values written at canvas positions start.., each into
  the block that holds it (a position in no block is not kept: its view never reads it).  A traced
  `start` (a decode step's, L = 1) writes every block, at the block's own position where it holds
  `start` and elsewhere the value it already had: in place, where a `lax.switch` choosing the block
  copied the whole cache every token."""
  L = k_BxLxNxK.shape[1]
  new = {"k": jnp.transpose(k_BxLxNxK, (0, 2, 3, 1)), "v": jnp.transpose(v_BxLxNxK, (0, 2, 1, 3))}
  static = isinstance(start, (int, np.integer))
  whole = list(layer_cache) == [0]  # one block from position 0: a traced write lands in it
  if not static and L > 1 and not whole:
    raise ValueError(f"a cache in blocks {sorted(layer_cache)} takes one token at a traced position, not {L}")

  def write(offset, block):
    S = block["v"].shape[POSITION_AXIS["v"]]
    if static:
      lo, hi = max(start, offset), min(start + L, offset + S)
      if lo >= hi:
        return block
      part = {n: jax.lax.slice_in_dim(x, lo - start, hi - start, axis=POSITION_AXIS[n]) for n, x in new.items()}
      at = lo - offset
    elif whole:
      part, at = new, start
    else:
      at = jnp.clip(start - offset, 0, S - 1)
      holds = (offset <= start) & (start < offset + S)
      part = {n: jnp.where(holds, x, jax.lax.dynamic_slice_in_dim(block[n], at, 1, POSITION_AXIS[n]))
              for n, x in new.items()}
    return {n: jax.lax.dynamic_update_slice_in_dim(x, part[n].astype(x.dtype), at, POSITION_AXIS[n])
            for n, x in block.items()}

  return {offset: write(offset, block) for offset, block in layer_cache.items()}


def init_stack(cfg: LMConfig, key, n_sets: int):
  """`n_sets` independent (randomly initialised) parameter sets stacked on a leading axis: params_R."""
  return model_lib.init_module_stack(Decoder(cfg), cfg.max_len, key, n_sets)


def split_kernels(params):
  """One parameter set (unstacked) as a rollout reads it token after token: each layer's projection
  kernels their own buffers (a tuple over the layers in place of the stacked kernel), which `variables`
  hands the projections in the `LAYER_KERNELS` collection, so that they read them where they lie
  (`Projection`).  Made once per rollout (`lm.agent`'s `rollout_params`): one copy of the layers'
  kernels, where the layer scan would slice the stacked kernels into fresh buffers at every token."""
  layers = dict(params[LAYERS])
  for name in PROJECTIONS:
    layers[name] = {**layers[name], "kernel": tuple(layers[name]["kernel"])}
  return {**params, LAYERS: layers}


def variables(params, adapter=None):
  """The decoder's variables for one parameter set, stacked or `split_kernels`' (its per-layer kernels
  in the `LAYER_KERNELS` collection), and one role's `lm.lora` adapters (the `lora` collection)."""
  layers = dict(params[LAYERS])
  split = {name: {"kernel": layers.pop(name)["kernel"]} for name in PROJECTIONS
           if isinstance(layers[name]["kernel"], tuple)}
  out = {"params": {**params, LAYERS: layers}, LAYER_KERNELS: {LAYERS: split}} if split else {"params": params}
  if adapter is not None:
    out["lora"] = adapter
  return out


def apply(cfg: LMConfig, params, tokens_BxL, start, key_ok_BxT, cache=None, adapter=None,
          readout_M=None):
  """One parameter set (unstacked, or `split_kernels`'); vmap this over a stacked leading axis.
  `adapter`: one role's `lm.lora` adapters, read by `lora.adapted`'s projections (the `lora`
  collection).  `readout_M`: those positions' logits only (logits_BxMxV)."""
  return Decoder(cfg).apply(variables(params, adapter), tokens_BxL, start, key_ok_BxT, cache,
                            readout_M=readout_M)


def flops_per_token(cfg: LMConfig, context_len: int) -> int:
  """Forward FLOPs of one token (a multiply-add is 2): projections, MLP and unembedding, and attention
  over `context_len` keys (a whole-canvas pass reads the whole canvas: the mask hides keys, it does not
  skip them; a decode step on CPU reads the blocks of its cache written so far, `attend`)."""
  D, q_width = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim
  kv_width = cfg.num_key_value_heads * cfg.head_dim
  per_layer = 2 * D * q_width + 2 * D * kv_width + 3 * D * cfg.intermediate_size
  attention = cfg.num_hidden_layers * 2 * context_len * q_width  # q.k and att.v
  return 2 * (cfg.num_hidden_layers * per_layer + D * cfg.vocab_size + attention)
