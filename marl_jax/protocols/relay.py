"""Relay: a chain of agents.  Each agent but the last reads the prompt and every earlier message and
writes a message of `message_len` tokens; the last agent writes the final answer.  With one agent it
is the single-agent workflow; it is the throughput benchmark's job (`python -m marl_jax.tools.throughput`).
"""
import dataclasses

import jax
import jax.numpy as jnp

from marl_jax import checks, text
from marl_jax.protocols import engine


@engine.register("relay")
@dataclasses.dataclass(frozen=True)
class Relay(engine.Protocol):
  agents: int = 2
  message_len: int = 4
  answer_len: int = 4

  @classmethod
  def build(cls, task, agents: int = 2, message_len: int = 4, answer_len: int = 0, **kwargs):
    checks.integer("protocol.agents", agents, 1)
    checks.integer("protocol.message_len", message_len, 1)
    checks.check("protocol.answer_len", answer_len, lambda v: v == 0 or v >= task.answer_len,
                 f"0 (the task's answer length) or an integer >= {task.answer_len} (the task's)")
    answer_len = answer_len or task.answer_len
    roles = tuple(f"agent{i}" for i in range(agents))
    turns = tuple(engine.Turn(r, message_len) for r in roles[:-1]) + (engine.Turn(roles[-1], answer_len),)
    return cls(roles=roles, turns=turns, agents=agents, message_len=message_len,
               answer_len=answer_len, **kwargs)

  def final_answer(self, layout, tokens_BxT):
    return engine.message(layout, tokens_BxT, self.agents - 1)

  def rewards(self, task, layout, problems, tokens_BxT):
    # The answer slot may be longer than the task's answer; a right answer ends with EOS in time.
    answer_BxA = self.final_answer(layout, tokens_BxT)[:, :task.answer_len]
    team_B = jax.vmap(task.score)(problems, answer_BxA)
    role_RxB = jnp.broadcast_to(team_B, (self.agents,) + team_B.shape)
    return engine.Scored(team_B=team_B, role_RxB=role_RxB, metrics={"accuracy": team_B.mean()})

  def demonstrate(self, task, layout, problems, key_B):
    """Every agent passes on a (noisy) answer; the last one repeats what it was told."""
    answer_BxA = jax.vmap(task.demonstrate)(problems, key_B)
    fit = lambda x, n: jnp.pad(x, ((0, 0), (0, max(0, n - x.shape[1]))),
                               constant_values=text.PAD)[:, :n]
    messages = [fit(answer_BxA, self.message_len)] * (self.agents - 1) + [fit(answer_BxA, self.answer_len)]
    return engine.assemble(layout, problems["prompt"], messages)
