"""Transcript archives: `archive` samples every seed's team on its evaluation set (or on training
problems) and writes the canvases, author of each position, rewards and counterfactual credit per role
as `marl_transcripts/NAME:1.0.0` (a TFDS array_record dataset, see `array_records.py`);
`transcripts.load_transcripts` reads them back as numpy arrays and readable text, and
`transcripts.distillation_set` as what a warm start distils (`config.sft.transcripts`).

  python -m marl_jax.tools.archive --workdir=DIR [--out=DIR] [--greedy] [--data_dir=DIR] [--train=N]

`--train=N` samples N training problems instead of the evaluation set: drawn as training draws them,
from the run's seed (`training_problems`), so a team that learns from the archive (the next
generation) never reads the evaluation set's transcripts.
"""
import argparse
import json
import os

import jax
import numpy as np

from marl_jax import array_records, checkpoint, cli, configs, credit, datasets, evaluate, experiment, loop, rollout
from marl_jax.transcripts import MarlTranscripts, load_transcripts


def difference_estimator(exp: experiment.Experiment) -> credit.Estimator:
  """The run's own difference-credit settings when it trained with them, else the defaults."""
  return exp.credit if exp.config.credit.name == "difference" else credit.make("difference")


def sample_transcripts(exp: experiment.Experiment, params_S, problems: dict, key, greedy: bool = False,
                       with_credit: bool = True) -> dict[str, np.ndarray]:
  """Each seed's team on every problem; rows seed-major (row = s * N + i).

  `credit` is the difference credit D_r = R - mean_K R(role r's messages re-drawn), drawn with the
  run's difference-credit settings (`difference_estimator`).
  """
  N = problems["prompt"].shape[0]
  S = jax.tree.leaves(params_S)[0].shape[0]
  reruns = difference_estimator(exp).reruns(len(exp.layout.roles))

  def one_seed(params_R, k):
    k_sample, k_rerun = jax.random.split(k)
    tokens_BxT = rollout.sample(exp, params_R, problems, jax.random.split(k_sample, N), greedy).tokens_BxT
    scored = exp.protocol.rewards(exp.task, exp.layout, problems, tokens_BxT)
    out = {"tokens": tokens_BxT, "team_reward": scored.team_B, "role_reward": scored.role_RxB.T}
    if with_credit:
      team_RxKxB = rollout.rerun(exp, params_R, problems, tokens_BxT, jax.random.split(k_rerun, N),
                                 reruns).team_CxKxB
      out["credit"] = credit.difference_credit(scored.team_B, team_RxKxB).T
    return out

  out_S = jax.device_get(jax.jit(jax.vmap(one_seed))(params_S, jax.random.split(key, S)))
  rows = {k: v.reshape((S * N,) + v.shape[2:]) for k, v in out_S.items()}
  rows["seed"] = np.repeat(np.arange(S, dtype=np.int32), N)
  rows["index"] = np.tile(np.arange(N, dtype=np.int32), S)
  rows["author"] = np.broadcast_to(exp.layout.author_T.astype(np.int32), rows["tokens"].shape)
  for k, v in jax.device_get(problems).items():
    rows[f"problem_{k}"] = np.tile(np.asarray(v), (S,) + (1,) * (v.ndim - 1))
  return rows


def layout_metadata(exp: experiment.Experiment) -> dict:
  layout = exp.layout
  return {"roles": list(layout.roles), "segment_names": list(layout.segment_names),
          "segment_T": layout.segment_T.tolist(), "author_T": layout.author_T.tolist(),
          "turn_slices": [list(s) for s in layout.turn_slices], "turn_roles": list(layout.turn_roles),
          "prompt_len": layout.prompt_len}


# Folded into the run's seed for the training problems an archive samples (`training_problems`), and for
# the keys it samples them with: apart from the keys of the run's own batches and of its evaluation.
_TRAIN_PROBLEMS, _TRAIN_SAMPLES = 11, 12


def training_problems(exp: experiment.Experiment, size: int) -> dict:
  """`size` problems drawn from the task as training draws its batches (`task.sample`), with keys
  from `config.seed` rather than `config.eval.seed`: the problems a generation learns from."""
  keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(exp.config.seed), _TRAIN_PROBLEMS), size)
  return exp.task.sample_batch(keys)


def archive(exp: experiment.Experiment, params_S, out_dir: str, name: str, greedy: bool = False,
            with_credit: bool = True, data_dir: str = "", extra_metadata: dict | None = None,
            train: int = 0) -> str:
  """Samples the team on its evaluation set (`config.eval`), or with `train` on that many training
  problems (`training_problems`), and writes `marl_transcripts/NAME`.

  The evaluation set is read from (or built in) `data_dir` when given.  Returns the dataset's name;
  an existing archive is never overwritten.
  """
  if array_records.exists(MarlTranscripts, name, out_dir):
    raise FileExistsError(f"{os.path.join(out_dir, MarlTranscripts.name, name, array_records.VERSION)} exists; "
                          f"choose another output directory or name")
  cfg = exp.config.eval
  if train:
    problems = training_problems(exp, train)
    key = jax.random.fold_in(jax.random.PRNGKey(exp.config.seed), _TRAIN_SAMPLES)
  else:
    problems, key = evaluate.eval_problems(exp, data_dir), jax.random.PRNGKey(cfg.seed + 2)
  rows = sample_transcripts(exp, params_S, problems, key, greedy, with_credit)
  metadata = {**layout_metadata(exp), "task": datasets.task_name(exp.task),
              "knobs": datasets.task_knobs(exp.task),
              "problems": f"train-seed{exp.config.seed}-n{train}" if train else "eval",
              "eval_set": datasets.eval_set_name(exp.task, cfg.seed, cfg.size),
              "protocol": exp.config.protocol.to_dict(), "greedy": greedy,
              "credit": "difference" if with_credit else None,
              "config": json.loads(exp.config.to_json()), **(extra_metadata or {})}
  array_records.write(MarlTranscripts, name, out_dir, rows, metadata)
  return f"{MarlTranscripts.name}/{name}:{array_records.VERSION}"


def archive_name(step: int, greedy: bool, train: int = 0) -> str:
  """What `archive_workdir` names the archive of checkpoint `step`: e.g. `step300-sampled`, or
  `train512-step300-sampled` on 512 training problems."""
  return f"{f'train{train}-' if train else ''}step{step}-{'greedy' if greedy else 'sampled'}"


def archive_workdir(workdir: str, out_dir: str, greedy: bool = False, data_dir: str = "", train: int = 0) -> str:
  """Archives the latest checkpoint of a run under `out_dir` (on `train` training problems, or on
  the evaluation set); returns the archive's config name."""
  config = configs.read_run_config(workdir)
  exp = experiment.build(config)
  params_S = loop.load_params(exp, workdir, flag=f"--workdir={workdir}")
  step = checkpoint.latest_step(workdir)
  name = archive_name(step, greedy, train)
  archive(exp, params_S, out_dir, name, greedy, data_dir=data_dir,
          extra_metadata={"workdir": os.path.abspath(workdir), "step": step}, train=train)
  return name


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
      prog="python -m marl_jax.tools.archive",
      description="Sample a trained team on its evaluation set and write the transcripts.")
  parser.add_argument("--workdir", required=True, help="a run directory (config.json and checkpoints)")
  parser.add_argument("--out", default="", help="output data_dir (default: WORKDIR/transcripts)")
  parser.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
  parser.add_argument("--data_dir", default="", help="read (or build) the evaluation set here")
  parser.add_argument("--train", type=int, default=0,
                      help="sample this many training problems instead of the evaluation set")
  args = parser.parse_args(argv)
  if args.train < 0:
    parser.error(f"--train={args.train}; allowed: 0 (the evaluation set) or a number of training problems")
  out = args.out or os.path.join(args.workdir, "transcripts")
  with cli.refusing_bad_input(parser):
    name = archive_workdir(args.workdir, out, args.greedy, args.data_dir, args.train)
  transcripts = load_transcripts(out, name)
  print(f"wrote {MarlTranscripts.name}/{name}:{array_records.VERSION} ({len(transcripts)} transcripts) "
        f"under {out}; "
        f"the first:\n{transcripts.text(0)}")


if __name__ == "__main__":
  main()
