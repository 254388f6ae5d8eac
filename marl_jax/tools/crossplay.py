"""Cross-play (issue 50): how much of a team's skill is a convention of its own.  Every pairing of one
role from team i with the other roles from team j (j = i: the team itself) plays the evaluation set
greedily; a code shared by every team plays as well across teams as within one, a private convention
does not.

  python -m marl_jax.tools.crossplay --workdirs=DIR[,DIR...] [--role=sender] [--out=FILE.json]

The teams are every seed of every run given (independently trained teams: the seeds of one run, or
runs with other seeds), all of one task, workflow and model.  It prints the N x N matrix of evaluation
accuracy (row i: the team `--role` comes from; column j: the team the other roles come from), the
self-play accuracy (the diagonal's mean), the cross-play accuracy (the mean off it) and their ratio;
`--out` writes every metric's matrix.
"""
import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import cli, configs, evaluate, experiment, loop, state


def teams(workdirs: list[str]) -> tuple[experiment.Experiment, object, list[str]]:
  """(the first run's experiment, params_N of every seed of every run, their names `DIR:seedS`).
  Refuses (ValueError) runs of another task, workflow, role map or model than the first's."""
  exps = [experiment.build(configs.read_run_config(w)) for w in workdirs]
  for w, exp in zip(workdirs[1:], exps[1:]):
    if exp.task != exps[0].task or exp.layout.roles != exps[0].layout.roles or exp.role_set_R != exps[0].role_set_R:
      raise ValueError(f"--workdirs: {w} trained another task, workflow or role map than {workdirs[0]}; "
                       f"allowed: runs of one task, workflow and config.roles.sharing")
  params = [loop.load_params(e, w, flag=f"--workdirs entry {w}") for w, e in zip(workdirs, exps)]
  shapes = lambda p_S: jax.tree.map(lambda x: x.shape[1:], p_S)
  for w, p_S in zip(workdirs[1:], params[1:]):
    if shapes(p_S) != shapes(params[0]):
      raise ValueError(f"--workdirs: {w} holds another model than {workdirs[0]}; allowed: runs of one config.model")
  names = [f"{w}:seed{s}" for w, e in zip(workdirs, exps) for s in range(e.config.num_seeds)]
  return exps[0], jax.tree.map(lambda *p: jnp.concatenate(p), *params), names


def paired(exp: experiment.Experiment, params_N, role: str):
  """params_P of the N x N pairings (p = i * N + j): `role`'s parameter set from team i, every other
  set from team j.  `role` must have a set of its own."""
  if role not in exp.layout.roles:
    raise ValueError(f"--role={role!r} is not a role of this workflow; allowed: {list(exp.layout.roles)}")
  own = exp.role_set_R[exp.layout.roles.index(role)]
  sharing = [r for r, s in zip(exp.layout.roles, exp.role_set_R) if s == own]
  if sharing != [role]:
    raise ValueError(f"--role={role!r} shares its parameter set with {sharing} (config.roles.sharing); "
                     f"allowed: a role with a set of its own")
  N = jax.tree.leaves(params_N)[0].shape[0]
  from_i_P, from_j_P = np.repeat(np.arange(N), N), np.tile(np.arange(N), N)

  def pair(p_NxSx):
    is_own = (np.arange(p_NxSx.shape[1]) == own).reshape((1, -1) + (1,) * (p_NxSx.ndim - 2))
    return jnp.where(is_own, p_NxSx[from_i_P], p_NxSx[from_j_P])
  return jax.tree.map(pair, params_N)


def matrices(exp: experiment.Experiment, params_N, role: str) -> dict[str, np.ndarray]:
  """Every evaluation metric of the pairings, greedy on the run's evaluation set: {name: value_NxN}."""
  N = jax.tree.leaves(params_N)[0].shape[0]
  metrics_P = state.to_host(evaluate.make_evaluate(exp)(paired(exp, params_N, role)))
  return {name: np.asarray(v).reshape(N, N) for name, v in metrics_P.items()}


def self_and_cross(value_NxN) -> dict[str, float]:
  """Self-play (the diagonal's mean), cross-play (the mean off it) and cross / self."""
  off = ~np.eye(len(value_NxN), dtype=bool)
  self_play, cross_play = float(np.diag(value_NxN).mean()), float(value_NxN[off].mean())
  return {"self_play": self_play, "cross_play": cross_play,
          "ratio": cross_play / self_play if self_play > 0 else float("nan")}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="python -m marl_jax.tools.crossplay",
                                   description="Evaluate every pairing of a role from one team with the rest of another.")
  parser.add_argument("--workdirs", required=True, help="run directories, comma-separated; every seed is a team")
  parser.add_argument("--role", default="", help="the role taken from the row's team (default: the first role)")
  parser.add_argument("--out", default="", help="write every metric's matrix here (JSON)")
  args = parser.parse_args(argv)
  with cli.refusing_bad_input(parser):
    workdirs = [w for w in args.workdirs.split(",") if w]
    if len(workdirs) < 1:
      raise ValueError("--workdirs is empty; give run directories, comma-separated")
    exp, params_N, names = teams(workdirs)
    if len(names) < 2:
      raise ValueError(f"--workdirs holds {len(names)} team; cross-play needs 2 or more (seeds or runs)")
    role = args.role or exp.layout.roles[0]
    values = matrices(exp, params_N, role)
  accuracy_NxN = values["accuracy"]
  print(f"accuracy: row = the team {role!r} comes from, column = the team of the other roles")
  for name, row_N in zip(names, accuracy_NxN):
    print(f"{name}  " + " ".join(f"{v:.3f}" for v in row_N))
  summary = self_and_cross(accuracy_NxN)
  print(f"self-play {summary['self_play']:.3f}, cross-play {summary['cross_play']:.3f}, "
        f"cross / self {summary['ratio']:.3f}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"teams": names, "role": role, **summary, "matrices": {k: v.tolist() for k, v in values.items()}}, f,
                indent=1)


if __name__ == "__main__":
  main()
