"""Task registry: `config.task.name` selects a task, the other `config.task` keys are its knobs."""
import dataclasses

from marl_jax import registry
from marl_jax.tasks.arithmetic import Arithmetic
from marl_jax.tasks.base import REGISTRY, Task, check_rates, eval_problems, register
from marl_jax.tasks.contribution import Contribution
from marl_jax.tasks.hidden_sum import HiddenSum
from marl_jax.tasks.matrix_game import MatrixGame
from marl_jax.tasks.multi_chain import MultiChain
from marl_jax.tasks.stack_program import StackProgram
from marl_jax.tasks.subset_sum import SubsetSum
from marl_jax.tasks.word_problems import WordProblems

__all__ = ["REGISTRY", "Arithmetic", "Contribution", "HiddenSum", "MatrixGame", "MultiChain", "StackProgram",
           "SubsetSum", "Task", "WordProblems", "check_rates", "eval_problems", "from_config", "knobs", "make",
           "register"]

registry.import_modules(__name__, __path__)


def knobs(name: str) -> dict:
  """A task's settings (its fields) and their defaults."""
  if name not in REGISTRY:
    raise ValueError(f"config.task.name={name!r} is unknown; known tasks: {sorted(REGISTRY)}")
  return {f.name: f.default for f in dataclasses.fields(REGISTRY[name])}


def make(name: str, **kwargs) -> Task:
  fields = knobs(name)
  unknown = sorted(set(kwargs) - set(fields))
  if unknown:
    raise ValueError(f"config.task has keys {unknown} that task {name!r} does not take; "
                     f"allowed: {sorted(fields)}")
  check_rates("task", kwargs)
  return REGISTRY[name](**kwargs)


def from_config(config) -> Task:
  """`config.task` as a task; a free-text one is posed through the tokenizer of the run's agent,
  `config.model.checkpoint` (without one, its `check` refuses it; roles on `config.models` entries
  that read another tokenizer are refused by `experiment.make_agents`)."""
  task = make(config.task.name, **{k: v for k, v in config.task.items() if k != "name"})
  if task.free_text:
    task = dataclasses.replace(task, tokenizer=config.model.checkpoint)
  return task
