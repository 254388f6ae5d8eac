"""Task registry: `config.task.name` selects a task, the other `config.task` keys are its knobs.  Every
module here but `base` is one task, registered by existing (`registry.import_modules`)."""
import dataclasses

from marl_jax import registry
from marl_jax.tasks.base import REGISTRY, Task, check_rates, eval_problems, register

__all__ = ["REGISTRY", "Task", "check_rates", "eval_problems", "from_config", "knobs", "make", "register"]

registry.import_modules(__name__, __path__)


def knobs(name: str) -> dict:
  """A task's settings (its fields) and their defaults."""
  return REGISTRY.settings(name)


def make(name: str, **kwargs) -> Task:
  REGISTRY.refuse_unknown(name, kwargs, knobs(name))
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
