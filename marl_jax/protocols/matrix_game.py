"""Simultaneous play of a two-player cooperative game (the `matrix_game` task): the row and the column
player each write one action token (then EOS); by default neither reads the other's message.  The joint
action is scored by the task; the team reward (the normalised payoff) is also each role's reward.
"""
import dataclasses

import jax
import jax.numpy as jnp

from marl_jax import text
from marl_jax.protocols import engine

ROW, COLUMN = 0, 1


@engine.register("matrix_game")
@dataclasses.dataclass(frozen=True)
class MatrixGame(engine.Protocol):

  @classmethod
  def build(cls, task, **kwargs):
    if not hasattr(task, "payoffs") or task.answer_len != 3:
      raise ValueError("protocol 'matrix_game' needs a task whose answer is a joint action of two "
                       "action tokens and EOS, with a payoff table (task 'matrix_game')")
    kwargs.setdefault("hidden", (("row0", "column"), ("column0", "row")))
    turns = (engine.Turn("row", 2), engine.Turn("column", 2))
    return cls(roles=("row", "column"), turns=turns, **kwargs)

  def final_answer(self, layout, tokens_BxT):
    """The joint action: each player's first token, then EOS."""
    row_Bx1 = engine.message(layout, tokens_BxT, ROW)[:, :1]
    column_Bx1 = engine.message(layout, tokens_BxT, COLUMN)[:, :1]
    return jnp.concatenate([row_Bx1, column_Bx1, jnp.full_like(row_Bx1, text.EOS)], 1)

  def rewards(self, task, layout, problems, tokens_BxT):
    team_B = jax.vmap(task.score)(problems, self.final_answer(layout, tokens_BxT))
    table = task.payoffs()
    metrics = {
        "accuracy": team_B.mean(),
        "optimal": (team_B == 1.0).mean(),  # the joint action reaches the table's maximum
        "payoff": (table.min() + team_B * (table.max() - table.min())).mean(),  # in the table's units
    }
    return engine.Scored(team_B=team_B, role_RxB=jnp.stack([team_B, team_B]),
                         metrics=metrics)

  def demonstrate(self, task, layout, problems, key_B):
    answers_BxA = jax.vmap(task.demonstrate)(problems, key_B)
    eos_Bx1 = jnp.full_like(answers_BxA[:, :1], text.EOS)
    return engine.assemble(layout, problems["prompt"], [
        jnp.concatenate([answers_BxA[:, i:i + 1], eos_Bx1], 1) for i in (ROW, COLUMN)])
