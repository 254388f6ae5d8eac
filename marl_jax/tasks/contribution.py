"""Contribution games: credit whose true value is known exactly.  Each of `num_roles` roles reads its own
hidden digit and must copy it; which roles succeeded decides the team outcome through a game.

The prompt is `<bos>` then one digit per role, each its own segment (`digit0`, `digit1`, ...), so a
protocol can hide every digit but its own from each role (protocol `contribution`).  The answer is the
digits in role order, then EOS.  With m_r = 1 when role r wrote its digit (the first token of its
message, or position r of a joint answer), the team outcome is `game_value(m)`, in [0, 1] with
v(nobody) = 0 and v(best) = 1::

  additive:    mean_r m_r
  synergy:     prod_r m_r                          (all must succeed)
  redundancy:  max_r m_r                           (any one suffices)
  free_rider:  mean_{r != f} m_r                   (role f = free_rider_index has no effect)
  saboteur:    mean_{r != s} m_r * (1 - m_s)       (role s = saboteur_index's success hurts the team)
  weighted:    sum_r w_r m_r, w_r = (r + 1) / sum_j (j + 1)

The exact Shapley value and the exact expected difference credit of each role follow from `game_value`
and the success mask (`marl_jax.credit.exact`).
"""
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import checks, text
from marl_jax.tasks import base

GAMES = ("additive", "synergy", "redundancy", "free_rider", "saboteur", "weighted")
MAX_ROLES = len(text.ROLE_MARKERS)  # one role marker per role


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)  # by name only: the base's demo_error_rate comes first
class Contribution(base.Task):
  name: ClassVar[str] = "contribution"
  num_roles: int = 3
  game: str = "additive"
  free_rider_index: int = 0
  saboteur_index: int = 0
  demo_error_rate: float = 0.4  # each role's digit is wrong independently at this rate

  def __post_init__(self):
    checks.integer("task.num_roles", self.num_roles, 2, MAX_ROLES)
    if self.game not in GAMES:
      raise ValueError(f"config.task.game={self.game!r} is unknown; allowed: {list(GAMES)}")
    for key in ("free_rider_index", "saboteur_index"):
      checks.integer(f"task.{key}", getattr(self, key), 0, self.num_roles - 1,
                     note=f"a role index; config.task.num_roles={self.num_roles}")

  @property
  def prompt_segments(self) -> tuple[tuple[str, int], ...]:
    return (("header", 1),) + tuple((f"digit{r}", 1) for r in range(self.num_roles))

  @property
  def prompt_len(self) -> int:
    return 1 + self.num_roles

  @property
  def answer_len(self) -> int:
    return self.num_roles + 1

  def weights(self) -> np.ndarray:
    """Each role's weight in the linear part of the game (additive, free_rider, saboteur, weighted)."""
    R = self.num_roles
    if self.game == "weighted":
      return np.arange(1, R + 1) / (R * (R + 1) / 2)
    ignored = {"free_rider": self.free_rider_index, "saboteur": self.saboteur_index}.get(self.game)
    counted = np.arange(R) != ignored
    return counted / counted.sum()

  def game_values(self) -> np.ndarray:
    """The game as data, values_M: the team outcome of every success mask m of the M = 2^R masks
    (role r succeeded iff bit r of m is set); see the module doc."""
    m_MxR = (np.arange(2 ** self.num_roles)[:, None] >> np.arange(self.num_roles)) & 1
    if self.game == "synergy":
      return m_MxR.prod(1).astype(np.float32)
    if self.game == "redundancy":
      return m_MxR.max(1).astype(np.float32)
    value_M = m_MxR @ self.weights()
    if self.game == "saboteur":
      value_M = value_M * (1 - m_MxR[:, self.saboteur_index])
    return value_M.astype(np.float32)

  def game_value(self, success_R, values_M=None) -> jax.Array:
    """Team outcome in [0, 1] of a success mask (bool or 0/1 of shape [num_roles]) under the task's
    game, or under `values_M` (a game given as data, as `game_values` builds it): a problem that
    carries `game_M` is scored under its own game, so one compiled program can play every game on
    the same episodes (the credit benchmark does)."""
    values_M = self.game_values() if values_M is None else values_M
    index = jnp.dot(jnp.asarray(success_R, jnp.int32), 2 ** jnp.arange(self.num_roles))
    return jnp.asarray(values_M, jnp.float32)[index]

  def success(self, problem: dict, message_A) -> jax.Array:
    """Which roles' digits a joint answer (one token per role, then EOS) copies right: bool[R]."""
    return message_A[:self.num_roles] == problem["answer"][:self.num_roles]

  def score(self, problem: dict, message_A) -> jax.Array:
    return self.game_value(self.success(problem, message_A), problem.get("game_M"))

  def sample(self, key) -> dict:
    digits_R = jax.random.randint(key, (self.num_roles,), 0, 10)
    eos = jnp.array([text.EOS])
    return {
        "prompt": jnp.concatenate([jnp.array([text.BOS]), text.DIGIT0 + digits_R]).astype(jnp.int32),
        "answer": jnp.concatenate([text.DIGIT0 + digits_R, eos]).astype(jnp.int32),
        # The systematic mistake: the next digit (mod 10).
        "mistake": jnp.concatenate([text.DIGIT0 + (digits_R + 1) % 10, eos]).astype(jnp.int32),
    }

  def wrong_answer(self, problem: dict, key) -> jax.Array:
    del key
    return problem["mistake"]

  def demonstrate(self, problem: dict, key) -> jax.Array:
    """Each role's digit is its systematic mistake independently at `demo_error_rate`."""
    wrong_A = jnp.arange(self.answer_len) < self.num_roles
    wrong_A &= jax.random.bernoulli(key, self.demo_error_rate, (self.answer_len,))
    return jnp.where(wrong_A, problem["mistake"], problem["answer"])
