"""One agent answers the problem: single-agent RL, on the same engine as every team."""
import dataclasses

import jax

from marl_jax.protocols import engine


@engine.register("single")
@dataclasses.dataclass(frozen=True)
class Single(engine.Protocol):

  @classmethod
  def build(cls, task, **kwargs):
    return cls(roles=("agent",), turns=(engine.Turn("agent", task.answer_len),), **kwargs)

  def final_answer(self, layout, tokens_BxT):
    return engine.message(layout, tokens_BxT, 0)

  def rewards(self, task, layout, problems, tokens_BxT):
    team_B = jax.vmap(task.score)(problems, self.final_answer(layout, tokens_BxT))
    return engine.Scored(team_B=team_B, role_RxB=team_B[None],
                         metrics={"accuracy": team_B.mean(), **engine.member_accuracy(self.roles, team_B[None])})

  def demonstrate(self, task, layout, problems, key_B):
    answers_BxA = jax.vmap(task.demonstrate)(problems, key_B)
    return engine.assemble(layout, problems["prompt"], [answers_BxA])
