"""Exchange: a sender who reads one part of the problem writes a message; a receiver who reads the other
part and the message answers.  For tasks with a prompt segment `part_a` and, optionally, `part_b`: by
default `part_b` is hidden from the sender and `part_a` from the receiver, so information must flow
through the message.  Without `part_b` (signalling) the receiver reads nothing but the message: the
Lewis signalling game.  Both roles get the team reward: no per-role signal is verifiable without
fixing the code the two agree on.  The task's `message_metrics` of the sender's messages (signalling's
topographic similarity and mutual information) are logged with `accuracy`.
"""
import dataclasses

import jax
import jax.numpy as jnp

from marl_jax import checks, text
from marl_jax.protocols import engine

SENDER, RECEIVER = 0, 1  # role indices (each has one turn, in this order)


@engine.register("exchange")
@dataclasses.dataclass(frozen=True)
class Exchange(engine.Protocol):
  message_len: int = 0  # tokens the sender may write, EOS included; 0: len(part_a) + 1 (a full copy)

  @classmethod
  def build(cls, task, message_len: int = 0, **kwargs):
    segments = dict(task.prompt_segments)
    if "part_a" not in segments:
      raise ValueError(f"protocol 'exchange' needs a task with prompt segment 'part_a' (and optionally "
                       f"'part_b'); this task has {list(segments)}")
    checks.integer("protocol.message_len", message_len, 0, note="0: a full copy")
    message_len = message_len or segments["part_a"] + 1
    kwargs.setdefault("hidden", (("part_b", "sender"),) * ("part_b" in segments) + (("part_a", "receiver"),))
    turns = (engine.Turn("sender", message_len, vocab=task.message_vocab), engine.Turn("receiver", task.answer_len))
    return cls(roles=("sender", "receiver"), turns=turns, message_len=message_len, **kwargs)

  def final_answer(self, layout, tokens_BxT):
    return engine.message(layout, tokens_BxT, RECEIVER)

  def rewards(self, task, layout, problems, tokens_BxT):
    team_B = jax.vmap(task.score)(problems, self.final_answer(layout, tokens_BxT))
    message_BxM = engine.message(layout, tokens_BxT, SENDER)
    return engine.Scored(team_B=team_B, role_RxB=jnp.stack([team_B, team_B]),
                         metrics={"accuracy": team_B.mean(), **task.message_metrics(problems, message_BxM)})

  def demonstrate(self, task, layout, problems, key_B):
    """The sender copies its part (cut to the message length); the receiver gives a (noisy) answer."""
    names = [name for name, _ in task.prompt_segments]
    start = sum(n for _, n in task.prompt_segments[:names.index("part_a")])
    part_BxN = problems["prompt"][:, start:start + dict(task.prompt_segments)["part_a"]]
    B = part_BxN.shape[0]
    copy_BxM = jnp.concatenate([part_BxN, jnp.full((B, 1), text.EOS),
                                jnp.full((B, self.message_len), text.PAD)], 1)[:, :self.message_len]
    answers_BxA = jax.vmap(task.demonstrate)(problems, key_B)
    return engine.assemble(layout, problems["prompt"], [copy_BxM, answers_BxA])
