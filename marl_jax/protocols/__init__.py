"""Workflow registry: `config.protocol.name` selects one, the other `config.protocol` keys are its knobs."""
import dataclasses
import inspect

from marl_jax import registry, tasks
from marl_jax.protocols.engine import REGISTRY, Layout, Protocol, Scored, Turn, register

__all__ = ["REGISTRY", "Layout", "Protocol", "Scored", "Turn", "defaults", "knobs", "make", "register"]

registry.import_modules(__name__, __path__)


def knobs(name: str) -> dict:
  """A protocol's settable fields and their defaults (the schedule and visibility come from `build`)."""
  return {f.name: f.default for f in dataclasses.fields(REGISTRY.lookup(name))
          if f.name not in ("roles", "turns", "hidden") and f.metadata.get("knob", True)}


def defaults(name: str) -> dict:
  """Every setting of workflow `name` that has a default, at it: its knobs and `build`'s arguments."""
  build = inspect.signature(REGISTRY.lookup(name).build).parameters.values()
  return {**knobs(name), **{p.name: p.default for p in build if p.default is not inspect.Parameter.empty}}


def make(name: str, task, **kwargs) -> Protocol:
  cls = REGISTRY.lookup(name)
  allowed = {p for p in inspect.signature(cls.build).parameters if p not in ("task", "kwargs")}
  REGISTRY.refuse_unknown(name, kwargs, allowed | {"hidden"} | set(knobs(name)))
  tasks.check_rates("protocol", kwargs)
  return cls.build(task, **kwargs)
