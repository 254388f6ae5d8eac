"""Vote: `voters` K >= 2 solvers answer the same problem in parallel (none reads another's answer); the
final answer is the majority over their answers (compared up to the first EOS; `<absent>` votes do
not count).  Ties go to the answer of the earliest voter among the tied answers (voter0 before
voter1, ...).  With `aggregator=True` an extra role reads all K answers and writes the final answer (an
absent aggregator leaves the majority).  Roles `voter0..voterK-1` (+ `aggregator`), so a role map
such as `--config.roles.sharing=0,0,0,1` gives three voters one parameter set and the aggregator its own.

Per-role signals (and `voterI/member_accuracy`): a voter's own answer is right; the aggregator gets the team outcome.
"""
import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from marl_jax import checks, text
from marl_jax.protocols import engine
from marl_jax.tasks.base import canonical


def majority(answers_KxBxA, key=canonical):
  """Each row's most common answer over K voters, `<absent>` ones left out: final_BxA.  Answers with
  equal `key`s are one answer (a task's `vote_key`: by default the tokens up to EOS).  Ties go to the
  answer the earliest voter among the tied answers wrote; with no vote left, voter0's message."""
  valid_KxB = answers_KxBxA[:, :, 0] != text.ABSENT
  same_KxKxB = engine.same_messages(answers_KxBxA, key) & valid_KxB[None]
  votes_KxB = jnp.where(valid_KxB, same_KxKxB.sum(1), -1)
  winner_B = jnp.argmax(votes_KxB, 0)  # the first index of the largest count: the tie rule
  return jnp.take_along_axis(answers_KxBxA, winner_B[None, :, None], 0)[0]


def check_agents(key: str, count: int, most: int) -> None:
  """K parallel agents: at least 2, and no more than the role markers (`most` after the other roles)."""
  checks.integer(f"protocol.{key}", count, 2, most,
                 note=f"each role needs one of the {len(text.ROLE_MARKERS)} role markers")


def parallel(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
  """`hidden` entries so that none of these roles reads another's (first) message: parallel agents."""
  return tuple((f"{other}0", name) for name in names for other in names if other != name)


def check_switch(key: str, value) -> None:
  if value not in (False, True):
    raise ValueError(f"config.protocol.{key}={value!r} is unknown; allowed: [False, True]")


def task_key_field():
  """A protocol field (not a knob) holding the task's `vote_key`, set by `build`."""
  return dataclasses.field(default=canonical, repr=False, metadata={"knob": False})


@engine.register("vote")
@dataclasses.dataclass(frozen=True)
class Vote(engine.Protocol):
  voters: int = 3
  aggregator: bool = False
  vote_key: Callable = task_key_field()

  @classmethod
  def build(cls, task, voters: int = 3, aggregator: bool = False, **kwargs):
    check_switch("aggregator", aggregator)
    check_agents("voters", voters, len(text.ROLE_MARKERS) - aggregator)
    names = tuple(f"voter{i}" for i in range(voters))
    kwargs.setdefault("hidden", parallel(names))
    turns = tuple(engine.Turn(v, task.answer_len) for v in names)
    if aggregator:
      names, turns = names + ("aggregator",), turns + (engine.Turn("aggregator", task.answer_len),)
    return cls(roles=names, turns=turns, voters=voters, aggregator=aggregator, vote_key=task.vote_key,
               **kwargs)

  def answers(self, layout, tokens_BxT):
    return jnp.stack([engine.message(layout, tokens_BxT, i) for i in range(self.voters)])

  def final_answer(self, layout, tokens_BxT):
    majority_BxA = majority(self.answers(layout, tokens_BxT), self.vote_key)
    if not self.aggregator:
      return majority_BxA
    aggregate_BxA = engine.message(layout, tokens_BxT, self.voters)
    return jnp.where(aggregate_BxA[:, :1] == text.ABSENT, majority_BxA, aggregate_BxA)

  def rewards(self, task, layout, problems, tokens_BxT):
    score = jax.vmap(task.score)
    answers_KxBxA = self.answers(layout, tokens_BxT)
    team_B = score(problems, self.final_answer(layout, tokens_BxT))
    voter_KxB = jnp.stack([score(problems, a) for a in answers_KxBxA])
    agreement = engine.same_message_rate(answers_KxBxA)
    metrics = {
        "accuracy": team_B.mean(),
        "voter_accuracy": voter_KxB.mean(),
        "majority_right": score(problems, majority(answers_KxBxA, self.vote_key)).mean(),
        "agreement": agreement,  # voter pairs writing the same answer: here also the collapse rate
        "same_message_rate": agreement,
        **engine.member_accuracy(self.roles[:self.voters], voter_KxB),  # voter_accuracy's terms
    }
    role_RxB = jnp.concatenate([voter_KxB, team_B[None]] if self.aggregator else [voter_KxB])
    return engine.Scored(team_B=team_B, role_RxB=role_RxB, metrics=metrics)

  def demonstrate(self, task, layout, problems, key_B):
    """Each voter gives its own (noisy) answer; the aggregator writes their majority."""
    keys_KxB = jax.vmap(lambda k: jax.random.split(k, self.voters), out_axes=1)(key_B)
    answers_KxBxA = jnp.stack([jax.vmap(task.demonstrate)(problems, keys) for keys in keys_KxB])
    messages = list(answers_KxBxA) + ([majority(answers_KxBxA, self.vote_key)] if self.aggregator else [])
    return engine.assemble(layout, problems["prompt"], messages)
