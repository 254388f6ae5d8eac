"""marl_jax.lm.lora on the tiny checkpoints of tests/fixtures/lm: two roles' adapters over one base."""
import functools
import pathlib

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from marl_jax.lm import hf_checkpoint
from marl_jax.lm import lora
from marl_jax.lm import model as lm_model

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "lm"
FAMILIES = ["qwen3", "llama"]
LORA = lora.LoRAConfig(rank=2, alpha=4.0)
_apply_stacked = jax.jit(lora.apply_stacked, static_argnums=(0, 1))


@functools.cache
def _setup(family: str):
  """(cfg, base, fresh adapters_R of 2 roles, tokens_BxP, key_ok_BxP)."""
  cfg, base = hf_checkpoint.load(str(FIXTURES / family), max_len=40)
  ref = np.load(FIXTURES / family / "reference.npz")
  adapters_R = lora.init_adapters(jax.random.key(0), cfg, LORA, base, 2)
  return cfg, base, adapters_R, ref["tokens_BxP"], ref["mask_BxP"]


@functools.partial(jax.jit, static_argnums=0)
def _apply_params_R(cfg, params_R, tokens_BxL, key_ok_BxT):
  """Plain `lm.model.apply` vmapped over stacked parameter sets: logits_RxBxLxV."""
  return jax.vmap(lambda p: lm_model.apply(cfg, p, tokens_BxL, 0, key_ok_BxT)[0])(params_R)


def _stack(*trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _role(tree_R, r: int):
  return jax.tree.map(lambda x: x[r], tree_R)


@functools.cache
def _trained_like(family: str):
  """The fresh adapters with random b (distinct per role), as training would leave them."""
  adapters_R = _setup(family)[2]
  flat = traverse_util.flatten_dict(adapters_R)
  keys = jax.random.split(jax.random.key(1), len(flat))
  return traverse_util.unflatten_dict(
      {p: 0.1 * jax.random.normal(k, x.shape) if p[-1] == "b" else x
       for k, (p, x) in zip(keys, sorted(flat.items()))})


@pytest.mark.parametrize("family", FAMILIES)
def test_fresh_adapters_leave_logits_exactly_unchanged(family):
  cfg, base, adapters_R, tokens_BxP, ok_BxP = _setup(family)
  logits_RxBxPxV, _ = _apply_stacked(cfg, LORA, base, adapters_R, tokens_BxP, 0, ok_BxP)
  # The same batched layout of the plain model (vmapped matmuls may round differently from unbatched).
  np.testing.assert_array_equal(logits_RxBxPxV, _apply_params_R(cfg, _stack(base, base), tokens_BxP, ok_BxP))


def test_low_rank_delta_by_hand():
  """x = [1, 2], W = I, a = I, b = [[3, -1], [1, 1]], alpha 4, rank 2 (scale alpha / rank = 2):
  W x + 2 * b(a x) = [1, 2] + 2 * (1 * [3, -1] + 2 * [1, 1]) = [11, 4]; merged W + 2 a b = [[7, -2], [2, 3]]."""
  class OneProjection(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.DenseGeneral(2, use_bias=False, name="q_proj")(x)

  lora_cfg = lora.LoRAConfig(rank=2, alpha=4.0, targets=("q_proj",))
  base = {"q_proj": {"kernel": jnp.eye(2)}}
  adapter = {"q_proj": {"a": jnp.eye(2), "b": jnp.array([[3.0, -1.0], [1.0, 1.0]])}}
  with lora.adapted(lora_cfg):
    y = OneProjection().apply({"params": base, "lora": adapter}, jnp.array([1.0, 2.0]))
  np.testing.assert_array_equal(y, [11.0, 4.0])
  merged = lora.merged_params(lora_cfg, base, adapter)
  np.testing.assert_array_equal(merged["q_proj"]["kernel"], [[7.0, -2.0], [2.0, 3.0]])
  np.testing.assert_array_equal(OneProjection().apply({"params": merged}, jnp.array([1.0, 2.0])), [11.0, 4.0])
  with pytest.raises(ValueError, match="no pair for q_proj"), lora.adapted(lora_cfg):
    OneProjection().apply({"params": base}, jnp.array([1.0, 2.0]))


@pytest.mark.parametrize("family", FAMILIES)
def test_merged_weights_equal_low_rank_path_and_roles_differ(family):
  cfg, base, _, tokens_BxP, ok_BxP = _setup(family)
  adapters_R = _trained_like(family)
  logits_RxBxPxV, _ = _apply_stacked(cfg, LORA, base, adapters_R, tokens_BxP, 0, ok_BxP)
  merged_R = _stack(*(lora.merged_params(LORA, base, _role(adapters_R, r)) for r in range(2)))
  merged_RxBxPxV = _apply_params_R(cfg, merged_R, tokens_BxP, ok_BxP)
  scale = np.abs(merged_RxBxPxV).max()
  chex.assert_trees_all_close(logits_RxBxPxV, merged_RxBxPxV, atol=1e-5 * scale)
  # Different adapters over the one base: different models, and each differs from the base.
  assert np.abs(logits_RxBxPxV[0] - logits_RxBxPxV[1]).max() > 1e-2 * scale
  base_BxPxV = _apply_params_R(cfg, _stack(base, base), tokens_BxP, ok_BxP)[0]
  assert np.abs(logits_RxBxPxV[0] - base_BxPxV).max() > 1e-2 * scale


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_merged_role_loads_as_that_model(family, tmp_path):
  cfg, base, _, tokens_BxP, ok_BxP = _setup(family)
  adapters_R = _trained_like(family)
  source = hf_checkpoint.read_hf_config(str(FIXTURES / family))
  lora.save_merged(str(tmp_path / "role1"), cfg, LORA, base, _role(adapters_R, 1), source)
  cfg2, loaded = hf_checkpoint.load(str(tmp_path / "role1"), max_len=cfg.max_len)
  assert cfg2 == cfg
  saved = hf_checkpoint.read_hf_config(str(tmp_path / "role1"))
  assert all(saved[k] == source[k] for k in hf_checkpoint.SERVING_KEYS)  # what a server reads beside them
  merged_R = _stack(*(lora.merged_params(LORA, base, _role(adapters_R, r)) for r in range(2)))
  chex.assert_trees_all_equal(loaded, _role(merged_R, 1))  # float32 written, float32 read
  logits_RxBxPxV, _ = _apply_stacked(cfg, LORA, base, adapters_R, tokens_BxP, 0, ok_BxP)
  loaded_BxPxV = _apply_params_R(cfg, _stack(base, loaded), tokens_BxP, ok_BxP)[1]
  chex.assert_trees_all_close(loaded_BxPxV, logits_RxBxPxV[1], atol=1e-5 * np.abs(loaded_BxPxV).max())


def test_optimiser_trains_only_adapters():
  cfg, base, adapters_R, tokens_BxP, ok_BxP = _setup("qwen3")
  base_before = jax.tree.map(np.array, base)
  tx = optax.adam(1e-2)
  opt_state = tx.init(adapters_R)  # the base is never handed to the optimiser

  def loss(adapters_R):
    """Toy objective: each role's next-token cross-entropy on the reference prompts."""
    logits_RxBxPxV, _ = lora.apply_stacked(cfg, LORA, base, adapters_R, tokens_BxP, 0, ok_BxP)
    next_RxBxP = jnp.broadcast_to(tokens_BxP[:, 1:], logits_RxBxPxV.shape[:-2] + (tokens_BxP.shape[1] - 1,))
    nll_RxBxP = optax.softmax_cross_entropy_with_integer_labels(logits_RxBxPxV[:, :, :-1], next_RxBxP)
    return jnp.sum(nll_RxBxP * ok_BxP[:, 1:]) / ok_BxP[:, 1:].sum()

  @jax.jit
  def step(adapters_R, opt_state):
    value, grads = jax.value_and_grad(loss)(adapters_R)  # w.r.t. the adapters only
    updates, opt_state = tx.update(grads, opt_state)
    return optax.apply_updates(adapters_R, updates), opt_state, value

  losses = []
  for _ in range(4):
    adapters_R, opt_state, value = step(adapters_R, opt_state)
    losses.append(float(value))
  assert losses[-1] < losses[0], losses
  chex.assert_trees_all_equal(base, base_before)
  base_shapes = {np.shape(p) for p in jax.tree.leaves(base)}
  state_shapes = [np.shape(s) for s in jax.tree.leaves(opt_state) if np.ndim(s)]
  adapter_shapes = [np.shape(p) for p in jax.tree.leaves(adapters_R)]
  assert state_shapes == adapter_shapes * 2  # adam's two moments of each adapter leaf
  assert not base_shapes & set(state_shapes)


@pytest.mark.parametrize("kwargs, key", [
    ({"rank": 0}, "lora.rank"),
    ({"rank": 2.5}, "lora.rank"),
    ({"rank": 2, "targets": ("q_proj", "qkv_proj")}, "lora.targets"),
    ({"rank": 2, "targets": ()}, "lora.targets"),
    ({"rank": 2, "alpha": 0.0}, "lora.alpha"),
    ({"rank": 2, "alpha": "16"}, "lora.alpha"),
])
def test_bad_config_names_the_key(kwargs, key):
  with pytest.raises(ValueError, match=key) as e:
    lora.LoRAConfig(**{"alpha": 1.0, **kwargs})
  if "targets" in key:
    assert "gate_proj" in str(e.value)  # lists the allowed names
