"""Debate (MAPoRL): `agents` K >= 2 answer independently (round 0), then for `rounds` rounds each reads
the others' latest answers and writes a revised one; the final answer is the majority of the last
round (`vote.majority`: ties to the earliest agent).  Visibility is per turn: in round j an agent reads
the problem, its own earlier answers and the round j-1 answers of the others; not their answers of the
same round (written before its own on the canvas) nor of older rounds.

Influence-aware rewards, scored by the task's checker (`scorer="checker"`) or by a verifier role
(`scorer="verifier"`): with c[j, i] = agent i's round-j answer is right (by the checker), or judged
right by the verifier, agent i's round-j turn earns::

    alpha * (c[j, i] - c[j-1, i])                    (j >= 1: it fixes / breaks its own answer)
  + beta * sum_{k != i} (c[j+1, k] - c[j, k])        (j < rounds: another agent's next answer, which
                                                      read this one, goes wrong -> right / right -> wrong)

i.e. +alpha for a fix, -alpha for a break, +beta per other agent that goes right after it, -beta per
one that goes wrong.  These are per-turn rewards (`Scored.turn_NxB`, turn n = j * K + i): the step adds
them to whatever the credit estimator gives the turn's tokens.  alpha = beta = 0 is plain co-training.

The verifier (role `verifier`, the last turn) reads the whole debate and writes one verdict per
answer, round-major (`<accept>` judges it right; anything else, an `<absent>` verifier included, wrong),
then EOS.  It judges; it does not answer: the final answer is still the majority, and the team outcome
still the checker's.  As in MAPoRL its scores are fixed during RL (experiments/debate.py freezes its
parameter set after the warm start, where it learns from the checker's verdicts, flipped at
`verifier_demo_error_rate`), so the debaters are rewarded for what a learned judge believes, not for
the truth; `fix_rate`, `break_rate` stay the checker's, and `verdict_accuracy`, `false_accept`,
`false_reject` say how far the two differ.

With the verifier, the debate has a judge: its verdicts on the last-round answers are the
judgments that rewards from peers (`config.reward.source=peer`) read, so each agent can be paid by the
verifier's verdict on its last answer instead of by the checker (the influence rewards already read
the verifier alone).

Per-role signals: an agent's last-round answer is right (also its `agentI/member_accuracy`); the verifier's, the fraction of its verdicts
that agree with the checker.  An `<absent>` answer (a counterfactual) counts as a wrong vote left out
of the majority; an `<absent>` verifier judges every answer wrong, so no turn earns a bonus.
"""
import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from marl_jax import checks, judging, text
from marl_jax.protocols import engine, vote

SCORERS = ("checker", "verifier")


@engine.register("debate")
@dataclasses.dataclass(frozen=True)
class Debate(engine.Protocol):
  agents: int = 3
  rounds: int = 1  # revision rounds after the independent answers
  alpha: float = 0.5  # reward for fixing one's own wrong answer (and penalty for breaking a right one)
  beta: float = 0.25  # reward per other agent whose next answer goes wrong -> right (penalty: -> wrong)
  scorer: str = "checker"  # what judges the answers for the influence rewards: SCORERS
  # Fraction of the warm start's verdicts that are flipped (scorer="verifier"): a good, imperfect judge.
  verifier_demo_error_rate: float = 0.1
  vote_key: Callable = vote.task_key_field()

  @classmethod
  def build(cls, task, agents: int = 3, rounds: int = 1, alpha: float = 0.5, beta: float = 0.25,
            scorer: str = "checker", **kwargs):
    if scorer not in SCORERS:
      raise ValueError(f"config.protocol.scorer={scorer!r} is unknown; allowed: {list(SCORERS)}")
    verifier = scorer == "verifier"
    vote.check_agents("agents", agents, len(text.ROLE_MARKERS) - verifier)
    checks.integer("protocol.rounds", rounds, 1, note="0 rounds is a vote")
    for key, value in (("alpha", alpha), ("beta", beta)):  # 0: no influence reward
      checks.number(f"protocol.{key}", value, 0)
    names = tuple(f"agent{i}" for i in range(agents))
    segment = lambda i, j: f"agent{i}{j}"  # agent i's round-j answer (the engine's segment name)
    turns = tuple(
        engine.Turn(names[i], task.answer_len, hidden=tuple(
            segment(k, r) for k in range(agents) for r in range(rounds + 1) if k != i and r != j - 1))
        for j in range(rounds + 1) for i in range(agents))
    if verifier:  # one verdict per answer of every round, then EOS
      names, turns = names + ("verifier",), turns + (engine.Turn("verifier", (rounds + 1) * agents + 1),)
    return cls(roles=names, turns=turns, agents=agents, rounds=rounds, alpha=alpha, beta=beta,
               scorer=scorer, vote_key=task.vote_key, **kwargs)

  @property
  def judge_roles(self) -> tuple[int, ...]:
    return (self.agents,) if self.scorer == "verifier" else ()

  def answers(self, layout, tokens_BxT):
    """answers_JxKxBxA: every agent's answer in every round (J = rounds + 1)."""
    K = self.agents
    return jnp.stack([jnp.stack([engine.message(layout, tokens_BxT, j * K + i) for i in range(K)])
                      for j in range(self.rounds + 1)])

  def verdicts(self, layout, tokens_BxT):
    """accepted_JxKxB: the verifier judged agent k's round-j answer right."""
    J, K = self.rounds + 1, self.agents
    verdict_BxN = engine.message(layout, tokens_BxT, J * K)[:, :J * K]
    return (verdict_BxN == text.ACCEPT).reshape(-1, J, K).transpose(1, 2, 0)

  def final_answer(self, layout, tokens_BxT):
    return vote.majority(self.answers(layout, tokens_BxT)[-1], self.vote_key)

  def rewards(self, task, layout, problems, tokens_BxT):
    score = jax.vmap(task.score)
    answers_JxKxBxA = self.answers(layout, tokens_BxT)
    J, K, B, _ = answers_JxKxBxA.shape
    right_JxKxB = jax.vmap(jax.vmap(score, (None, 0)), (None, 0))(problems, answers_JxKxBxA)
    majority_right_JxB = jnp.stack([score(problems, vote.majority(a, self.vote_key)) for a in answers_JxKxBxA])
    team_B = majority_right_JxB[-1]
    delta_J1xKxB, before_J1xKxB = right_JxKxB[1:] - right_JxKxB[:-1], right_JxKxB[:-1]
    judged_JxKxB, role_RxB, judged, judgments = right_JxKxB, right_JxKxB[-1], {}, None
    if self.scorer == "verifier":
      accepted_JxKxB, wrong_JxKxB = self.verdicts(layout, tokens_BxT), right_JxKxB == 0
      judgments = engine.Judgments(level_JxKxB=accepted_JxKxB[-1:].astype(jnp.int32), truth_KxB=right_JxKxB[-1],
                                   levels=(0.0, 1.0), answer_roles=tuple(range(K)))
      judged_JxKxB = accepted_JxKxB.astype(right_JxKxB.dtype)
      agree_B = (accepted_JxKxB != wrong_JxKxB).mean((0, 1))
      role_RxB = jnp.concatenate([role_RxB, agree_B[None]])
      judged = {"verdict_accuracy": agree_B.mean(),
                "false_accept": judging.rate(accepted_JxKxB, wrong_JxKxB),  # accepted among wrong answers
                "false_reject": judging.rate(~accepted_JxKxB, ~wrong_JxKxB)}  # rejected among right ones
    turn_NxB = influence_bonus(judged_JxKxB, self.alpha, self.beta).reshape(J * K, B)
    # The verifier's own turn (when there is one) earns no bonus.
    turn_NxB = jnp.concatenate([turn_NxB, jnp.zeros((len(layout.turn_roles) - J * K, B))])
    metrics = {
        "accuracy": team_B.mean(),
        "fix_rate": judging.rate(delta_J1xKxB > 0, before_J1xKxB == 0),  # revisions of wrong answers now right
        "break_rate": judging.rate(delta_J1xKxB < 0, before_J1xKxB > 0),  # revisions of right answers now wrong
        # Last-round answers that are one vote (the task's vote_key), as the majority counts them.
        "agreement": engine.same_message_rate(answers_JxKxBxA[-1], self.vote_key),
        "same_message_rate": engine.same_message_rate(answers_JxKxBxA[0]),  # independent messages
        "turn_bonus": turn_NxB[:J * K].mean(),  # per debater turn
        **{f"round{j}_accuracy": majority_right_JxB[j].mean() for j in range(J)},  # round j's majority
        **judged,
        # Each agent's last-round answer, the one its vote is: after reading the others.
        **engine.member_accuracy(self.roles[:K], right_JxKxB[-1]),
    }
    return engine.Scored(team_B=team_B, role_RxB=role_RxB, metrics=metrics, turn_NxB=turn_NxB,
                         judgments=judgments)

  def demonstrate(self, task, layout, problems, key_B):
    """Round 0: each agent's own (noisy) answer; every later round: each agent adopts the majority of
    the previous round, so the warm start reads the others and RL has to learn when not to follow.
    The verifier's verdicts are the checker's, each flipped at `verifier_demo_error_rate`."""
    if self.scorer == "verifier":  # (the checker's warm start draws as it did before verifiers)
      key_B, verdict_key_B = jax.vmap(jax.random.split, out_axes=1)(key_B)
    keys_KxB = jax.vmap(lambda k: jax.random.split(k, self.agents), out_axes=1)(key_B)
    answers_KxBxA = jnp.stack([jax.vmap(task.demonstrate)(problems, keys) for keys in keys_KxB])
    messages = list(answers_KxBxA)
    for _ in range(self.rounds):
      majority_BxA = vote.majority(answers_KxBxA, self.vote_key)
      answers_KxBxA = jnp.broadcast_to(majority_BxA, answers_KxBxA.shape)
      messages += list(answers_KxBxA)
    if self.scorer == "verifier":
      right_BxN = jnp.stack([jax.vmap(task.score)(problems, m) > 0 for m in messages], 1)
      flip_BxN = jax.vmap(lambda k: jax.random.bernoulli(k, self.verifier_demo_error_rate, right_BxN.shape[1:]))(
          verdict_key_B)
      verdict_BxN = jnp.where(right_BxN != flip_BxN, text.ACCEPT, text.REJECT)
      messages.append(jnp.concatenate([verdict_BxN, jnp.full_like(verdict_BxN[:, :1], text.EOS)], 1))
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
