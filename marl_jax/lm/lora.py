"""Low-rank adapters (LoRA) per role over one frozen Qwen3/Llama base shared by all roles.

Each role has, for every target projection kernel W[in..., out...] of every layer, a pair
a[in..., rank] (random) and b[rank, out...] (zeros at init), stacked over the layers as the kernels
are (`lm.model`'s layer scan slices them with the weights); the projection computes
W x + (alpha / rank) * b(a x), so a fresh adapter leaves the logits exactly as the base's. Adapters are
stacked on a leading role axis (`adapters_R`) and vmapped with the base broadcast. Only `adapters_R` is
differentiated and handed to the optimiser, so optimiser state never holds a base-shaped leaf.

Two paths over the one decoder of `lm.model` (not a copy of it):

- `apply` adds the low-rank product beside each target's output through a Flax method interceptor on
  the target `DenseGeneral` modules. It never forms W + dW: a role costs rank * (in + out) parameters
  and multiply-adds per token and target, where merging would hold a full copy of every target kernel
  (and its gradient) per role, R times the model — what decides it when the base is large.
- `merged_params` forms W + scale * a@b: one ordinary parameter set, to save a trained role as a
  Hugging Face checkpoint (`save_merged`) and serve it elsewhere.
"""
import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from marl_jax.lm import hf_checkpoint
from marl_jax.lm import model as lm_model

# The names lm.model gives its projection kernels (also the checkpoint's).
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  rank: int
  alpha: float
  targets: tuple[str, ...] = TARGETS

  def __post_init__(self):
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
      raise ValueError(f"lora.rank={self.rank!r} must be an integer >= 1")
    # The adapters' output is scaled by alpha / rank: at 0 their gradients are 0 and they never train.
    if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
      raise ValueError(f"lora.alpha={self.alpha!r} must be a number > 0")
    # A config gives them as one comma-separated string; its error shows that string as written.
    targets = (tuple(t for t in self.targets.split(",") if t) if isinstance(self.targets, str)
               else tuple(self.targets))
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
      raise ValueError(f"lora.targets={self.targets!r}: "
                       f"{'unknown ' + repr(unknown) if unknown else 'none given'}; "
                       f"allowed: one or more of {list(TARGETS)}")
    object.__setattr__(self, "targets", targets)  # a tuple, so the config hashes (jit static arg)

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def _on_targets(lora_cfg: LoRAConfig, on_output):
  """A context in which each target projection's output y = W x is replaced by
  on_output(module, x, y)."""
  def interceptor(next_fun, args, kwargs, context):
    y = next_fun(*args, **kwargs)
    module = context.module
    if (context.method_name == "__call__" and isinstance(module, nn.DenseGeneral)
        and module.name in lora_cfg.targets):
      return on_output(module, args[0], y)
    return y
  return nn.intercept_methods(interceptor)


def adapted(lora_cfg: LoRAConfig):
  """A context in which every target projection of a Flax model applied within adds scale * b(a x),
  a and b read from the `lora` collection at the projection's own path (one role's adapter, passed as
  `{"params": ..., "lora": adapter}`), without forming a@b.  A collection is what `lm.model`'s layer
  scan slices layer by layer, as it slices the weights."""
  def add_low_rank(module, x, y):
    if not module.has_variable("lora", "a"):
      raise ValueError(f"the adapter has no pair for {'/'.join(module.path)}: it was made for other "
                       f"targets than {list(lora_cfg.targets)} (init_adapters with this LoRAConfig)")
    a, b = module.get_variable("lora", "a"), module.get_variable("lora", "b")
    h = jnp.tensordot(x, a.astype(x.dtype), axes=a.ndim - 1)  # x[..., in...] . a[in..., rank]
    return y + (lora_cfg.scale * jnp.tensordot(h, b.astype(x.dtype), axes=1)).astype(y.dtype)
  return _on_targets(lora_cfg, add_low_rank)


def apply(cfg: lm_model.LMConfig, lora_cfg: LoRAConfig, base, adapter, tokens_BxL, start, key_ok_BxT,
          cache=None):
  """`lm.model.apply` of the base with one role's adapter: (logits_BxLxV, cache)."""
  with adapted(lora_cfg):
    return lm_model.apply(cfg, base, tokens_BxL, start, key_ok_BxT, cache, adapter=adapter)


def apply_stacked(cfg: lm_model.LMConfig, lora_cfg: LoRAConfig, base, adapters_R, tokens_BxL, start,
                  key_ok_BxT, cache_R=None):
  """Every role on the same tokens: (logits_RxBxLxV, cache_R); the base is broadcast, not copied."""
  apply_R = jax.vmap(functools.partial(apply, cfg, lora_cfg), in_axes=(None, 0, None, None, None, 0))
  return apply_R(base, adapters_R, tokens_BxL, start, key_ok_BxT, cache_R)


def _target_shapes(cfg: lm_model.LMConfig, lora_cfg: LoRAConfig, base):
  """Module path of each target projection -> (input feature shape, output feature shape) of one
  layer, traced from the model itself (nothing is computed)."""
  shapes = {}

  def record(module, x, y):
    n_in = len(np.atleast_1d(module.axis))  # o_proj contracts (heads, head_dim)
    shapes[module.path] = (x.shape[x.ndim - n_in:], y.shape[x.ndim - n_in:])
    return y
  with _on_targets(lora_cfg, record):
    # A fresh lambda each call, so no cached trace skips the interceptor.
    jax.eval_shape(lambda p: lm_model.apply(cfg, p, jnp.zeros((1, 1), jnp.int32), 0,
                                            jnp.ones((1, 1), bool)), base)
  return shapes


def init_adapters(key, cfg: lm_model.LMConfig, lora_cfg: LoRAConfig, base, n_roles: int):
  """adapters_R: per role and target, a[R, layers, in..., rank] ~ U(+-1/sqrt(fan_in)) (PEFT's
  default) and b[R, layers, rank, out...] = 0, float32 (every target is a layer's projection, stacked
  on the layer axis as its kernel is)."""
  flat = {}
  L = cfg.num_hidden_layers
  for i, (path, (in_shape, out_shape)) in enumerate(sorted(_target_shapes(cfg, lora_cfg, base).items())):
    bound = 1 / math.sqrt(math.prod(in_shape))
    flat[path + ("a",)] = jax.random.uniform(jax.random.fold_in(key, i), (n_roles, L, *in_shape, lora_cfg.rank),
                                             jnp.float32, -bound, bound)
    flat[path + ("b",)] = jnp.zeros((n_roles, L, lora_cfg.rank, *out_shape), jnp.float32)
  return traverse_util.unflatten_dict(flat)


def merged_params(lora_cfg: LoRAConfig, base, adapter):
  """One ordinary parameter set: each target kernel W + scale * a@b of one role's adapter."""
  flat = traverse_util.flatten_dict(base)
  pairs = traverse_util.flatten_dict(adapter)
  for path in {p[:-1] for p in pairs}:
    a, b, kernel = pairs[path + ("a",)], pairs[path + ("b",)], flat[path + ("kernel",)]
    # kernel[lead..., in..., out...], a[lead..., in..., rank], b[lead..., rank, out...]: the leading
    # (layer) axes are batched, the rank contracted.
    product = functools.partial(jnp.tensordot, axes=1)
    for _ in range(a.ndim + b.ndim - 2 - kernel.ndim):
      product = jax.vmap(product)
    flat[path + ("kernel",)] = kernel + lora_cfg.scale * product(a, b)
  return traverse_util.unflatten_dict(flat)


def save_merged(directory: str, cfg: lm_model.LMConfig, lora_cfg: LoRAConfig, base, adapter,
                source: dict | None = None) -> None:
  """Writes the base with one role's adapter merged in as a Hugging Face checkpoint (`hf_checkpoint.save`:
  a new directory only), which `hf_checkpoint.load` and transformers read as a plain model; `source`, the
  base's config.json, gives it the token ids and context length a server reads."""
  hf_checkpoint.save(directory, cfg, merged_params(lora_cfg, base, adapter), source)
