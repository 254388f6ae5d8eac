"""config.model.remat: whole-canvas passes recompute each layer's activations in the backward pass, so the
update's gradient is unchanged and its pass keeps less memory."""
import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from marl_jax import model as model_lib
from marl_jax import protocols, sampling, text
from marl_jax.lm import agent as lm_agent
from marl_jax.protocols import engine
from marl_jax.tasks.arithmetic import Arithmetic

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "lm"
TASK = Arithmetic(num_ops=1)
LAYOUT = protocols.make("solver_verifier", TASK).layout(TASK, (0, 1))
B = 64


def _lm(remat):
  return lm_agent.from_config(ml_collections.ConfigDict(dict(
      max_len=LAYOUT.length, dtype="float32", checkpoint=str(FIXTURES / "qwen3"), random_weights=False,
      remat=remat, lora=dict(enabled=False))))


def _gradient_and_temporaries(model, params_R, tokens_BxT):
  loss = lambda p: jnp.sum(sampling.token_log_probs(model, LAYOUT, p, tokens_BxT, 1.0)[0])
  compiled = jax.jit(jax.grad(loss)).lower(params_R).compile()
  return compiled(params_R), compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("family", [pytest.param("built_in", marks=pytest.mark.slow), "qwen3"])
def test_remat_keeps_the_gradient(family):
  """And for the language model, whose layers' activations are most of a pass's memory, keeps less (the
  built-in model's tiny layers are not: XLA:CPU plans the same bytes either way)."""
  if family == "built_in":
    plain = model_lib.ModelConfig(d_model=32, n_layers=3, n_heads=2, d_ff=128, max_len=LAYOUT.length)
    remat = dataclasses.replace(plain, remat=True)
    params_R = plain.init_stack(jax.random.PRNGKey(0), 2)
  else:
    plain, remat = _lm(False), _lm(True)
    params_R = plain.pretrained_stack(2)
  prompts = TASK.sample_batch(jax.random.split(jax.random.PRNGKey(1), B))["prompt"]
  canvas_BxT = engine.assemble(LAYOUT, prompts, [None] * len(LAYOUT.turn_slices))
  random_BxT = jax.random.randint(jax.random.PRNGKey(2), canvas_BxT.shape, 0, text.VOCAB_SIZE)
  tokens_BxT = jnp.where(LAYOUT.author_T >= 0, random_BxT, canvas_BxT)
  grads, temporaries = _gradient_and_temporaries(plain, params_R, tokens_BxT)
  remat_grads, remat_temporaries = _gradient_and_temporaries(remat, params_R, tokens_BxT)
  # The same products, recomputed: equal to float rounding, relative to the gradient's largest entry
  # (some entries are zero but for rounding, such as the key biases', which softmax ignores).
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(grads))
  same = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale)
  jax.tree.map(same, grads, remat_grads)
  if family == "qwen3":
    assert remat_temporaries < 0.8 * temporaries, (remat_temporaries, temporaries)
