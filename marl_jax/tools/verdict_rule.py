"""The solver–verifier pair with its verdict decided by a rule (issue 63 item 6): what would the team
score if the verifier accepted exactly the answers on which its probability of ACCEPT reaches a
threshold?

  python -m marl_jax.tools.verdict_rule --workdir=DIR [--episodes=512]

For every seed of the solver_verifier run in DIR (its last checkpoint), on the first `--episodes`
problems of the run's evaluation set, decoded greedily as evaluation decodes: whether the solver's
answer is right (a), the verifier's probability p of ACCEPT on it (its distribution over REJECT and
ACCEPT at the verdict position, renormalised: `sampling.level_log_probs`) and, with REJECT forced there,
whether the revision it then writes is right (r).  Threshold t gives the team a where p >= t, else r:
t = 0 is the solver alone (every answer stands), t = 1/2 the greedy verdict, t above 1 the verifier's
revision alone.  Prints the team's accuracy per t (mean over seeds, 95 % interval), the best t of each
seed (chosen on the same problems: an upper bound on a rule fitted elsewhere), the oracle max(a, r) and
the AUROC of p for a.
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from marl_jax import cli, configs, evaluate, experiment, judging, loop, parallel, rollout, sampling, text
from marl_jax.protocols import engine
from marl_jax.tools import intervals, report

THRESHOLDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.01)


def team_accuracy(p_B, answer_right_B, revision_right_B, thresholds_N):
  """accuracy_N: the team's accuracy when the answer stands where p_B >= each threshold, else the
  revision."""
  stands_NxB = p_B[None] >= jnp.asarray(thresholds_N)[:, None]
  return jnp.where(stands_NxB, answer_right_B[None], revision_right_B[None]).mean(-1)


def verdict_evidence(exp, params_R, problems):
  """(p_B, answer_right_B, revision_right_B, team_B) of one seed's team on `problems`, greedily decoded
  (team_B: its own final answer's score, as evaluation scores it)."""
  B = problems["prompt"].shape[0]
  no_keys = jax.random.split(jax.random.PRNGKey(0), B)  # greedy: the keys draw nothing
  tokens_BxT = rollout.sample(exp, params_R, problems, no_keys, greedy=True).tokens_BxT
  readout = exp.protocol.verdict_readout(exp.layout)
  level_logp_BxL = sampling.level_log_probs(exp.model, exp.layout, readout, params_R, tokens_BxT,
                                            exp.config.rl.temperature)[0, 0]
  p_B = engine.expected_level(level_logp_BxL, readout.levels)
  # The prompt and the solver's answer kept, REJECT forced at the verdict, the revision after it decoded.
  verdict = int(readout.position_JxK[0, 0])
  answer_start, answer_stop = exp.layout.turn_slices[readout.answer_turn_K[0]]
  force_BxT = jnp.zeros(tokens_BxT.shape, bool).at[:, answer_start:answer_stop].set(True).at[:, verdict].set(True)
  kept_T = jnp.arange(tokens_BxT.shape[1]) < answer_stop
  canvas_BxT = jnp.where(kept_T, tokens_BxT, text.PAD).at[:, verdict].set(text.REJECT)
  rejected_BxT = sampling.generate(exp.model, exp.layout, params_R, canvas_BxT, force_BxT, no_keys,
                                   exp.config.rl.temperature, True)[0]
  score = jax.vmap(exp.task.score)
  answer_right_B = score(problems, tokens_BxT[:, answer_start:answer_stop])
  revision_right_B = score(problems, exp.protocol.final_answer(exp.layout, rejected_BxT))
  return p_B, answer_right_B, revision_right_B, score(problems, exp.protocol.final_answer(exp.layout, tokens_BxT))


def run(workdir: str, episodes: int) -> str:
  """The table over every seed of the run in `workdir`."""
  exp = experiment.build(configs.read_run_config(workdir))
  if exp.config.protocol.name != "solver_verifier" or exp.protocol.rounds != 1:
    raise ValueError(f"--workdir={workdir}: a {exp.config.protocol.name!r} run with rounds="
                     f"{exp.config.protocol.get('rounds')}; allowed: a solver_verifier run of one round")
  problems = evaluate.eval_problems(exp, exp.config.eval.data_dir)
  size = problems["prompt"].shape[0]
  if not 1 <= episodes <= size:
    raise ValueError(f"--episodes={episodes}; allowed: 1..{size} (the run's config.eval.size)")
  problems = jax.tree.map(lambda x: x[:episodes], problems)
  params_S = loop.load_params(exp, workdir, flag="--workdir")
  per_seed = jax.vmap(lambda params_R: verdict_evidence(exp, params_R, problems))
  p_SxB, a_SxB, r_SxB, team_SxB = map(np.asarray, jax.jit(parallel.shard_map(
      per_seed, parallel.make_mesh(1), in_specs=(P(),), out_specs=P()))(params_S))
  accuracy_SxN = np.asarray(jax.vmap(team_accuracy, in_axes=(0, 0, 0, None))(p_SxB, a_SxB, r_SxB, THRESHOLDS))
  shown = lambda x_S: report.pm(*intervals.mean_ci(np.asarray(x_S)), count=False)  # in %
  lines = [f"{exp.config.num_seeds} seeds, {episodes} evaluation problems a seed, greedy", "",
           "| verdict | team accuracy (%) |", "|---|---|"]
  names = {0.0: "t = 0 (the solver alone)", 0.5: "t = 0.5 (the greedy verdict)", 1.01: "t > 1 (the revision alone)"}
  for n, t in enumerate(THRESHOLDS):
    lines.append(report.row(names.get(t, f"t = {t:g}"), shown(accuracy_SxN[:, n])).rstrip("\n"))
  auroc_S = np.asarray(jax.vmap(lambda p_B, a_B: judging.auroc(p_B[None], a_B)[0])(p_SxB, a_SxB))
  lines += [report.row("its own greedy verdict (as evaluated)", shown(team_SxB.mean(1))).rstrip("\n"),
            report.row("best t per seed (fitted on these problems)", shown(accuracy_SxN.max(1))).rstrip("\n"),
            report.row("oracle: max(answer, revision)", shown(np.maximum(a_SxB, r_SxB).mean(1))).rstrip("\n"),
            "", f"AUROC of p for a right answer: {shown(auroc_S[np.isfinite(auroc_S)])} %; "
                f"p's mean {shown(p_SxB.mean(1))} %"]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="a solver_verifier run of one round")
  parser.add_argument("--episodes", type=int, default=512, help="evaluation problems a seed")
  args = parser.parse_args(argv)
  with cli.refusing_bad_input(parser):
    table = run(args.workdir, args.episodes)
  print(table)


if __name__ == "__main__":
  main()
