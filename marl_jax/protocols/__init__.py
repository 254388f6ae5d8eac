"""Workflow registry: `config.protocol.name` selects one, the other `config.protocol` keys are its knobs."""
import dataclasses
import inspect

from marl_jax import tasks
from marl_jax.protocols.best_of_n import BestOfN
from marl_jax.protocols.contribution import Contribution
from marl_jax.protocols.debate import Debate
from marl_jax.protocols.delegate import Delegate
from marl_jax.protocols.engine import Layout, Protocol, Scored, Turn
from marl_jax.protocols.exchange import Exchange
from marl_jax.protocols.matrix_game import MatrixGame
from marl_jax.protocols.orchestrator import Orchestrator
from marl_jax.protocols.relay import Relay
from marl_jax.protocols.single import Single
from marl_jax.protocols.solver_verifier import SolverVerifier
from marl_jax.protocols.vote import Vote

REGISTRY: dict[str, type[Protocol]] = {
    "best_of_n": BestOfN,
    "contribution": Contribution,
    "debate": Debate,
    "delegate": Delegate,
    "exchange": Exchange,
    "matrix_game": MatrixGame,
    "orchestrator": Orchestrator,
    "relay": Relay,
    "single": Single,
    "solver_verifier": SolverVerifier,
    "vote": Vote,
}


def _check_name(name: str) -> type[Protocol]:
  if name not in REGISTRY:
    raise ValueError(f"config.protocol.name={name!r} is unknown; known protocols: {sorted(REGISTRY)}")
  return REGISTRY[name]


def knobs(name: str) -> dict:
  """A protocol's settable fields and their defaults (the schedule and visibility come from `build`)."""
  return {f.name: f.default for f in dataclasses.fields(_check_name(name))
          if f.name not in ("roles", "turns", "hidden") and f.metadata.get("knob", True)}


def defaults(name: str) -> dict:
  """Every setting of workflow `name` that has a default, at it: its knobs and `build`'s arguments."""
  build = inspect.signature(_check_name(name).build).parameters.values()
  return {**knobs(name), **{p.name: p.default for p in build if p.default is not inspect.Parameter.empty}}


def make(name: str, task, **kwargs) -> Protocol:
  cls = _check_name(name)
  allowed = {p for p in inspect.signature(cls.build).parameters if p not in ("task", "kwargs")}
  allowed |= {"hidden"} | set(knobs(name))
  unknown = sorted(set(kwargs) - allowed)
  if unknown:
    raise ValueError(f"config.protocol has keys {unknown} that protocol {name!r} does not take; "
                     f"allowed: {sorted(allowed)}")
  tasks.check_rates("protocol", kwargs)
  return cls.build(task, **kwargs)
