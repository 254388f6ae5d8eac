"""Transcript archives: `archive` samples every seed's team on its evaluation set and writes the
canvases, author of each position, rewards and counterfactual credit per role as
`marl_transcripts/NAME:1.0.0` (a TFDS array_record dataset, see `array_records.py`); `load_transcripts`
reads them back as numpy arrays and readable text.

  python -m marl_jax.archive --workdir=DIR [--out=DIR] [--greedy] [--data_dir=DIR]
"""
import argparse
import dataclasses
import functools
import json
import os

import jax
import numpy as np

from marl_jax import (array_records, checkpoint, cli, configs, credit, datasets, evaluate, experiment, loop,
                      rollout, tasks, text)
from marl_jax.lm import agent as lm_agent


class MarlTranscripts(array_records.ArrayRows):
  """Transcripts of a marl_jax team on an evaluation set: tokens, authors, rewards, credit per role."""


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


def archive(exp: experiment.Experiment, params_S, out_dir: str, name: str, greedy: bool = False,
            with_credit: bool = True, data_dir: str = "", extra_metadata: dict | None = None) -> str:
  """Samples the team on its evaluation set (`config.eval`) and writes `marl_transcripts/NAME`.

  The evaluation set is read from (or built in) `data_dir` when given.  Returns the dataset's name;
  an existing archive is never overwritten.
  """
  if array_records.exists(MarlTranscripts, name, out_dir):
    raise FileExistsError(f"{os.path.join(out_dir, MarlTranscripts.name, name, array_records.VERSION)} exists; "
                          f"choose another output directory or name")
  cfg = exp.config.eval
  problems = evaluate.eval_problems(exp, data_dir)
  rows = sample_transcripts(exp, params_S, problems, jax.random.PRNGKey(cfg.seed + 2), greedy, with_credit)
  metadata = {**layout_metadata(exp), "task": datasets.task_name(exp.task),
              "knobs": datasets.task_knobs(exp.task),
              "eval_set": datasets.eval_set_name(exp.task, cfg.seed, cfg.size),
              "protocol": exp.config.protocol.to_dict(), "greedy": greedy,
              "credit": "difference" if with_credit else None,
              "config": json.loads(exp.config.to_json()), **(extra_metadata or {})}
  array_records.write(MarlTranscripts, name, out_dir, rows, metadata)
  return f"{MarlTranscripts.name}/{name}:{array_records.VERSION}"


@dataclasses.dataclass
class Transcripts:
  """An archive read back: `arrays` (one row per transcript) and the layout and run in `metadata`."""
  arrays: dict[str, np.ndarray]
  metadata: dict

  def __len__(self) -> int:
    return len(self.arrays["tokens"])

  @functools.cached_property
  def decode(self):
    """Canvas values -> text: the engine's symbols, or a free-text task's tokens through the run's
    checkpoint tokenizer (`config.model.checkpoint`, which must still be there; no weights are read)."""
    if not tasks.REGISTRY[self.metadata["task"]].free_text:
      return text.decode
    tok, canvas_ids_W = lm_agent.free_text_canvas(self.metadata["config"]["model"]["checkpoint"])
    return functools.partial(lm_agent.decode, tok, canvas_ids_W)

  def text(self, i: int) -> str:
    """Row i as text: the prompt, each played message under its role, rewards and credit."""
    meta, tokens_T = self.metadata, self.arrays["tokens"][i]
    roles = meta["roles"]
    # The prompt ends where the first turn's header starts (an archive written before headers had
    # more than the marker has no prompt_len: its prompt ends at that marker).
    prompt_len = meta.get("prompt_len", meta["turn_slices"][0][0] - 1)
    lines = [f"prompt: {self.decode(tokens_T[:prompt_len])}"]
    for (start, stop), r in zip(meta["turn_slices"], meta["turn_roles"]):
      if (tokens_T[start:stop] != text.PAD).any():
        lines.append(f"{roles[r]}: {self.decode(tokens_T[start:stop])}")
    per_role = [f"{role} reward {self.arrays['role_reward'][i, r]:.2f}" +
                (f" credit {self.arrays['credit'][i, r]:+.2f}" if "credit" in self.arrays else "")
                for r, role in enumerate(roles)]
    lines.append(f"team reward {self.arrays['team_reward'][i]:.2f}; " + "; ".join(per_role))
    return "\n".join(lines)

  @property
  def texts(self) -> list[str]:
    return [self.text(i) for i in range(len(self))]


def load_transcripts(out_dir: str, name: str) -> Transcripts:
  return Transcripts(*array_records.read(MarlTranscripts, name, out_dir))


def archive_workdir(workdir: str, out_dir: str, greedy: bool = False, data_dir: str = "") -> str:
  """Archives the latest checkpoint of a run under `out_dir`; returns the archive's config name."""
  config = configs.read_run_config(workdir)
  exp = experiment.build(config)
  params_S = loop.load_params(exp, workdir, flag=f"--workdir={workdir}")
  step = checkpoint.latest_step(workdir)
  name = f"step{step}-{'greedy' if greedy else 'sampled'}"
  archive(exp, params_S, out_dir, name, greedy, data_dir=data_dir,
          extra_metadata={"workdir": os.path.abspath(workdir), "step": step})
  return name


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
      prog="python -m marl_jax.archive",
      description="Sample a trained team on its evaluation set and write the transcripts.")
  parser.add_argument("--workdir", required=True, help="a run directory (config.json and checkpoints)")
  parser.add_argument("--out", default="", help="output data_dir (default: WORKDIR/transcripts)")
  parser.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
  parser.add_argument("--data_dir", default="", help="read (or build) the evaluation set here")
  args = parser.parse_args(argv)
  out = args.out or os.path.join(args.workdir, "transcripts")
  with cli.refusing_bad_input(parser):
    name = archive_workdir(args.workdir, out, args.greedy, args.data_dir)
  transcripts = load_transcripts(out, name)
  print(f"wrote {MarlTranscripts.name}/{name}:{array_records.VERSION} ({len(transcripts)} transcripts) "
        f"under {out}; "
        f"the first:\n{transcripts.text(0)}")


if __name__ == "__main__":
  main()
