"""TFDS evaluation sets, written to a temporary directory and read back (array_record files,
tfds.data_source and grain; no TensorFlow)."""
import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from marl_jax import datasets, tasks


# Free-text tasks read a file and a checkpoint's tokenizer: tests/word_task_test.py archives theirs.
@pytest.mark.parametrize("task_name", sorted(n for n, cls in tasks.REGISTRY.items() if not cls.free_text))
def test_eval_set_is_exactly_eval_problems(tmp_path, task_name):
  task = tasks.make(task_name)
  loaded = datasets.load_eval_set(task, seed=3, size=6, data_dir=str(tmp_path))
  expected = jax.device_get(tasks.eval_problems(task, 3, 6))
  assert sorted(loaded) == sorted(expected)
  for k, v in expected.items():
    assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape, k
    np.testing.assert_array_equal(loaded[k], v)


def test_eval_set_is_named_by_its_knobs_and_read_when_it_exists(tmp_path, monkeypatch):
  task = tasks.make("subset_sum", demo_error_rate=0.9)
  name = datasets.eval_set_name(task, 1234, 4)
  # Demonstration noise does not change the problems, so it does not change the name.
  assert name == "marl_eval_set/subset_sum-max_number9-num_numbers5-seed1234-n4:1.0.0"
  assert name == datasets.eval_set_name(tasks.make("subset_sum"), 1234, 4)
  first = datasets.load_eval_set(task, 1234, 4, str(tmp_path))
  source = tfds.data_source(name, split="test", data_dir=str(tmp_path))  # anyone can load it by name
  assert len(source) == 4 and source.dataset_info.metadata["knobs"]["num_numbers"] == 5
  assert [source[i]["prompt"].tolist() for i in range(4)] == first["prompt"].tolist()
  # Read back from disk: neither written nor generated again.
  monkeypatch.setattr(datasets, "write", lambda *a: pytest.fail("an existing eval set was rebuilt"))
  monkeypatch.setattr(datasets.tasks, "eval_problems", lambda *a: pytest.fail("the eval set was generated"))
  again = datasets.load_eval_set(task, 1234, 4, str(tmp_path))
  assert sorted(again) == sorted(first)
  for k, v in first.items():
    np.testing.assert_array_equal(again[k], v)


def test_eval_set_names_escape_what_tfds_does_not_take_by_code_point():
  # A TFDS config name holds letters, digits and _+-. only: arithmetic's ops '+-*' write '*' as _2a_
  # (its code point 0x2a), so that knob values differing only in such characters keep their own sets
  # (a bare '_' for each would give them one name, and one set).  The knobs are in sorted order.
  assert (datasets.eval_set_name(tasks.make("arithmetic"), 1234, 4)
          == "marl_eval_set/arithmetic-max_operand9-modulus10-num_ops2-ops+-_2a_-seed1234-n4:1.0.0")


def test_a_name_tfds_cannot_read_back_is_refused_before_anything_is_written(tmp_path):
  # TFDS itself writes 'a/b:c' (into nested directories), then cannot parse the name that reads it.
  with pytest.raises(ValueError, match=r"dataset config name 'a/b:c' may only hold letters, digits and _\+-\."):
    datasets.write(datasets.MarlTranscripts, "a/b:c", str(tmp_path), {"x": np.arange(3)}, {})
  assert not list(tmp_path.iterdir())


def test_unregistered_task_is_refused_with_its_name():
  class Custom(tasks.Arithmetic):
    pass
  with pytest.raises(ValueError, match="Custom is not a registered task"):
    datasets.eval_set_name(Custom(), 1234, 4)
