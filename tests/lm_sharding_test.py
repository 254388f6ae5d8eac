"""lm.sharding: the fixtures' parameters split over (data, model) meshes of 8 emulated CPU devices give
the single-device logits, each parameter placed as its rule says; bad rules and meshes are refused.

The device count must be set before JAX starts, so the sharded runs happen in one subprocess (this
file run as a script), which reports what it measured as JSON.
"""
import functools
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import jax
import numpy as np
import optax
import pytest

from marl_jax import checkpoint as checkpoint_lib, configs, experiment, loop, sft, state as state_lib, train
from marl_jax.lm import hf_checkpoint, sharding
from marl_jax.lm import model as lm_model

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "lm"
FAMILIES = ("qwen3", "llama")
MESHES = ((2, 4), (8, 1), (1, 8))
# k_proj split over its 2 key/value heads: does not divide by model=4.
BAD_RULES = ((r"k_proj/kernel$", (None, sharding.MODEL, None)), *sharding.DEFAULT_RULES)


def _load(family):
  return hf_checkpoint.load(str(FIXTURES / family), max_len=40)


def _batch_of_8(family):
  """The reference prompts repeated to 8 rows, so any data axis of the 8 devices divides the batch."""
  ref = np.load(FIXTURES / family / "reference.npz")
  return np.resize(ref["tokens_BxP"], (8, ref["tokens_BxP"].shape[1])), np.resize(
      ref["mask_BxP"], (8, ref["mask_BxP"].shape[1]))


def _error(fn) -> str:
  try:
    fn()
  except ValueError as e:
    return str(e)
  return "no error"


def _measure() -> dict:
  """Runs on 8 devices: each family on each mesh, one stacked set, and the two refusals."""
  results = {"devices": jax.device_count(), "logits": {}, "placement": {}}
  for family in FAMILIES:
    cfg, params = _load(family)
    tokens_BxL, key_ok_BxL = _batch_of_8(family)
    single_BxLxV = jax.jit(lm_model.apply, static_argnums=0)(cfg, params, tokens_BxL, 0, key_ok_BxL)[0]
    for data, model in MESHES:
      mesh = sharding.mesh(data, model)
      sharded = sharding.shard_params(params, mesh)
      logits_BxLxV, _ = sharding.apply(cfg, mesh, sharded, tokens_BxL, 0, key_ok_BxL)
      name = f"{family} {data}x{model}"
      results["logits"][name] = float(np.abs(logits_BxLxV - single_BxLxV).max() / np.abs(single_BxLxV).max())
      results["placement"][name] = {
          jax.tree_util.keystr(path, simple=True, separator="/"): [list(x.sharding.spec), x.sharding.shard_shape(x.shape)]
          for path, x in jax.tree_util.tree_leaves_with_path(sharded)}
  # Two roles' sets stacked on a leading axis R: the rules split the trailing dims, R stays whole.
  cfg, params = _load("qwen3")
  mesh = sharding.mesh(2, 4)
  params_R = jax.tree.map(lambda p: np.stack([p, 2 * p]), params)
  sharded_R = sharding.shard_params(params_R, mesh, leading_axes=1)
  apply_R = jax.jit(jax.vmap(functools.partial(lm_model.apply, cfg), in_axes=(0, None, None, None)))
  tokens_BxL, key_ok_BxL = _batch_of_8("qwen3")
  single_RxBxLxV = apply_R(params_R, tokens_BxL, 0, key_ok_BxL)[0]
  tokens_BxL, key_ok_BxL = sharding.shard_rows(mesh, (tokens_BxL, key_ok_BxL))
  sharded_RxBxLxV = apply_R(sharded_R, tokens_BxL, 0, key_ok_BxL)[0]
  results["rows"] = [[list(x.sharding.spec), x.sharding.shard_shape(x.shape)] for x in (tokens_BxL, key_ok_BxL)]
  results["stacked"] = {"q_proj": list(sharded_R["layers"]["q_proj"]["kernel"].sharding.spec),
                        "diff": float(np.abs(sharded_RxBxLxV - single_RxBxLxV).max()
                                      / np.abs(single_RxBxLxV).max())}
  results["errors"] = {"mesh": _error(lambda: sharding.mesh(3, 2)),
                       "divide": _error(lambda: sharding.shard_params(params, mesh, BAD_RULES))}
  results["step"] = _train_split_and_whole()
  return results


def _step_config(**overrides):
  c = configs.sibling(str(REPO / "experiments" / "x.py"), "lm_solver_verifier").get_config("size=tiny")
  c.model.dtype, c.rl.entropy_coef, c.sft.steps, c.steps_per_call = "float32", 0.01, 2, 2
  c.update(overrides)
  return c


def _train_split_and_whole() -> dict:
  """The tiny LM solver-verifier's first call of 2 steps with its parameter sets split over a
  (data 2, model 4) mesh, over a (data 1, model 4) mesh, and on one device: the placement of the split
  state, and how far apart the runs' parameters are against how far training moved them."""
  out, params = {}, {}
  for name, overrides in (("split", dict(num_devices=8, model_shards=4)),
                          ("model_only", {"num_devices": 4, "model_shards": 4}), ("whole", dict(num_devices=1))):
    exp = experiment.build(_step_config(**overrides))
    state_S = loop.initial_state(exp)
    start = state_lib.to_host(state_S.params)
    state_S, _ = train.make_train_call(exp)(state_S)
    params[name] = jax.device_get(state_S.params)
    if name == "split":
      leaf = lambda tree: tree["layers"]["q_proj"]["kernel"]
      mu = [x for p, x in jax.tree_util.tree_leaves_with_path(state_S.opt_state)
            if jax.tree_util.keystr(p, simple=True, separator="/").endswith("mu/layers/q_proj/kernel")][0]
      out["placement"] = {
          "params": [list(leaf(state_S.params).sharding.spec), leaf(state_S.params).sharding.shard_shape(
              leaf(state_S.params).shape)],
          "mu": list(mu.sharding.spec), "step": list(state_S.step.sharding.spec),
          "norm": list(state_S.params["norm"]["scale"].sharding.spec)}
      out["init_from"] = _warm_start_placement(exp, state_S)
  distance = lambda a, b: float(optax.tree_utils.tree_norm(jax.tree.map(lambda x, y: x - y, a, b)))
  out["moved"], out["apart"] = distance(params["whole"], start), distance(params["split"], params["whole"])
  out["apart_model_only"] = distance(params["model_only"], params["whole"])
  random = _step_config(num_devices=8, model_shards=4)
  random.model.random_weights = True
  q_proj = sft.warm_start(experiment.build(random), jax.random.split(jax.random.PRNGKey(0), 1))["layers"]["q_proj"]["kernel"]
  out["random_warm_start"] = [len(q_proj.sharding.device_set), q_proj.sharding.shard_shape(q_proj.shape)]
  builtin = configs.sibling(str(REPO / "experiments" / "x.py"), "solver_verifier").get_config("size=tiny")
  builtin.update(num_devices=8, model_shards=2)
  out["errors"] = {"divide": _error(lambda: experiment.build(_step_config(num_devices=8, model_shards=3))),
                   "builtin": _error(lambda: experiment.build(builtin))}
  return out


def _warm_start_placement(exp, state_S) -> dict:
  """`init_from` of a run with split parameter sets: where the read parameters lie, and whether they
  are the saved ones."""
  with tempfile.TemporaryDirectory() as workdir:
    with checkpoint_lib.manager(workdir) as mngr:
      checkpoint_lib.save(mngr, 2, state_S)
    pathlib.Path(workdir, "config.json").write_text(exp.config.to_json())
    params_S = loop.load_params(exp, workdir)
  q_proj = params_S["layers"]["q_proj"]["kernel"]
  same = jax.tree.map(lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()), params_S, state_S.params)
  return {"spec": list(q_proj.sharding.spec), "shard": q_proj.sharding.shard_shape(q_proj.shape),
          "same": all(jax.tree.leaves(same))}


@functools.cache
def _measured() -> dict:
  root = pathlib.Path(__file__).resolve().parents[1]
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"}
  done = subprocess.run([sys.executable, __file__], cwd=root, env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("data,model", MESHES)
def test_sharded_logits_equal_single_device(family, data, model):
  assert _measured()["devices"] == 8
  assert _measured()["logits"][f"{family} {data}x{model}"] < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("data,model", MESHES)
def test_each_parameter_is_placed_as_its_rule_says(family, data, model):
  _, params = _load(family)
  placement = _measured()["placement"][f"{family} {data}x{model}"]
  specs = sharding.partition_specs(params, {sharding.DATA: data, sharding.MODEL: model})
  expected = {jax.tree_util.keystr(path, simple=True, separator="/"): list(spec)
              for path, spec in jax.tree_util.tree_leaves_with_path(
                  specs, is_leaf=lambda x: isinstance(x, sharding.PartitionSpec))}
  assert {path: spec for path, (spec, _) in placement.items()} == expected
  # Each device holds 1/model of every large matrix, a whole copy of each norm (fixture: V=384,
  # D=64, F=128, 4 query and 2 key/value heads of 16, 2 layers stacked, never split): the split axes
  # written out by hand.
  V, D, F = 384, 64, 128
  shard = {path: tuple(shape) for path, (_, shape) in placement.items()}
  assert shard["embed_tokens/embedding"] == (V // model, D)
  assert shard["layers/q_proj/kernel"] == (2, D // model, 4, 16)
  assert shard["layers/k_proj/kernel"] == shard["layers/v_proj/kernel"] == (2, D // model, 2, 16)
  assert shard["layers/gate_proj/kernel"] == shard["layers/up_proj/kernel"] == (2, D, F // model)
  assert shard["layers/o_proj/kernel"] == (2, 4, 16, D // model)
  assert shard["layers/down_proj/kernel"] == (2, F // model, D)
  assert shard["layers/input_layernorm/scale"] == (2, D)
  assert shard["norm/scale"] == (D,)
  if family == "llama":
    assert shard["lm_head/kernel"] == (D, V // model)


@pytest.mark.slow
def test_stacked_sets_keep_the_role_axis_whole():
  stacked = _measured()["stacked"]
  assert stacked["q_proj"] == [None, None, sharding.MODEL, None, None]
  assert stacked["diff"] < 1e-5


@pytest.mark.slow
def test_shard_rows_splits_the_batch_over_data():
  # 8 rows on a (data 2, model 4) mesh: each device holds 4 whole rows, the same 4 on every `model`
  # device of its `data` slice.
  tokens_BxL, _ = _batch_of_8("qwen3")
  L = tokens_BxL.shape[1]
  assert _measured()["rows"] == [[[sharding.DATA], [4, L]]] * 2


@pytest.mark.slow
def test_impossible_mesh_and_non_dividing_dimension_are_refused():
  errors = _measured()["errors"]
  assert "data=3 x model=2 needs 6 devices, but 8 are visible" in errors["mesh"]
  assert ("parameter layers/k_proj/kernel of shape (2, 64, 2, 16): dimension 2 (2) does not divide "
          "by mesh axis 'model' of size 4") in errors["divide"]


def test_rules_from_config_and_rule_errors():
  assert sharding.rules_from_config({}) == sharding.DEFAULT_RULES
  # As a config's JSON holds them: lists.
  rules = sharding.rules_from_config({"sharding_rules": [[".*", [None, None]]]})
  assert rules == ((".*", (None, None)),)
  with pytest.raises(ValueError, match=r"sharding_rules\[0\].*must be a pair"):
    sharding.rules_from_config({"sharding_rules": [".*"]})
  with pytest.raises(ValueError, match=r"sharding_rules\[0\] regex '\(' does not compile"):
    sharding.rules_from_config({"sharding_rules": [["(", [None]]]})
  _, params = _load("llama")
  sizes = {sharding.DATA: 1, sharding.MODEL: 2}
  with pytest.raises(ValueError, match="parameter lm_head/kernel of shape \\(64, 384\\) matches no"):
    sharding.partition_specs(params, sizes, sharding.DEFAULT_RULES[:1] + sharding.DEFAULT_RULES[2:])
  with pytest.raises(ValueError, match="names mesh axis 'tensor'; the mesh has \\['data', 'model'\\]"):
    sharding.partition_specs(params, sizes, ((".*", ("tensor", None)),))
  with pytest.raises(ValueError, match="has 1 dimensions, but parameter embed_tokens/embedding has "
                                       "shape \\(384, 64\\)"):
    sharding.partition_specs(params, sizes, ((".*", (None,)),))


@pytest.mark.slow
def test_training_step_with_split_parameter_sets():
  """`config.model_shards=4` on 8 devices: every parameter set, the base model and the Adam moments
  stay split over `model` through the step (the rest replicated), and training is the one-device
  training but for rounding."""
  step = _measured()["step"]
  # q_proj of params_SxR: seeds, sets and layers whole, hidden_size (64) split in 4 (trailing Nones
  # dropped).
  assert step["placement"]["params"] == [[None, None, None, sharding.MODEL], [1, 2, 2, 16, 4, 16]]
  assert step["placement"]["mu"] == [None, None, None, sharding.MODEL]
  assert step["placement"]["step"] == [] and step["placement"]["norm"] == []
  # A warm start from such a run (config.init_from) reads its parameters split as the run splits its
  # own, not whole on every device.
  # So does the warm start of random weights (config.model.random_weights), made where they will live.
  assert step["random_warm_start"] == [8, [1, 2, 2, 16, 4, 16]]
  assert step["init_from"] == {"spec": [None, None, None, sharding.MODEL, None, None],
                               "shard": [1, 2, 2, 16, 4, 16], "same": True}
  assert step["moved"] > 1e-2, "nothing trained: the comparison is vacuous"
  assert step["apart"] < 1e-2 * step["moved"]
  # Every device on the `model` axis (a one-device `data` axis, whose collectives XLA refuses on
  # split values: the step skips them there) trains the same.
  assert step["apart_model_only"] < 1e-2 * step["moved"]


@pytest.mark.slow
def test_impossible_model_sharding_is_refused_before_compiling():
  errors = _measured()["step"]["errors"]
  assert "config.model_shards=3 does not divide the 8 devices" in errors["divide"]
  assert "config.model_shards=2 splits a language model's parameters" in errors["builtin"]


if __name__ == "__main__":
  print(json.dumps(_measure()))
