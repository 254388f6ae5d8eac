"""Debate (MAPoRL): `agents` K >= 2 answer independently (round 0), then for `rounds` rounds each reads
the others' latest answers and writes a revised one; the final answer is the majority of the last
round (`vote.majority`: ties to the earliest agent).  Visibility is per turn: in round j an agent reads
the problem, its own earlier answers and the round j-1 answers of the others; not their answers of the
same round (written before its own on the canvas) nor of older rounds.

Influence-aware rewards, scored by the task's checker: with c[j, i] = agent i's round-j answer is
right, agent i's round-j turn earns
    alpha * (c[j, i] - c[j-1, i])                    (j >= 1: it fixes / breaks its own answer)
  + beta * sum_{k != i} (c[j+1, k] - c[j, k])        (j < rounds: another agent's next answer, which
                                                      read this one, goes wrong -> right / right -> wrong)
i.e. +alpha for a fix, -alpha for a break, +beta per other agent that goes right after it, -beta per
one that goes wrong.  These are per-turn rewards (`Scored.turn_NxB`, turn n = j * K + i): the step adds
them to whatever the credit estimator gives the turn's tokens.  alpha = beta = 0 is plain co-training.

Per-role signals: an agent's last-round answer is right.  An `<absent>` answer (a counterfactual)
counts as a wrong vote left out of the majority.
"""
import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from marl_jax import text
from marl_jax.protocols import engine, vote


@dataclasses.dataclass(frozen=True)
class Debate(engine.Protocol):
  agents: int = 3
  rounds: int = 1  # revision rounds after the independent answers
  alpha: float = 0.5  # reward for fixing one's own wrong answer (and penalty for breaking a right one)
  beta: float = 0.25  # reward per other agent whose next answer goes wrong -> right (penalty: -> wrong)
  vote_key: Callable = vote.task_key_field()

  @classmethod
  def build(cls, task, agents: int = 3, rounds: int = 1, alpha: float = 0.5, beta: float = 0.25,
            **kwargs):
    vote.check_agents("agents", agents, len(text.ROLE_MARKERS))
    if rounds < 1:
      raise ValueError(f"config.protocol.rounds={rounds}; it must be >= 1 (0 rounds is a vote)")
    for key, value in (("alpha", alpha), ("beta", beta)):
      if value < 0:
        raise ValueError(f"config.protocol.{key}={value}; it must be >= 0 (0: no influence reward)")
    names = tuple(f"agent{i}" for i in range(agents))
    segment = lambda i, j: f"agent{i}{j}"  # agent i's round-j answer (the engine's segment name)
    turns = tuple(
        engine.Turn(names[i], task.answer_len, hidden=tuple(
            segment(k, r) for k in range(agents) for r in range(rounds + 1) if k != i and r != j - 1))
        for j in range(rounds + 1) for i in range(agents))
    return cls(roles=names, turns=turns, agents=agents, rounds=rounds, alpha=alpha, beta=beta,
               vote_key=task.vote_key, **kwargs)

  def answers(self, layout, tokens_BxT):
    """answers_JxKxBxA: every agent's answer in every round (J = rounds + 1)."""
    K = self.agents
    return jnp.stack([jnp.stack([engine.message(layout, tokens_BxT, j * K + i) for i in range(K)])
                      for j in range(self.rounds + 1)])

  def final_answer(self, layout, tokens_BxT):
    return vote.majority(self.answers(layout, tokens_BxT)[-1], self.vote_key)

  def rewards(self, task, layout, problems, tokens_BxT):
    score = jax.vmap(task.score)
    answers_JxKxBxA = self.answers(layout, tokens_BxT)
    J, K, B, _ = answers_JxKxBxA.shape
    right_JxKxB = jax.vmap(jax.vmap(score, (None, 0)), (None, 0))(problems, answers_JxKxBxA)
    majority_right_JxB = jnp.stack([score(problems, vote.majority(a, self.vote_key)) for a in answers_JxKxBxA])
    team_B = majority_right_JxB[-1]
    turn_NxB = influence_bonus(right_JxKxB, self.alpha, self.beta).reshape(J * K, B)
    delta_J1xKxB, before_J1xKxB = right_JxKxB[1:] - right_JxKxB[:-1], right_JxKxB[:-1]
    rate = lambda hits, among: jnp.sum(hits & among) / jnp.maximum(jnp.sum(among), 1)
    metrics = {
        "accuracy": team_B.mean(),
        "fix_rate": rate(delta_J1xKxB > 0, before_J1xKxB == 0),  # revisions of wrong answers now right
        "break_rate": rate(delta_J1xKxB < 0, before_J1xKxB > 0),  # revisions of right answers now wrong
        "agreement": engine.same_message_rate(answers_JxKxBxA[-1]),  # in the last round
        "same_message_rate": engine.same_message_rate(answers_JxKxBxA[0]),  # independent answers
        "turn_bonus": turn_NxB.mean(),
        **{f"round{j}_accuracy": majority_right_JxB[j].mean() for j in range(J)},  # round j's majority
    }
    return engine.Scored(team_B=team_B, role_RxB=right_JxKxB[-1], metrics=metrics, turn_NxB=turn_NxB)

  def demonstrate(self, task, layout, problems, key_B):
    """Round 0: each agent's own (noisy) answer; every later round: each agent adopts the majority of
    the previous round, so the warm start reads the others and RL has to learn when not to follow."""
    keys_KxB = jax.vmap(lambda k: jax.random.split(k, self.agents), out_axes=1)(key_B)
    answers_KxBxA = jnp.stack([jax.vmap(task.demonstrate)(problems, keys) for keys in keys_KxB])
    messages = list(answers_KxBxA)
    for _ in range(self.rounds):
      majority_BxA = vote.majority(answers_KxBxA, self.vote_key)
      answers_KxBxA = jnp.broadcast_to(majority_BxA, answers_KxBxA.shape)
      messages += list(answers_KxBxA)
    return engine.assemble(layout, problems["prompt"], messages)


def influence_bonus(right_JxKxB, alpha: float, beta: float):
  """bonus_JxKxB of agent k's round-j turn from the correctness c = right_JxKxB of every answer:
  alpha * (c[j, k] - c[j-1, k]) + beta * sum_{i != k} (c[j+1, i] - c[j, i]) (terms outside the rounds
  are 0)."""
  delta_J1xKxB = right_JxKxB[1:] - right_JxKxB[:-1]  # round j -> j+1, for j < J - 1
  zero_1xKxB = jnp.zeros_like(right_JxKxB[:1])
  own_JxKxB = jnp.concatenate([zero_1xKxB, delta_J1xKxB])
  others_J1xKxB = delta_J1xKxB.sum(1, keepdims=True) - delta_J1xKxB
  return alpha * own_JxKxB + beta * jnp.concatenate([others_J1xKxB, zero_1xKxB])
