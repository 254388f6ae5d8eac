"""Datasets as tensorflow-datasets in array_record files (no TensorFlow needed; read with grain).

Fixed evaluation sets, versioned, one config per task, difficulty, seed and size:
  marl_eval_set/subset_sum-max_number9-num_numbers5-seed1234-n512:1.0.0
`load_eval_set` reads one, building it first when it does not exist; the problems are exactly those of
`tasks.eval_problems`, so a number measured on either names the same dataset.

Transcript archives: `archive` samples every seed's team on its evaluation set and writes the canvases,
author of each position, rewards and counterfactual credit per role as `marl_transcripts/NAME:1.0.0`;
`load_transcripts` reads them back as numpy arrays and readable text.

  python -m marl_jax.data archive --workdir=DIR [--out=DIR] [--greedy] [--data_dir=DIR]
"""
import argparse
import dataclasses
import json
import os
import re

import grain
import jax
import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from marl_jax import checkpoint, credit, tasks, text, train

VERSION = "1.0.0"
SPLIT = "test"
_CONFIG_NAME = re.compile(r"^[\w+\-.]+$")  # what TFDS accepts in `dataset/config:version`


class _ArrayRows(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Writes rows of fixed-shape numpy arrays held in memory: one split, in order."""
  VERSION = tfds.core.Version(VERSION)
  RELEASE_NOTES = {str(VERSION): "First release."}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    # No checksum or metadata files live beside this code; and TFDS's own lookup of the code's path
    # needs `importlib_resources`, which it only declares for Python < 3.9.
    return None

  def __init__(self, *, rows: dict[str, np.ndarray], metadata: dict, **kwargs):
    self._rows, self._metadata = rows, metadata
    super().__init__(file_format="array_record", **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    features = {k: tfds.features.Tensor(shape=v.shape[1:], dtype=v.dtype) for k, v in self._rows.items()}
    return tfds.core.DatasetInfo(
        builder=self, description=self.__doc__, features=tfds.features.FeaturesDict(features),
        metadata=tfds.core.MetadataDict(self._metadata), disable_shuffling=True)

  def _split_generators(self, dl_manager):
    del dl_manager
    return {SPLIT: self._generate_examples()}

  def _generate_examples(self):
    for i in range(len(next(iter(self._rows.values())))):
      yield i, {k: v[i] for k, v in self._rows.items()}


class MarlEvalSet(_ArrayRows):
  """A fixed evaluation set of one marl_jax task: the problems `tasks.eval_problems` draws."""


class MarlTranscripts(_ArrayRows):
  """Transcripts of a marl_jax team on an evaluation set: tokens, authors, rewards, credit per role."""


def _write(builder_cls, config: str, data_dir: str, rows: dict, metadata: dict) -> None:
  if not _CONFIG_NAME.match(config):
    raise ValueError(f"dataset config name {config!r} may only hold letters, digits and _+-.")
  rows = {k: np.asarray(v) for k, v in rows.items()}
  builder = builder_cls(rows=rows, metadata=metadata, data_dir=data_dir,
                        config=tfds.core.BuilderConfig(name=config, description=builder_cls.__doc__))
  builder.download_and_prepare()


def _exists(builder_cls, config: str, data_dir: str) -> bool:
  return os.path.exists(os.path.join(data_dir, builder_cls.name, config, VERSION, "dataset_info.json"))


def _read(builder_cls, config: str, data_dir: str) -> tuple[dict[str, np.ndarray], dict]:
  """Every row, batched by grain from `tfds.data_source`, in the dtypes written; and the metadata."""
  source = tfds.data_source(f"{builder_cls.name}/{config}:{VERSION}", split=SPLIT, data_dir=data_dir)
  features = source.dataset_info.features
  batch = grain.MapDataset.source(source).batch(len(source))[0]
  arrays = {k: np.asarray(batch[k], features[k].np_dtype) for k in features.keys()}
  return arrays, dict(source.dataset_info.metadata)


# ---------------------------------------------------------------------------------------------
# Fixed evaluation sets.


def task_name(task: tasks.Task) -> str:
  return next(name for name, cls in tasks.REGISTRY.items() if type(task) is cls)


def task_knobs(task: tasks.Task) -> dict:
  """The knobs that define the problems (demonstration noise does not)."""
  return {f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.name != "demo_error_rate"}


def eval_set_config(task: tasks.Task, seed: int, size: int) -> str:
  """`TASK-KNOBVALUE-...-seedS-nN`; characters TFDS does not take in a name are written `_hex_`."""
  escape = lambda v: re.sub(r"[^\w+\-.]", lambda m: f"_{ord(m.group()):x}_", str(v))
  knobs = "-".join(f"{k}{escape(v)}" for k, v in sorted(task_knobs(task).items()))
  return f"{task_name(task)}-{knobs}-seed{seed}-n{size}"


def eval_set_name(task: tasks.Task, seed: int, size: int) -> str:
  """The name to quote with a number measured on this set: `marl_eval_set/CONFIG:VERSION`."""
  return f"{MarlEvalSet.name}/{eval_set_config(task, seed, size)}:{VERSION}"


def load_eval_set(task: tasks.Task, seed: int, size: int, data_dir: str) -> dict[str, np.ndarray]:
  """`tasks.eval_problems(task, seed, size)` as numpy arrays, read from data_dir (built if missing)."""
  config = eval_set_config(task, seed, size)
  if not _exists(MarlEvalSet, config, data_dir):
    metadata = {"task": task_name(task), "knobs": task_knobs(task), "seed": seed, "size": size}
    _write(MarlEvalSet, config, data_dir, jax.device_get(tasks.eval_problems(task, seed, size)), metadata)
  return _read(MarlEvalSet, config, data_dir)[0]


# ---------------------------------------------------------------------------------------------
# Transcript archives.


def sample_transcripts(exp: train.Experiment, params_S, problems: dict, key, greedy: bool = False,
                       with_credit: bool = True) -> dict[str, np.ndarray]:
  """Each seed's team on every problem; rows seed-major (row = s * N + i).

  `credit` is the difference credit D_r = R - mean_K R(role r's messages re-drawn), drawn as in
  training with `config.rl.counterfactual` and `config.rl.counterfactual_samples`.
  """
  N = problems["prompt"].shape[0]
  S = jax.tree.leaves(params_S)[0].shape[0]

  def one_seed(params_R, k):
    k_sample, k_cf = jax.random.split(k)
    tokens_BxT, _, _ = train.rollout(exp, params_R, problems, jax.random.split(k_sample, N), greedy)
    rewards = exp.protocol.rewards(exp.task, exp.layout, problems, tokens_BxT)
    out = {"tokens": tokens_BxT, "team_reward": rewards["team_B"], "role_reward": rewards["role_RxB"].T}
    if with_credit:
      cf_team_RxKxB = train.counterfactual_team(exp, params_R, problems, tokens_BxT,
                                                jax.random.split(k_cf, N))
      out["credit"] = credit.difference_credit(rewards["team_B"], cf_team_RxKxB).T
    return out

  out_S = jax.device_get(jax.jit(jax.vmap(one_seed))(params_S, jax.random.split(key, S)))
  rows = {k: v.reshape((S * N,) + v.shape[2:]) for k, v in out_S.items()}
  rows["seed"] = np.repeat(np.arange(S, dtype=np.int32), N)
  rows["index"] = np.tile(np.arange(N, dtype=np.int32), S)
  rows["author"] = np.broadcast_to(exp.layout.author_T.astype(np.int32), rows["tokens"].shape)
  for k, v in jax.device_get(problems).items():
    rows[f"problem_{k}"] = np.tile(np.asarray(v), (S,) + (1,) * (v.ndim - 1))
  return rows


def layout_metadata(exp: train.Experiment) -> dict:
  layout = exp.layout
  return {"roles": list(layout.roles), "segment_names": list(layout.segment_names),
          "segment_T": layout.segment_T.tolist(), "author_T": layout.author_T.tolist(),
          "turn_slices": [list(s) for s in layout.turn_slices], "turn_roles": list(layout.turn_roles)}


def archive(exp: train.Experiment, params_S, out_dir: str, name: str, greedy: bool = False,
            with_credit: bool = True, data_dir: str = "", extra_metadata: dict | None = None) -> str:
  """Samples the team on its evaluation set (`config.eval`) and writes `marl_transcripts/NAME`.

  The evaluation set is read from (or built in) `data_dir` when given.  Returns the dataset's name;
  an existing archive is never overwritten.
  """
  if _exists(MarlTranscripts, name, out_dir):
    raise FileExistsError(f"{os.path.join(out_dir, MarlTranscripts.name, name, VERSION)} exists; "
                          f"choose another output directory or name")
  cfg = exp.config.eval
  problems = (load_eval_set(exp.task, cfg.seed, cfg.size, data_dir) if data_dir
              else tasks.eval_problems(exp.task, cfg.seed, cfg.size))
  rows = sample_transcripts(exp, params_S, problems, jax.random.PRNGKey(cfg.seed + 2), greedy, with_credit)
  metadata = {**layout_metadata(exp), "task": task_name(exp.task), "knobs": task_knobs(exp.task),
              "eval_set": eval_set_name(exp.task, cfg.seed, cfg.size),
              "protocol": exp.config.protocol.to_dict(), "greedy": greedy,
              "credit": "difference" if with_credit else None,
              "config": json.loads(exp.config.to_json()), **(extra_metadata or {})}
  _write(MarlTranscripts, name, out_dir, rows, metadata)
  return f"{MarlTranscripts.name}/{name}:{VERSION}"


@dataclasses.dataclass
class Transcripts:
  """An archive read back: `arrays` (one row per transcript) and the layout and run in `metadata`."""
  arrays: dict[str, np.ndarray]
  metadata: dict

  def __len__(self) -> int:
    return len(self.arrays["tokens"])

  def text(self, i: int) -> str:
    """Row i as text: the prompt, each played message under its role, rewards and credit."""
    meta, tokens_T = self.metadata, self.arrays["tokens"][i]
    roles = meta["roles"]
    lines = [f"prompt: {text.decode(tokens_T[:meta['turn_slices'][0][0] - 1])}"]
    for (start, stop), r in zip(meta["turn_slices"], meta["turn_roles"]):
      if (tokens_T[start:stop] != text.PAD).any():
        lines.append(f"{roles[r]}: {text.decode(tokens_T[start:stop])}")
    per_role = [f"{role} reward {self.arrays['role_reward'][i, r]:.2f}" +
                (f" credit {self.arrays['credit'][i, r]:+.2f}" if "credit" in self.arrays else "")
                for r, role in enumerate(roles)]
    lines.append(f"team reward {self.arrays['team_reward'][i]:.2f}; " + "; ".join(per_role))
    return "\n".join(lines)

  @property
  def texts(self) -> list[str]:
    return [self.text(i) for i in range(len(self))]


def load_transcripts(out_dir: str, name: str) -> Transcripts:
  return Transcripts(*_read(MarlTranscripts, name, out_dir))


def archive_workdir(workdir: str, out_dir: str, greedy: bool = False, data_dir: str = "") -> str:
  """Archives the latest checkpoint of a run under `out_dir`; returns the archive's config name."""
  with open(os.path.join(workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  exp = train.build(config)
  params_S = train.load_params(exp, workdir)
  step = checkpoint.latest_step(workdir)
  name = f"step{step}-{'greedy' if greedy else 'sampled'}"
  archive(exp, params_S, out_dir, name, greedy, data_dir=data_dir,
          extra_metadata={"workdir": os.path.abspath(workdir), "step": step})
  return name


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="python -m marl_jax.data")
  commands = parser.add_subparsers(dest="command", required=True)
  cmd = commands.add_parser("archive", help="sample a trained team on its evaluation set; write transcripts")
  cmd.add_argument("--workdir", required=True, help="a run directory (config.json and checkpoints)")
  cmd.add_argument("--out", default="", help="output data_dir (default: WORKDIR/transcripts)")
  cmd.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
  cmd.add_argument("--data_dir", default="", help="read (or build) the evaluation set here")
  args = parser.parse_args(argv)
  out = args.out or os.path.join(args.workdir, "transcripts")
  name = archive_workdir(args.workdir, out, args.greedy, args.data_dir)
  transcripts = load_transcripts(out, name)
  print(f"wrote {MarlTranscripts.name}/{name}:{VERSION} ({len(transcripts)} transcripts) under {out}; "
        f"the first:\n{transcripts.text(0)}")


if __name__ == "__main__":
  main()
