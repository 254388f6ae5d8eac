"""Datasets as tensorflow-datasets in array_record files (no TensorFlow needed; read with grain).

Fixed evaluation sets, versioned, one config per task, difficulty, seed and size::

  marl_eval_set/subset_sum-max_number9-num_numbers5-seed1234-n512:1.0.0

`load_eval_set` reads one, building it first when it does not exist; the problems are exactly those of
`tasks.eval_problems`, so a number measured on either names the same dataset.  `archive.py` writes
transcript archives with the same machinery.
"""
import os
import re

import grain
import jax
import numpy as np
import tensorflow_datasets as tfds

from marl_jax import tasks

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


def write(builder_cls, config: str, data_dir: str, rows: dict, metadata: dict) -> None:
  if not _CONFIG_NAME.match(config):
    raise ValueError(f"dataset config name {config!r} may only hold letters, digits and _+-.")
  rows = {k: np.asarray(v) for k, v in rows.items()}
  builder = builder_cls(rows=rows, metadata=metadata, data_dir=data_dir,
                        config=tfds.core.BuilderConfig(name=config, description=builder_cls.__doc__))
  builder.download_and_prepare()


def exists(builder_cls, config: str, data_dir: str) -> bool:
  return os.path.exists(os.path.join(data_dir, builder_cls.name, config, VERSION, "dataset_info.json"))


def read(builder_cls, config: str, data_dir: str) -> tuple[dict[str, np.ndarray], dict]:
  """Every row, in the dtypes written; and the metadata."""
  source = tfds.data_source(f"{builder_cls.name}/{config}:{VERSION}", split=SPLIT, data_dir=data_dir)
  return read_source(source), dict(source.dataset_info.metadata)


def read_source(source) -> dict[str, np.ndarray]:
  """Every row of a TFDS array_record data source, batched by grain, in the dtypes written (text
  features as bytes objects)."""
  features = source.dataset_info.features
  batch = grain.MapDataset.source(source).batch(len(source))[0]
  return {k: np.asarray(batch[k], features[k].np_dtype) for k in features.keys()}


# ---------------------------------------------------------------------------------------------
# Fixed evaluation sets.


def task_name(task: tasks.Task) -> str:
  if tasks.REGISTRY.get(task.name) is not type(task):
    raise ValueError(f"{type(task).__name__} is not a registered task (marl_jax.tasks.REGISTRY); "
                     f"evaluation sets are named after registered tasks: {sorted(tasks.REGISTRY)}")
  return task.name


def task_knobs(task: tasks.Task) -> dict:
  """The knobs that define the problems (`Task.problem_knobs`)."""
  return task.problem_knobs()


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
  if not exists(MarlEvalSet, config, data_dir):
    metadata = {"task": task_name(task), "knobs": task_knobs(task), "seed": seed, "size": size}
    write(MarlEvalSet, config, data_dir, jax.device_get(tasks.eval_problems(task, seed, size)), metadata)
  return read(MarlEvalSet, config, data_dir)[0]
