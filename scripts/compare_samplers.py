"""Compares another version of `marl_jax/sampling.py` with this checkout's on every workflow: whether
they sample the same tokens, how far apart their log-probs are, and their rollout times; then their
teacher-forced scoring of this checkout's transcripts (`token_log_probs`, forward and backward, as the
warm start and the update run it): how far apart and how fast.  Times are the best of three,
alternated.  256 episodes of a randomly initialised `size=cpu` model per workflow.

  git show REV:marl_jax/sampling.py > /tmp/old_sampling.py
  python scripts/compare_samplers.py /tmp/old_sampling.py
"""
import importlib.util
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import configs, experiment, model as model_lib, sampling
from marl_jax.protocols import engine

EPISODES = 256
WORKFLOWS = (("single agent", "single_agent", "size=cpu"),
             ("solver-verifier, isolated", "solver_verifier", "size=cpu"),
             ("vote, 3 shared voters", "vote", "size=cpu"), ("debate", "debate", "size=cpu"),
             ("best_of_n", "best_of_n", "size=cpu"), ("delegate", "delegate", "size=cpu"),
             ("orchestrator", "tasks", "task=multi_chain,size=cpu"),
             ("exchange", "tasks", "task=hidden_sum,size=cpu"))


def load_module(path: str):
  spec = importlib.util.spec_from_file_location("other_sampling", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def best_times(fns: dict, *args) -> dict:
  """Best of three wall times of each jitted function on `args`, alternating their order."""
  best = {m: np.inf for m in fns}
  for rep in range(3):
    for m in list(fns) if rep % 2 == 0 else list(fns)[::-1]:
      start = time.perf_counter()
      jax.block_until_ready(fns[m](*args))
      best[m] = min(best[m], time.perf_counter() - start)
  return best


def main(other_path: str):
  other = load_module(other_path)
  here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "x.py")
  print(f"{'workflow':<28}{'views':>6}{'T':>4}{'same tokens':>12}{'max |dlogp|':>12}"
        f"{'other ms':>9}{'this ms':>8} | scoring: {'passes':>6}{'max |dlogp|':>12}{'other ms':>9}{'this ms':>8}")
  for name, module, arg in WORKFLOWS:
    exp = experiment.build(configs.sibling(here, module).get_config(arg))
    params_R = model_lib.init_stack(exp.model, jax.random.PRNGKey(0), exp.num_sets)
    problems = exp.task.sample_batch(jax.random.split(jax.random.PRNGKey(1), EPISODES))
    canvas_BxT = engine.assemble(exp.layout, problems["prompt"], [None] * len(exp.layout.turn_slices))
    keys_B = jax.random.split(jax.random.PRNGKey(2), EPISODES)
    generate = {m: jax.jit(lambda p, c, k, m=m: m.generate(exp.model, exp.layout, p, c,
                                                           jnp.zeros(c.shape, bool), k, 1.0))
                for m in (other, sampling)}
    out = {m: jax.device_get(f(params_R, canvas_BxT, keys_B)) for m, f in generate.items()}
    best = best_times(generate, params_R, canvas_BxT, keys_B)
    (tokens_a, logp_a, sampled_a), (tokens_b, logp_b, sampled_b) = out[other], out[sampling]
    same_B = np.all(tokens_a == tokens_b, axis=1)
    both_BxT = sampled_a & sampled_b & same_B[:, None]
    dlogp = float(np.abs(logp_a - logp_b)[both_BxT].max())
    # Scoring: the sampled tokens' summed log-prob and its gradient, the update's pass.
    score = {m: jax.jit(jax.value_and_grad(
        lambda p, t, m=m: jnp.sum(m.token_log_probs(exp.model, exp.layout, p, t, 1.0)[0] * sampled_b)))
             for m in (other, sampling)}
    forced = {m: np.asarray(m.token_log_probs(exp.model, exp.layout, params_R, tokens_b, 1.0)[0])
              for m in (other, sampling)}
    scoring_dlogp = float(np.abs(forced[other] - forced[sampling])[sampled_b].max())
    scoring_best = best_times(score, params_R, tokens_b)
    passes = len(sampling.scoring_passes(exp.layout, exp.layout.view_set_V)[1])
    print(f"{name:<28}{len(exp.layout.view_set_V):>6}{exp.layout.length:>4}{same_B.mean():>12.4f}"
          f"{dlogp:>12.2e}{best[other] * 1e3:>9.0f}{best[sampling] * 1e3:>8.0f} | {'':>9}{passes:>6}"
          f"{scoring_dlogp:>12.2e}{scoring_best[other] * 1e3:>9.0f}{scoring_best[sampling] * 1e3:>8.0f}",
          flush=True)


if __name__ == "__main__":
  main(sys.argv[1])
