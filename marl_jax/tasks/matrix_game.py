"""Cooperative 3x3 matrix games, the classic credit-assignment tests (Claus & Boutilier 1998; Kapetanakis
& Kudenko 2002; Rashid et al. 2018): climbing, penalty (miscoordination payoff `k`) and non-monotonic.

The prompt names the game (`<bos>c`, `p` or `n`); the answer is a joint action, the row's and the
column's action ('0'-'2') then EOS.  Reward: the payoff normalised to [0, 1] by the table's range,
(payoff - min) / (max - min), so the optimum scores 1 and the worst cell (or a malformed action) 0.
`payoffs()` gives the exact table, so credit estimators can be graded against exact values.
"""
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import checks, text
from marl_jax.tasks import base

GAMES = ("climbing", "penalty", "nonmonotonic")


@base.register
@dataclasses.dataclass(frozen=True, kw_only=True)  # by name only: the base's demo_error_rate comes first
class MatrixGame(base.Task):
  name: ClassVar[str] = "matrix_game"
  game: str = "climbing"
  k: float = -100.0  # the penalty game's miscoordination payoff
  demo_error_rate: float = 0.6

  def __post_init__(self):
    if self.game not in GAMES:
      raise ValueError(f"config.task.game={self.game!r} is unknown; allowed: {list(GAMES)}")
    checks.check("task.k", self.k, lambda k: True, "a finite number")  # a NaN payoff: NaN rewards

  def payoffs(self) -> np.ndarray:
    """The team payoff of (row action, column action): float32[3, 3]."""
    k = self.k
    table = {"climbing": [[11, -30, 0], [-30, 7, 6], [0, 0, 5]],
             "penalty": [[10, 0, k], [0, 2, 0], [k, 0, 10]],
             "nonmonotonic": [[8, -12, -12], [-12, 0, 0], [-12, 0, 0]]}[self.game]
    return np.asarray(table, np.float32)

  def normalised_payoffs(self) -> np.ndarray:
    table = self.payoffs()
    return (table - table.min()) / (table.max() - table.min())

  @property
  def prompt_len(self) -> int:
    return 2

  @property
  def answer_len(self) -> int:
    return 3

  def joint_action_tokens(self, row, column):
    return jnp.array([text.DIGIT0 + row, text.DIGIT0 + column, text.EOS], jnp.int32)

  def sample(self, key) -> dict:
    del key  # one fixed game: every problem is the same
    table = self.payoffs()
    best = np.unravel_index(np.argmax(table), table.shape)
    # The systematic mistake: each player's best response to a uniformly random partner (relative
    # overgeneralisation, the failure these games were designed to expose).
    overgeneralised = table.mean(1).argmax(), table.mean(0).argmax()
    return {
        "prompt": jnp.array([text.BOS, text.TOKEN_ID[self.game[0]]], jnp.int32),
        "answer": self.joint_action_tokens(*best),
        "mistake": self.joint_action_tokens(*overgeneralised),
    }

  def score(self, problem: dict, message_A) -> jax.Array:
    """Normalised payoff of the joint action in the first two tokens; 0 if either is not an action."""
    actions_2 = message_A[:2] - text.DIGIT0
    valid = jnp.all((actions_2 >= 0) & (actions_2 < 3))
    value = jnp.asarray(self.normalised_payoffs())[actions_2[0] % 3, actions_2[1] % 3]
    return jnp.where(valid, value, 0.0)

  def wrong_answer(self, problem: dict, key) -> jax.Array:
    del key
    return problem["mistake"]
