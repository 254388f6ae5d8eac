"""What every credit estimator provides, and what it receives.

An estimator is a frozen dataclass whose fields are its settings (`config.credit.KEY`), registered by
name with `@register("name")`.  In the step it:

  1. declares, statically, the counterfactual re-runs it needs (`reruns`): which coalitions of roles
     get their messages changed, how (`Reruns.MODES`) and how many times (K);
  2. receives this device's rows of the scored batch (`Outcome`) and what the re-runs gave
     (`Counterfactuals`: the re-drawn transcripts and their team outcomes; None without re-runs), and
     returns advantages (per role, adv_RxB; or per turn, adv_NxB when `per_turn`) plus its own
     metrics (a scalar, or an R-vector logged as `ROLE/NAME`);
  3. if it learns (a critic, a moving baseline), keeps its state in `TrainState.credit` through
     `init(key, layout)` (its own PRNG key, and the canvas layout: roles, length) and `update`;
     `update` runs inside the sharded step, on this device's rows, so batch statistics and gradients
     are averaged over devices with `parallel.mean_over_devices`.

The step never names an estimator: a new one is one file in `credit/` and its test.
"""
import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import flax
import jax

from marl_jax import registry
from marl_jax.credit import baselines

if TYPE_CHECKING:  # the hint alone: importing the engine at run time would load every workflow and task
  from marl_jax.protocols import engine

REGISTRY = registry.Registry("credit.name", "estimator")
register = REGISTRY.register


@flax.struct.dataclass
class Outcome:
  """Scored episodes, this device's rows; rows b*G .. b*G+G-1 share a problem."""
  tokens_BxT: jax.Array  # the transcripts
  team_B: jax.Array  # team outcome
  role_RxB: jax.Array  # each role's own verifiable signal
  group_size: int = flax.struct.field(pytree_node=False)
  # The protocol's per-turn reward (`Scored.turn_NxB`, debate's influence bonuses) or None.  The step
  # adds it to the advantages of each turn's tokens whatever the estimator returns, so an estimator
  # reads it only to report on it, never adds it itself.
  turn_NxB: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Reruns:
  """Counterfactual re-runs of the batch: coalition c changes the messages of the roles where
  `changed_CxR[c]` is True, K = `samples` times.  Modes: `resample` re-draws them from their policies
  and re-samples the later turns that can react; `absent` replaces them with `<absent>` and
  re-samples those turns too; `replace` re-draws them and keeps every other turn as it was."""
  changed_CxR: tuple[tuple[bool, ...], ...]
  mode: str = "resample"
  samples: int = 1

  MODES: ClassVar[tuple[str, ...]] = ("resample", "absent", "replace")


@flax.struct.dataclass
class Counterfactuals:
  """What the re-runs gave, this device's rows: coalition c's k-th re-drawn transcript of row b and
  its team outcome.  Under jit, what an estimator does not read is not computed."""
  tokens_CxKxBxT: jax.Array
  team_CxKxB: jax.Array


@dataclasses.dataclass(frozen=True)
class Estimator:
  per_turn: ClassVar[bool] = False  # advantages per turn (adv_NxB) instead of per role (adv_RxB)

  def check(self, num_roles: int, group_size: int) -> None:
    """Raises a ValueError naming `config.credit.KEY` when a setting cannot work with this run."""

  @property
  def role_rewards(self) -> bool:
    """Whether each role's advantage comes from its own reward (`Outcome.role_RxB`), not the team's:
    what a judge's payment rule needs (`marl_jax.rewards`)."""
    return False

  def reruns(self, num_roles: int) -> Reruns | None:
    return None

  def init(self, key: jax.Array, layout: "engine.Layout") -> Any:
    return ()

  def advantages(self, state, outcome: Outcome, counterfactuals: Counterfactuals | None
                 ) -> tuple[jax.Array, dict]:
    raise NotImplementedError

  def update(self, state, outcome: Outcome) -> tuple[Any, dict]:
    return state, {}


def check_baseline(baseline: str, group_size: int, whole_advantage: bool = True) -> None:
  """The group-baseline setting most estimators share (`config.credit.baseline`); `whole_advantage`:
  the baselined term is the whole advantage (not an outcome term beside a credit term)."""
  if baseline not in baselines.BASELINES:
    raise ValueError(f"config.credit.baseline={baseline!r} is unknown; allowed: {list(baselines.BASELINES)}")
  if baseline == "rloo" and group_size < 2:
    raise ValueError("config.credit.baseline='rloo' needs config.rl.group_size >= 2")
  # A group of one is its own baseline: every advantage 0.
  if whole_advantage and baseline != "none" and group_size < 2:
    raise ValueError(f"config.credit.baseline={baseline!r} needs config.rl.group_size >= 2 (a group of one "
                     f"sample has advantage 0); allowed with group_size 1: 'none'")


