"""Qwen3/Llama parameters sharded over a `model` mesh axis (FSDP-style) beside the batch's `data` axis.

Which dimension of which parameter is split is data, not code: an ordered list of rules
(regex, spec), the first whose regex `re.search`es a parameter's path ("layers/q_proj/kernel") giving
its spec, one mesh axis name (or None: not split) per dimension of one layer's parameter (the layers'
stacked axis is never split). A model too large for one device is
then held as 1/model of every large matrix per device; under `jit` XLA adds the communication each
matmul needs (the mesh's axes are Auto), so the forward pass is `lm.model.apply` unchanged. Every parameter is
checked against the rules and the mesh before anything is placed or compiled.
"""
import re
from collections.abc import Mapping, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

from marl_jax import parallel
from marl_jax.lm import model as lm_model

MODEL = parallel.MODEL
DATA = parallel.DATA

Rule = tuple[str, tuple[str | None, ...]]

# Large matrices are split on a large dimension: vocabulary rows of the embeddings, hidden_size of the
# attention projections (not heads: Qwen3 and Llama-3 have 8 key/value heads, fewer than a pod has
# devices), intermediate_size of the MLP. Norm scales are tiny and read by every token, so each device
# keeps a whole copy.
DEFAULT_RULES: tuple[Rule, ...] = (
    (r"embed_tokens/embedding$", (MODEL, None)),     # [vocab, hidden]
    (r"lm_head/kernel$", (None, MODEL)),             # [hidden, vocab]
    (r"[qkv]_proj/kernel$", (MODEL, None, None)),    # [hidden, heads, head_dim]
    (r"o_proj/kernel$", (None, None, MODEL)),        # [heads, head_dim, hidden]
    (r"(gate|up)_proj/kernel$", (None, MODEL)),      # [hidden, intermediate]
    (r"down_proj/kernel$", (MODEL, None)),           # [intermediate, hidden]
    (r"norm/scale$", (None,)),                       # every RMSNorm, q_norm and k_norm included
)


def rules_from_config(model_config) -> tuple[Rule, ...]:
  """`config.model.sharding_rules` ([regex, [axis or None, ...]] pairs, as a config or its JSON holds
  them), or `DEFAULT_RULES` when the config has none."""
  given = model_config.get("sharding_rules")
  if given is None:
    return DEFAULT_RULES
  rules = []
  for i, rule in enumerate(given):
    if (not isinstance(rule, Sequence) or len(rule) != 2 or not isinstance(rule[0], str)
        or not isinstance(rule[1], Sequence) or isinstance(rule[1], str)):
      raise ValueError(f"config.model.sharding_rules[{i}]={rule!r} must be a pair "
                       f"(regex, [mesh axis name or None per dimension])")
    try:
      re.compile(rule[0])
    except re.error as e:
      raise ValueError(f"config.model.sharding_rules[{i}] regex {rule[0]!r} does not compile: {e}") from e
    rules.append((rule[0], tuple(rule[1])))
  return tuple(rules)


def mesh(data: int, model: int) -> jax.sharding.Mesh:
  """A (data, model) mesh over every device (of every process)."""
  if data < 1 or model < 1 or data * model != jax.device_count():
    raise ValueError(f"a mesh of data={data} x model={model} needs {data * model} devices, but "
                     f"{jax.device_count()} are visible: data * model must equal the device count")
  return parallel.auto_mesh({DATA: data, MODEL: model}, jax.devices())


def _spec(path: str, shape: tuple[int, ...], axis_sizes: Mapping[str, int],
          rules: Sequence[Rule], leading_axes: int) -> PartitionSpec:
  """The first matching rule's spec for one parameter, checked against its shape and the mesh."""
  rule = next((r for r in rules if re.search(r[0], path)), None)
  if rule is None:
    raise ValueError(f"parameter {path} of shape {shape} matches no sharding rule "
                     f"(config.model.sharding_rules); rules: {[r[0] for r in rules]}")
  regex, dims = rule
  trailing = shape[leading_axes:]
  if len(dims) != len(trailing):
    raise ValueError(f"sharding rule {regex!r} -> {dims} has {len(dims)} dimensions, but parameter "
                     f"{path} has shape {shape} ({leading_axes} leading stacked axes)")
  for dim, (size, axis) in enumerate(zip(trailing, dims)):
    if axis is None:
      continue
    if axis not in axis_sizes:
      raise ValueError(f"sharding rule {regex!r} names mesh axis {axis!r}; the mesh has "
                       f"{list(axis_sizes)}")
    if size % axis_sizes[axis]:
      raise ValueError(f"parameter {path} of shape {shape}: dimension {leading_axes + dim} "
                       f"({size}) does not divide by mesh axis {axis!r} of size {axis_sizes[axis]} "
                       f"(sharding rule {regex!r} -> {dims})")
  # Stacked sets (params_R, params_SxR) keep their leading axes whole on every device.
  return PartitionSpec(*(None,) * leading_axes, *dims)


def partition_specs(params, axis_sizes: Mapping[str, int], rules: Sequence[Rule] = DEFAULT_RULES,
                    leading_axes: int = 0):
  """A PartitionSpec per parameter (same tree as `params`, arrays or shapes); `axis_sizes` is
  `mesh.shape`. The rules see each parameter's trailing dimensions, after `leading_axes` and, under
  "layers", the layer axis."""
  def spec(path, leaf):
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    layer_axis = int(f"/{lm_model.LAYERS}/" in f"/{name}")
    return _spec(name, tuple(leaf.shape), axis_sizes, rules, leading_axes + layer_axis)
  return jax.tree_util.tree_map_with_path(spec, params)


def state_shardings(tree, mesh: jax.sharding.Mesh, rules: Sequence[Rule] = DEFAULT_RULES):
  """A NamedSharding per leaf of a training state (arrays or shapes): a leaf whose path a rule matches
  and that has the rule's dimensions after any leading (stacked: seeds, sets) axes is split as the
  rule says, those axes whole: the parameter sets, the base model's copy and the optimiser's moments,
  whose paths end with the parameter's.  Every other leaf (step counts, keys, LoRA adapters, a critic)
  is replicated.  Check the parameters themselves with `partition_specs`, which refuses a parameter
  no rule matches."""
  def sharding(path, leaf):
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    rule = next((r for r in rules if re.search(r[0], name)), None)
    if rule is None or len(rule[1]) > len(leaf.shape):
      return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, _spec(name, tuple(leaf.shape), mesh.shape, [rule],
                                     len(leaf.shape) - len(rule[1])))
  return jax.tree_util.tree_map_with_path(sharding, tree)


def shard_params(params, mesh: jax.sharding.Mesh, rules: Sequence[Rule] = DEFAULT_RULES,
                 leading_axes: int = 0):
  """`params` placed on `mesh`, each leaf split as its rule says."""
  specs = partition_specs(params, mesh.shape, rules, leading_axes)
  return jax.device_put(params, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))


_apply = jax.jit(lm_model.apply, static_argnums=0)


def shard_rows(mesh: jax.sharding.Mesh, tree):
  """Every leaf of `tree` (a batch: tokens, masks, a KV cache) split over `data` on its leading axis."""
  for x in jax.tree.leaves(tree):
    if x.shape[0] % mesh.shape[DATA]:
      raise ValueError(f"a batch of {x.shape[0]} rows does not divide by mesh axis {DATA!r} of size "
                       f"{mesh.shape[DATA]}")
  return jax.device_put(tree, NamedSharding(mesh, PartitionSpec(DATA)))


def apply(cfg: lm_model.LMConfig, mesh: jax.sharding.Mesh, params, tokens_BxL, start, key_ok_BxT,
          cache=None):
  """`lm.model.apply` of `shard_params` output with the batch (and cache) split over `data`:
  (logits_BxLxV, cache). The inputs' shardings are the program's (XLA adds the communication), so
  no device holds a whole large parameter at rest."""
  tokens_BxL, key_ok_BxT, cache = shard_rows(mesh, (tokens_BxL, key_ok_BxT, cache))
  return _apply(cfg, params, tokens_BxL, start, key_ok_BxT, cache)
