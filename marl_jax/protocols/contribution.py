"""Contribution games (task `contribution`): one turn per role, in parallel.  Role r (`player{r}`) reads
the header and its own digit only, writes that digit and EOS, and reads no other role's message, so a
counterfactual re-run of one role holds every other role's message fixed (`Layout.resampled_turns`).

The team outcome is the task's game value of the success mask (under the problems' own game when they
carry one, `game_M`); each role's own signal is its success.
An `<absent>` (or unplayed) message is a failure: the role did nothing.
"""
import dataclasses

import jax
import jax.numpy as jnp

from marl_jax import text
from marl_jax.protocols import engine


@engine.register("contribution")
@dataclasses.dataclass(frozen=True)
class Contribution(engine.Protocol):

  @classmethod
  def build(cls, task, **kwargs):
    digits = [name for name, _ in task.prompt_segments if name.startswith("digit")]
    if not digits or digits != [f"digit{r}" for r in range(len(digits))] or not hasattr(task, "game_value"):
      raise ValueError(f"protocol 'contribution' needs a task with one prompt segment per role ('digit0', "
                       f"'digit1', ...) and a game_value (task 'contribution'); this task has segments "
                       f"{[name for name, _ in task.prompt_segments]}")
    players = tuple(f"player{r}" for r in range(len(digits)))
    kwargs.setdefault("hidden", tuple(
        (segment, player) for r, player in enumerate(players)
        for j in range(len(players)) if j != r for segment in (digits[j], f"{players[j]}0")))
    return cls(roles=players, turns=tuple(engine.Turn(p, 2) for p in players), **kwargs)

  def final_answer(self, layout, tokens_BxT):
    """The joint answer: each role's first token, in role order, then EOS."""
    firsts = [engine.message(layout, tokens_BxT, r)[:, :1] for r in range(len(self.roles))]
    return jnp.concatenate(firsts + [jnp.full_like(firsts[0], text.EOS)], 1)

  def rewards(self, task, layout, problems, tokens_BxT):
    success_BxR = jax.vmap(task.success)(problems, self.final_answer(layout, tokens_BxT))
    team_B = jax.vmap(task.game_value)(success_BxR, problems.get("game_M"))
    metrics = {"accuracy": team_B.mean(), "success_rate": success_BxR.mean()}
    return engine.Scored(team_B=team_B, role_RxB=success_BxR.T.astype(jnp.float32), metrics=metrics)

  def demonstrate(self, task, layout, problems, key_B):
    """Each role writes its digit (wrong independently at the task's `demo_error_rate`), then EOS."""
    answers_BxA = jax.vmap(task.demonstrate)(problems, key_B)
    eos_Bx1 = jnp.full_like(answers_BxA[:, :1], text.EOS)
    return engine.assemble(layout, problems["prompt"], [
        jnp.concatenate([answers_BxA[:, r:r + 1], eos_Bx1], 1) for r in range(len(self.roles))])
