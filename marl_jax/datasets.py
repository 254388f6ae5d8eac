"""Fixed evaluation sets, as tensorflow-datasets in array_record files (`array_records`), versioned,
one config per task, difficulty, seed and size::

  marl_eval_set/subset_sum-max_number9-num_numbers5-seed1234-n512:1.0.0

`load_eval_set` reads one, building it first when it does not exist; the problems are exactly those of
`tasks.eval_problems`, so a number measured on either names the same dataset.  `eval_set_in_words`
poses the same problems in words, for a checkpoint's tokenizer.
"""
import re

import jax
import numpy as np

from marl_jax import array_records, tasks, text, word_problem_sets
from marl_jax.tasks.arithmetic import Arithmetic


# ---------------------------------------------------------------------------------------------
# Fixed evaluation sets.


class MarlEvalSet(array_records.ArrayRows):
  """A fixed evaluation set of one marl_jax task: the problems `tasks.eval_problems` draws."""


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
  return f"{MarlEvalSet.name}/{eval_set_config(task, seed, size)}:{array_records.VERSION}"


def load_eval_set(task: tasks.Task, seed: int, size: int, data_dir: str) -> dict[str, np.ndarray]:
  """`tasks.eval_problems(task, seed, size)` as numpy arrays, read from data_dir (built if missing)."""
  config = eval_set_config(task, seed, size)
  if not array_records.exists(MarlEvalSet, config, data_dir):
    metadata = {"task": task_name(task), "knobs": task_knobs(task), "seed": seed, "size": size}
    problems = jax.device_get(tasks.eval_problems(task, seed, size))
    array_records.write(MarlEvalSet, config, data_dir, problems, metadata)
  return array_records.read(MarlEvalSet, config, data_dir)[0]


# ---------------------------------------------------------------------------------------------
# Evaluation sets in words, so that a real tokenizer can be posed the same problems.

_STEPS = {"+": "add {}", "-": "subtract {}", "*": "multiply by {}"}


def arithmetic_question(task: Arithmetic, problem: dict) -> tuple[str, str]:
  """One arithmetic problem (the arrays of `task.sample`) as a question in words, and its answer.

  The chain is told as steps, so its left-to-right order needs no brackets; the modulus is said with
  its range, so a negative intermediate (3 - 5) has one reading.
  """
  operands_ops = re.findall(r"\d+|[+\-*]", text.decode(problem["prompt"]))
  operands, ops = [int(x) for x in operands_ops[::2]], operands_ops[1::2]
  steps = [_STEPS[op].format(b) for op, b in zip(ops, operands[1:])]
  told = steps[0] if len(steps) == 1 else ", ".join(steps[:-1]) + ", then " + steps[-1]
  question = (f"Start with {operands[0]}, {told}, taking the result modulo {task.modulus} after each "
              f"step (so it stays between 0 and {task.modulus - 1}). What is the final result?")
  answer = text.decode(problem["answer"]).split(text.TOKENS[text.EOS])[0]
  return question, answer


_QUESTIONS = {"arithmetic": arithmetic_question}  # task name -> its problems in words


def eval_set_in_words(task: tasks.Task, seed: int, size: int) -> word_problem_sets.WordProblems:
  """The problems of the task's fixed evaluation set (`tasks.eval_problems`), posed in words."""
  if task.name not in _QUESTIONS:
    raise ValueError(f"task {task.name!r} has no word form; tasks with one: {sorted(_QUESTIONS)}")
  problems = jax.device_get(tasks.eval_problems(task, seed, size))
  pairs = [_QUESTIONS[task.name](task, {k: v[i] for k, v in problems.items()}) for i in range(size)]
  answers = tuple(a for _, a in pairs)
  return word_problem_sets.WordProblems(tuple(q for q, _ in pairs), answers, eval_set_name(task, seed, size),
                                    answers)
