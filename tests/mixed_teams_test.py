"""Mixed teams (`config.roles.models`, `marl_jax.mixed_teams`): each model group's sets called at their own
model, a team of one model twice training exactly as the uniform team, a small solver and a larger
verifier trained in one step (a frozen set still), the CLI, and bad teams refused before compiling."""
import dataclasses
import importlib.util
import json
import pathlib
import subprocess
import sys

import chex
import jax
import ml_collections
import numpy as np
import optax
import pytest

from marl_jax import configs, experiment, loop, mixed_teams, text, train
from marl_jax import model as model_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "lm"


def _sv_config(arg="size=tiny"):
  config = configs.sibling(str(REPO / "experiments" / "x.py"), "solver_verifier").get_config(arg)
  config.num_devices = 1  # other tests may have forced several CPU devices in this process
  return config


def test_the_doubled_single_agent_is_the_mixed_teams_verifier():
  # scripts/mixed_team_results.sh compares the mixed team with one agent at either of its sizes.
  single = configs.sibling(str(REPO / "experiments" / "x.py"), "single_agent")
  mixed = _sv_config("size=cpu,team=mixed")
  assert single.get_config("size=cpu,model=doubled").model.to_dict() == mixed.models.verifier.to_dict()
  assert single.get_config("size=cpu").model.to_dict() == mixed.model.to_dict()
  with pytest.raises(ValueError, match="model='huge'"):
    single.get_config("model=huge")


@pytest.mark.slow
def test_each_set_runs_at_its_groups_model():
  small = model_lib.ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=8)
  large = model_lib.ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=8)
  # Sets 0 and 2 are small, set 1 large: the groups are {small: [0, 2], large: [1]}.
  team = mixed_teams.Team(("small", "large"), (small, large), (0, 1, 0))
  params = team.init_stack(jax.random.PRNGKey(0), 3)
  assert jax.tree.leaves(params["small"])[0].shape[0] == 2 and jax.tree.leaves(params["large"])[0].shape[0] == 1
  tokens_BxT = jax.random.randint(jax.random.PRNGKey(1), (2, 8), text.DIGIT0, text.DIGIT0 + 10)
  key_ok_NxBxT = jax.random.bernoulli(jax.random.PRNGKey(2), 0.7, (4, 2, 8)).at[:, :, 0].set(True)
  set_N = [1, 2, 0, 1]
  logits_NxBxTxV = team.apply_sets(params, set_N, tokens_BxT, 0, key_ok_NxBxT)
  # Set s's parameters taken by hand: set 0 is the small group's first, set 2 its second, set 1 the large one.
  own_params = {0: ("small", 0), 1: ("large", 0), 2: ("small", 1)}
  for n, s in enumerate(set_N):
    group, index = own_params[s]
    params_s = jax.tree.map(lambda p, i=index: p[i], params[group])
    chex.assert_trees_all_equal(team.take_sets(params, s), params_s)
    own, _ = model_lib.apply(team.set_model(s), params_s, tokens_BxT, 0, key_ok_NxBxT[n])
    np.testing.assert_allclose(logits_NxBxTxV[n], own, atol=1e-5)
  assert team.set_model(1) is large and team.set_model(2) is small
  # Norms per set, in the global set order: set 2 is the small group's second set.
  norm_S = team.set_norms(params)
  np.testing.assert_allclose(norm_S[2], np.sqrt(sum(np.sum(np.square(p[1])) for p in
                                                     jax.tree.leaves(params["small"]))), rtol=1e-6)
  np.testing.assert_allclose(norm_S[1], np.sqrt(sum(np.sum(np.square(p)) for p in
                                                     jax.tree.leaves(params["large"]))), rtol=1e-6)


def test_names_of_one_model_share_a_group():
  config = _sv_config("size=tiny,team=mixed")
  config.models.verifier.update(config.model.to_dict())  # the verifier's config now builds config.model
  exp = experiment.build(config)
  assert exp.model == experiment.build(_sv_config("size=tiny")).model  # one group: a uniform team
  config = _sv_config("size=tiny,team=mixed")
  configs.add_model(config, "solver_twin")
  config.roles.models = "solver_twin,verifier"
  assert experiment.build(config).model.names == ("solver_twin", "verifier")


@pytest.mark.slow
def test_team_of_one_model_twice_trains_as_the_uniform_team():
  uniform = _sv_config("size=tiny,credit=team")
  uniform.num_seeds, uniform.sft.steps, uniform.rl.entropy_coef = 2, 0, 0.01
  exp_u = experiment.build(uniform)
  # The same model as two groups of one set each: every per-set operation goes through the team.
  twins = mixed_teams.Team(("model", "twin"), (exp_u.model, exp_u.model), (0, 1))
  tx = experiment.make_optimizer(uniform.optim, uniform.total_steps * uniform.rl.epochs * uniform.rl.minibatches)
  exp_t = dataclasses.replace(exp_u, model=twins, optimizer=model_lib.per_set(twins, tx, exp_u.trainable_R))
  state_u = loop.initial_state(exp_u)
  params_S = jax.tree.map(np.asarray, state_u.params)
  split = {"model": jax.tree.map(lambda p: p[:, :1], params_S), "twin": jax.tree.map(lambda p: p[:, 1:], params_S)}
  state_t = loop.initial_state(exp_t, split)
  for _ in range(2):
    state_u, metrics_u = train.make_train_call(exp_u)(state_u)
    state_t, metrics_t = train.make_train_call(exp_t)(state_t)
  after_u = jax.device_get(state_u.params)
  after_t = jax.device_get(state_t.params)
  joined_t = jax.tree.map(lambda a, b: np.concatenate([a, b], 1), after_t["model"], after_t["twin"])
  # Not bit for bit: a key's bias has an exactly zero gradient, so Adam turns rounding-level
  # differences of the two vmaps into full-size steps there; everything else agrees to rounding.
  apart = float(optax.tree_utils.tree_norm(jax.tree.map(np.subtract, joined_t, after_u)))
  moved = float(optax.tree_utils.tree_norm(jax.tree.map(np.subtract, after_u, params_S)))
  assert moved > 0.01 and apart < 0.01 * moved, (apart, moved)
  for name in ("accuracy", "solver/grad_norm_share", "verifier/grad_norm_share"):
    np.testing.assert_allclose(metrics_t[name], metrics_u[name], rtol=1e-5)


@pytest.mark.slow
def test_small_solver_and_larger_verifier_train_in_one_step():
  config = _sv_config("size=tiny,team=mixed,credit=difference")
  config.num_seeds, config.sft.steps, config.rl.entropy_coef = 2, 0, 0.01
  config.roles.trainable = "1,0"  # the verifier's set frozen: it must not move
  exp = experiment.build(config)
  assert exp.model.names == ("model", "verifier")
  assert exp.model.set_model(1).d_model == 2 * exp.model.set_model(0).d_model
  state_S = loop.initial_state(exp)
  before = jax.device_get(state_S.params)
  assert before["verifier"]["block1"]["query"]["kernel"].shape == (2, 1, 64, 2, 32)  # 2 layers, d 64
  train_call = train.make_train_call(exp)
  for _ in range(2):
    state_S, metrics_SxN = train_call(state_S)
  after = jax.device_get(state_S.params)
  chex.assert_trees_all_equal(after["verifier"], before["verifier"])
  assert max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(after["model"]),
                                                         jax.tree.leaves(before["model"]))) > 1e-4
  assert np.all(np.isfinite(np.asarray(metrics_SxN["solver/loss"])))


def test_bad_teams_are_refused_before_compiling():
  config = _sv_config("size=tiny,team=mixed")
  config.roles.models = "model,huge"
  with pytest.raises(ValueError, match=r"config.roles.models='model,huge'.*\['model', 'verifier'\]"):
    experiment.build(config)
  config.roles.models = "verifier"
  with pytest.raises(ValueError, match="for 2 parameter sets"):
    experiment.build(config)
  with pytest.raises(ValueError, match="team=mixed .* needs sharing=isolated"):
    _sv_config("size=tiny,team=mixed,sharing=shared")
  # A team model's shapes are checked as config.model's are (n_heads 0 divided by zero; n_layers 0
  # trained a verifier of no layers).
  for shape in ("n_heads", "n_layers"):
    config = _sv_config("size=tiny,team=mixed")
    config.models.verifier[shape] = 0
    with pytest.raises(ValueError, match=rf"^config.models.verifier.{shape}=0; allowed: an integer >= 1$"):
      experiment.build(config)
  config = _sv_config("size=tiny,team=mixed")
  config.model_shards = 2
  with pytest.raises(ValueError, match="config.model_shards=2 with a mixed team"):
    experiment.build(config)
  # The built-in model starts random, a checkpoint from its weights: not one start for the team.
  config = _sv_config("size=tiny,team=mixed")
  config.models.verifier.update(checkpoint=str(FIXTURES / "llama"), dtype="float32")
  with pytest.raises(ValueError, match="some models start from checkpoint weights and others from random"):
    experiment.build(config)
  # Free text through two tokenizers: the canvases do not line up.
  spec = importlib.util.spec_from_file_location("lm_word_problems", REPO / "experiments" / "lm_word_problems.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("size=tiny,protocol=solver_verifier")
  configs.add_model(config, "verifier", checkpoint=str(FIXTURES / "llama"))
  config.roles.models = "model,verifier"
  with pytest.raises(ValueError, match="free text through different tokenizers"):
    experiment.build(config)


@pytest.mark.slow
def test_mixed_team_through_the_cli(tmp_path):
  run = subprocess.run([sys.executable, "-m", "marl_jax.main",
                        f"--config={REPO / 'experiments' / 'solver_verifier.py'}:size=tiny,team=mixed",
                        f"--workdir={tmp_path}", "--config.models.verifier.n_heads=4"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stderr[-3000:]
  config = ml_collections.ConfigDict(json.loads((tmp_path / "config.json").read_text()))
  assert config.roles.models == "model,verifier" and config.models.verifier.n_heads == 4
  params_S = loop.load_params(experiment.build(config), str(tmp_path))  # the run's last checkpoint
  assert params_S["verifier"]["block1"]["query"]["kernel"].shape[-3:] == (64, 4, 16)  # the flag reached it
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert any(np.isfinite(r.get("verifier/loss", np.nan)) for r in rows)
