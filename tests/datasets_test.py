"""TFDS evaluation sets, written to a temporary directory and read back (array_record files,
tfds.data_source and grain; no TensorFlow)."""
import re

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from marl_jax import array_records, datasets, tasks, text
from marl_jax.tasks.arithmetic import Arithmetic


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
  monkeypatch.setattr(array_records, "write", lambda *a: pytest.fail("an existing eval set was rebuilt"))
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
    array_records.write(datasets.MarlEvalSet, "a/b:c", str(tmp_path), {"x": np.arange(3)}, {})
  assert not list(tmp_path.iterdir())


def test_unregistered_task_is_refused_with_its_name():
  class Custom(Arithmetic):
    pass
  with pytest.raises(ValueError, match="Custom is not a registered task"):
    datasets.eval_set_name(Custom(), 1234, 4)


# ---------------------------------------------------------------------------------------------
# Evaluation sets in words.


def test_arithmetic_question_by_hand():
  task = Arithmetic(num_ops=3, max_operand=12, modulus=10)
  problem = {"prompt": np.array(text.encode("<bos>03+04*12-05=")),
             "answer": np.array(text.encode("1<eos><pad>"))}  # ((3 + 4) * 12 - 5) mod 10 = 1
  assert datasets.arithmetic_question(task, problem) == (
      "Start with 3, add 4, multiply by 12, then subtract 5, taking the result modulo 10 after each step "
      "(so it stays between 0 and 9). What is the final result?", "1")
  problem = {"prompt": np.array(text.encode("<bos>7*5=")), "answer": np.array(text.encode("5<eos>"))}
  assert datasets.arithmetic_question(Arithmetic(num_ops=1), problem)[0].startswith(
      "Start with 7, multiply by 5, taking")


def test_eval_set_in_words_poses_the_eval_set_in_words():
  task = Arithmetic(num_ops=2, modulus=7)
  problems = datasets.eval_set_in_words(task, seed=3, size=8)
  assert problems.source == datasets.eval_set_name(task, 3, 8)  # the same problems as that dataset
  # Each answer is what the question says, worked out from its words.
  for question, answer in zip(problems.questions, problems.answers):
    start, *steps = re.findall(r"(?:Start with|add|subtract|multiply by) \d+", question)
    modulus, top = map(int, re.search(r"modulo (\d+) after each step \(so it stays between 0 and (\d+)\)",
                                      question).groups())
    assert (modulus, top) == (7, 6), question
    value = int(start.split()[-1])
    for step in steps:
      verb, b = step.rsplit(" ", 1)
      value = {"add": value + int(b), "subtract": value - int(b), "multiply by": value * int(b)}[verb] % modulus
    assert answer == str(value), question
  with pytest.raises(ValueError, match=r"task 'subset_sum' has no word form; tasks with one: \['arithmetic'\]"):
    datasets.eval_set_in_words(tasks.make("subset_sum"), seed=3, size=2)
