"""A judge's learning curve on labels alone (issue 63: what limits the judge, signal or capacity).

  python -m marl_jax.tools.judge_curve --workdir=DIR [--labels=4096] [--updates=600] [--every=100]

Every seed of the run in DIR (its last checkpoint: a base run of step 0 is its warm start) samples a
pool of `--labels` episodes and a held-out set of `--held` from its own team, each judged answer
labelled by the checker.  The judges are then trained on the pool alone by the Brier score of the
probability they put on right (`judge_loss=brier`, `judge_pg=false`, every answer weighing 1): `--updates`
Adam updates at `config.optim`'s learning rate, each on `config.rl.batch_size` answers drawn from the
pool, the team's answers held fixed (nothing else learns).  Every `--every` updates it prints each
judge's AUROC of that probability on (at most) 512 of the pool's answers and on the held-out ones (means over
judges, then over seeds, with 95 % intervals): a judge that can learn to judge these answers rises on
the held-out set; one that only memorises rises on the pool alone.  The RL step gives the judges
`rl.epochs` x `rl.minibatches` such updates a step, on that step's labelled answers only.
"""
import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from marl_jax import cli, configs, experiment, judging, loop, parallel, rewards, rollout, sampling, state, train, update
from marl_jax.protocols import engine
from marl_jax.tools import intervals, report

SHOWN = 512  # the pool's answers each AUROC on the pool reads


def judge_experiment(config) -> experiment.Experiment:
  """The run's experiment with the judges taught by the Brier score alone on every answer, the
  checker's labels each weighing 1; refused for a workflow whose judges state no readable level."""
  config = config.copy_and_resolve_references()
  config.reward = configs.reward_config("team", judge_loss="brier", judge_pg=False)
  config.rl.minibatches = 1
  return experiment.build(config)


def labelled(exp, st, key, rows: int) -> update.Batch:
  """`rows` episodes of the team in `st` (rl.group_size samples a problem), as an update batch whose
  solver's advantages are 0 and whose every judged answer carries the checker's label, weight 1."""
  G = exp.config.rl.group_size
  problem_key, sample_key = jax.random.split(key)
  problems = exp.task.sample_batch(jax.random.split(problem_key, rows // G).repeat(G, 0))
  episodes = rollout.sample(exp, st.params, problems, jax.random.split(sample_key, rows))
  scored, _ = train.score(exp, problems, episodes)
  truth_KxB = scored.judgments.truth_KxB.astype(jnp.float32)
  labels = rewards.Labels(weight_BxK=jnp.ones(truth_KxB.shape[::-1]), label_BxK=truth_KxB.T)
  return train.update_batch(exp, st, episodes, jnp.zeros((len(exp.layout.roles), rows)), labels=labels)


def judge_auroc(exp, params_R, batch: update.Batch):
  """auroc_J: each judge's AUROC of the probability it puts on right, over the batch's first answers."""
  readout = exp.protocol.verdict_readout(exp.layout)
  level_logp_JxKxBxL = sampling.level_log_probs(exp.model, exp.layout, readout, params_R, batch.tokens_BxT,
                                                exp.config.rl.temperature)
  p_JxA = engine.expected_level(level_logp_JxKxBxL, readout.levels).reshape(len(readout.position_JxK), -1)
  return judging.auroc(p_JxA, batch.judge_label_BxK.T.reshape(-1))


def curve(exp, st, key, labels: int, held: int, updates: int, every: int):
  """(auroc_pool_CxJ, auroc_held_CxJ) of one seed at updates 0, every, 2 every, ..., updates."""
  pool_key, held_key, draw_key = jax.random.split(key, 3)
  pool, held_out = labelled(exp, st, pool_key, labels), labelled(exp, st, held_key, held)
  shown = jax.tree.map(lambda x: x[:min(SHOWN, labels)], pool)
  B = exp.config.rl.batch_size

  def one_update(carry, i):
    params, opt_state = carry
    rows = jax.random.choice(jax.random.fold_in(draw_key, i), labels, (B,), replace=False)
    params, opt_state, _ = update.apply(exp, params, opt_state, jax.tree.map(lambda x: x[rows], pool), 1)
    return (params, opt_state), None

  def chunk(carry, c):
    carry, _ = jax.lax.scan(one_update, carry, c * every + jnp.arange(every))
    return carry, (judge_auroc(exp, carry[0], shown), judge_auroc(exp, carry[0], held_out))

  start = (judge_auroc(exp, st.params, shown), judge_auroc(exp, st.params, held_out))
  _, (pool_CxJ, held_CxJ) = jax.lax.scan(chunk, (st.params, st.opt_state), jnp.arange(updates // every))
  return jnp.concatenate([start[0][None], pool_CxJ]), jnp.concatenate([start[1][None], held_CxJ])


def run(workdir: str, labels: int, held: int, updates: int, every: int) -> str:
  """The table of `curve` over every seed of the run in `workdir`."""
  config = configs.read_run_config(workdir)
  own = experiment.build(config)  # the run as it ran: refused here before the judge loss names a setting
  if own.protocol.verdict_readout(own.layout) is None:
    raise ValueError(f"--workdir={workdir}: its workflow's judges write no level as one token at a fixed "
                     f"position; allowed: peer_review or solver_verifier runs")
  exp = judge_experiment(config)
  if updates % every or labels < exp.config.rl.batch_size:
    raise ValueError(f"--updates={updates}, --every={every}, --labels={labels}; allowed: --updates a multiple "
                     f"of --every, --labels >= config.rl.batch_size={exp.config.rl.batch_size}")
  params_S = loop.load_params(exp, workdir, flag="--workdir")
  st_S = jax.vmap(functools.partial(state.init_state, exp))(state.seed_keys(exp.config), params_S)
  keys_S = jax.random.split(jax.random.PRNGKey(exp.config.seed), exp.config.num_seeds)
  per_seed = lambda st, key: curve(exp, st, key, labels, held, updates, every)
  pool_SxCxJ, held_SxCxJ = jax.jit(parallel.shard_map(jax.vmap(per_seed), parallel.make_mesh(1),
                                                      in_specs=(P(), P()), out_specs=P()))(st_S, keys_S)
  pool_CxS, held_CxS = (np.asarray(x).mean(-1).T for x in (pool_SxCxJ, held_SxCxJ))
  lines = [f"{exp.config.num_seeds} seeds, {labels} labelled answers a seed, batches of {exp.config.rl.batch_size}",
           "", "| updates | AUROC on the pool (%) | AUROC held out (%) |", "|---|---|---|"]
  # A seed without a right (or a wrong) answer among those read has no AUROC: the means are over the others.
  shown = lambda auroc_S: report.pm(*intervals.mean_ci(auroc_S[np.isfinite(auroc_S)]), count=False)
  for c, (pool_S, held_S) in enumerate(zip(pool_CxS, held_CxS)):
    lines.append(report.row(str(c * every), shown(pool_S), shown(held_S)).rstrip("\n"))
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="a run of a workflow with judges (a base run: its warm start)")
  parser.add_argument("--labels", type=int, default=4096, help="the pool's labelled episodes per seed")
  parser.add_argument("--held", type=int, default=512, help="the held-out episodes per seed")
  parser.add_argument("--updates", type=int, default=600)
  parser.add_argument("--every", type=int, default=100, help="updates between two rows")
  args = parser.parse_args(argv)
  with cli.refusing_bad_input(parser):
    table = run(args.workdir, args.labels, args.held, args.updates, args.every)
  print(table)


if __name__ == "__main__":
  main()
