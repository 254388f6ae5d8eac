"""Datasets of numpy rows as tensorflow-datasets in array_record files (no TensorFlow needed; read with
grain): a builder that writes rows held in memory, and reading any array_record data source back.

`datasets.py` writes fixed evaluation sets with it, `tools/archive.py` transcript archives, and
`word_problem_sets` reads TFDS word-problem directories (e.g. what `tfds build gsm8k` writes).
"""
import os
import re

import grain
import numpy as np
import tensorflow_datasets as tfds

VERSION = "1.0.0"
SPLIT = "test"
_CONFIG_NAME = re.compile(r"^[\w+\-.]+$")  # what TFDS accepts in `dataset/config:version`


class ArrayRows(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Writes rows of fixed-shape numpy arrays held in memory: one split, in order.  Each kind of dataset
  is a subclass, registered with TFDS under its class name in snake case (MarlEvalSet: marl_eval_set)."""
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
