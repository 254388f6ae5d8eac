"""Workflow registry: `config.protocol.name` selects one, the other `config.protocol` keys are its knobs."""
import inspect

from marl_jax.protocols.engine import Layout, Protocol, Turn
from marl_jax.protocols.exchange import Exchange
from marl_jax.protocols.matrix_game import MatrixGame
from marl_jax.protocols.orchestrator import Orchestrator
from marl_jax.protocols.relay import Relay
from marl_jax.protocols.single import Single
from marl_jax.protocols.solver_verifier import SolverVerifier

REGISTRY: dict[str, type[Protocol]] = {
    "exchange": Exchange,
    "matrix_game": MatrixGame,
    "orchestrator": Orchestrator,
    "relay": Relay,
    "single": Single,
    "solver_verifier": SolverVerifier,
}


def make(name: str, task, **kwargs) -> Protocol:
  if name not in REGISTRY:
    raise ValueError(f"config.protocol.name={name!r} is unknown; known protocols: {sorted(REGISTRY)}")
  cls = REGISTRY[name]
  allowed = {p for p in inspect.signature(cls.build).parameters if p not in ("task", "kwargs")}
  allowed |= {"hidden"} | {f for f in cls.__dataclass_fields__ if f not in ("roles", "turns")}
  unknown = sorted(set(kwargs) - allowed)
  if unknown:
    raise ValueError(f"config.protocol has keys {unknown} that protocol {name!r} does not take; "
                     f"allowed: {sorted(allowed)}")
  return cls.build(task, **kwargs)
