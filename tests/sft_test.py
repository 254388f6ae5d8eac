"""sft.demonstration_loss: the cross-entropy of exactly the tokens a role wrote, padding left out;
sft.run: a warm start in several compiled calls is one scan, and resumes where it stopped."""
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sampling_test import CFG, _layout, _params, _prompts, _token_log_probs
from train_test import tiny_config

from marl_jax import experiment, loop, sft, state, text
from marl_jax.protocols import engine


def test_demonstration_loss_averages_role_authored_non_padding_tokens():
  layout = _layout("solver_verifier", (0, 1))
  # prompt 0..4 | solver marker 5, answer 6..7 | verifier marker 8, verdict 9..11
  assert layout.turn_slices == ((6, 8), (9, 12))
  answer_2xA = jnp.array([text.encode("7<eos>"), text.encode("3<eos>")])
  verdict_2xV = jnp.array([text.encode("<accept><eos><pad>"), text.encode("<reject>4<eos>")])
  tokens_2xT = engine.assemble(layout, _prompts()[:2], [answer_2xA, verdict_2xV])
  params_R = _params(2)
  loss = sft.demonstration_loss(types.SimpleNamespace(model=CFG, layout=layout), params_R, tokens_2xT)
  # The policy's teacher-forced log-probs at temperature 1, averaged over the positions written out
  # by hand: both messages, less row 0's padded last verdict slot (9 tokens).
  logp_2xT = np.asarray(_token_log_probs(layout, params_R, tokens_2xT, temperature=1.0)[0])
  authored_2xT = np.zeros((2, layout.length), bool)
  authored_2xT[:, [6, 7, 9, 10, 11]] = True
  authored_2xT[0, 11] = False
  np.testing.assert_allclose(loss, -logp_2xT[authored_2xT].mean(), rtol=1e-5)
  # Not the mean over every non-padding position: the prompt and the role markers are the
  # environment's, not a demonstration to imitate.
  written_2xT = np.array(tokens_2xT != text.PAD)
  written_2xT[:, 0] = False  # the first token has no prediction
  assert not np.isclose(loss, -logp_2xT[written_2xT].mean(), rtol=1e-2)


def _warm_start(steps_per_call, stop_after=None, progress=None):
  """The tiny warm start of 2 seeds over 8 steps, `steps_per_call` at a time; stopped after
  `stop_after` calls, or resumed from `progress`."""
  exp = experiment.build(tiny_config(**{"num_seeds": 2, "sft.steps": 8, "sft.steps_per_call": steps_per_call}))
  calls = []
  stop = lambda: calls.append(1) is None and stop_after is not None and len(calls) >= stop_after
  return sft.run(exp, state.seed_keys(exp.config), progress, stop)


@pytest.mark.slow  # several compiled programs: the fast tier stays under 4 minutes
def test_a_warm_start_in_calls_is_one_scan_and_resumes_where_it_stopped():
  # 8 steps in one call, or 3 at a time (the last call skips the step past 8), stopped after the
  # first call and resumed from there: the same parameters and Adam moments to float rounding, and
  # the cosine schedule at the same step (the optimiser's count).  Not the key's bias, which the
  # softmax ignores: its gradient is rounding noise, which Adam scales to whole steps.
  whole = _warm_start(8)
  stopped = _warm_start(3, stop_after=1)
  assert int(stopped.step) == 3
  resumed = _warm_start(3, progress=stopped)
  assert int(resumed.step) == int(whole.step) == 8
  leaves = lambda progress: {jax.tree_util.keystr(path): np.asarray(x) for path, x in
                             jax.tree_util.tree_leaves_with_path(progress) if "['key']['bias']" not in
                             jax.tree_util.keystr(path)}
  chex.assert_trees_all_close(leaves(resumed), leaves(whole), rtol=1e-5, atol=1e-7)
  counts = [np.asarray(c) for c in jax.tree.leaves(resumed.opt_state) if c.dtype == jnp.int32]
  assert counts and all((c == 8).all() for c in counts)
  initial = loop.initial_state(experiment.build(tiny_config(**{"num_seeds": 2, "sft.steps": 0})))
  assert not np.allclose(whole.params["embed"]["embedding"][0], initial.params["embed"]["embedding"][0])


@pytest.mark.slow
def test_a_warm_start_in_microbatches_takes_the_same_steps():
  # sft.microbatch_size passes 4 rows of the batch at a time and adds their gradients: the same steps to
  # float rounding (the key's bias aside, as above).
  whole, parts = (sft.run(exp, state.seed_keys(exp.config)) for exp in (
      experiment.build(tiny_config(**{"sft.steps": 3, "sft.steps_per_call": 3, "sft.microbatch_size": size}))
      for size in (0, 4)))
  def same(path, a, b):
    if "['key']['bias']" not in jax.tree_util.keystr(path):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))
  jax.tree_util.tree_map_with_path(same, whole.params, parts.params)


def test_a_warm_start_that_does_not_fit_the_device_is_refused_naming_what_shrinks_it(monkeypatch):
  exp = experiment.build(tiny_config(**{"sft.steps": 2, "sft.steps_per_call": 2, "sft.microbatch_size": 4}))
  monkeypatch.setattr(sft.memory, "device_limit", lambda: 1 << 10)
  with pytest.raises(sft.memory.DoesNotFit, match=r"the warm start needs .* lower config.sft.microbatch_size=4 "
                     r"\(a step passes 4 rows at a time through the model\) or config.sft.batch_size=\d+"):
    sft.run(exp, state.seed_keys(exp.config))


def test_a_warm_start_microbatch_that_leaves_a_part_is_refused():
  with pytest.raises(ValueError, match=r"config.sft.microbatch_size=3 does not divide the per-device warm-start "
                     r"batch of \d+ rows"):
    experiment.build(tiny_config(**{"sft.microbatch_size": 3}))
