"""Solver-verifier (Eval-Opt): the solver answers; the verifier reads problem and answer and writes
ACCEPT (the episode ends, the answer stands) or REJECT followed by a revised answer.  Up to `rounds`
rounds; in a later round the solver sees the rejection and answers again.  Final answer: the first
accepted solver answer, else the last verifier revision.  An `<absent>` verdict (the counterfactual
"no verifier") lets the answer stand.

The verifier judges: its first verdict on the solver's first answer is its judgment (confidence
vocabulary (0, 1): REJECT or ACCEPT), which rewards from peers (`config.reward.source=peer`) read.

The verifier's own signal (what per-role credit pays it, `verifier_signal`): `verdict`, the share of
its verdicts that were right; or `final`, the task's score of the final answer, which its message
decides given the solver's answer (the answer it lets stand, or its revision).  Under `verdict` its
revision is paid by the verdict before it, never by its own correctness.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import checks, judging, text
from marl_jax.protocols import engine

SOLVER, VERIFIER = 0, 1
VERIFIER_SIGNALS = ("verdict", "final")


@engine.register("solver_verifier")
@dataclasses.dataclass(frozen=True)
class SolverVerifier(engine.Protocol):
  rounds: int = 1
  # Fraction of warm-start verdicts that are flipped: keeps the base verifier weak but not random.
  verifier_demo_error_rate: float = 0.2
  verifier_signal: str = "verdict"  # one of VERIFIER_SIGNALS: see the module's docstring
  judge_roles = (VERIFIER,)

  @classmethod
  def build(cls, task, rounds: int = 1, **kwargs):
    checks.integer("protocol.rounds", rounds, 1)
    A = task.answer_len
    turns = []
    for _ in range(rounds):
      turns += [engine.Turn("solver", A), engine.Turn("verifier", 1 + A, ends_episode_on=(text.ACCEPT,))]
    signal = kwargs.get("verifier_signal", cls.verifier_signal)
    if signal not in VERIFIER_SIGNALS:
      raise ValueError(f"config.protocol.verifier_signal={signal!r} is unknown; allowed: {list(VERIFIER_SIGNALS)}")
    return cls(roles=("solver", "verifier"), turns=tuple(turns), rounds=rounds, **kwargs)

  def verdict_readout(self, layout):
    """The judgment is the first token of the first verdict, REJECT (level 0) or ACCEPT (level 1), on
    the solver's first answer (turn 0)."""
    return engine.VerdictReadout(np.array([[layout.turn_slices[1][0]]]), (text.REJECT, text.ACCEPT), (0.0, 1.0),
                                 answer_turn_K=(0,))

  def _rounds(self, layout, tokens_BxT):
    answers = [engine.message(layout, tokens_BxT, 2 * k) for k in range(self.rounds)]
    verdicts = [engine.message(layout, tokens_BxT, 2 * k + 1) for k in range(self.rounds)]
    return answers, verdicts

  def final_answer(self, layout, tokens_BxT):
    answers, verdicts = self._rounds(layout, tokens_BxT)
    final_BxA = verdicts[-1][:, 1:]
    for answer_BxA, verdict_BxL in reversed(list(zip(answers, verdicts))):
      # An absent verifier (a counterfactual) checks nothing: the answer stands, as if accepted.
      stands_Bx1 = (verdict_BxL[:, :1] == text.ACCEPT) | (verdict_BxL[:, :1] == text.ABSENT)
      final_BxA = jnp.where(stands_Bx1, answer_BxA, final_BxA)
    return final_BxA

  def rewards(self, task, layout, problems, tokens_BxT):
    score = jax.vmap(task.score)
    answers, verdicts = self._rounds(layout, tokens_BxT)
    team_B = score(problems, self.final_answer(layout, tokens_BxT))
    # Per-role verifiable signals: the solver's first answer is right; each verdict played is right.
    first_right_B = score(problems, answers[0])
    played_KxB = jnp.stack([v[:, 0] != text.PAD for v in verdicts])
    accept_KxB = jnp.stack([v[:, 0] == text.ACCEPT for v in verdicts])
    right_KxB = jnp.stack([score(problems, a) for a in answers]) > 0
    verdict_ok_B = ((accept_KxB == right_KxB) & played_KxB).sum(0) / jnp.maximum(played_KxB.sum(0), 1)
    accept_B, wrong_B = accept_KxB[0], first_right_B == 0
    metrics = {
        "accuracy": team_B.mean(),
        "solver_accuracy": first_right_B.mean(),
        "accept_rate": accept_B.mean(),
        "false_accept": judging.rate(accept_B, wrong_B),  # accepted among wrong first answers
        "false_reject": judging.rate(~accept_B, ~wrong_B),  # rejected among right first answers
        "verdict_accuracy": verdict_ok_B.mean(),
        **engine.member_accuracy(("solver",), first_right_B[None]),  # its first answer, before review
    }
    judgments = engine.Judgments(level_JxKxB=accept_KxB[:1, None].astype(jnp.int32), truth_KxB=first_right_B[None],
                                 levels=(0.0, 1.0), answer_roles=(SOLVER,))
    verifier_B = verdict_ok_B if self.verifier_signal == "verdict" else team_B
    return engine.Scored(team_B=team_B, role_RxB=jnp.stack([first_right_B, verifier_B]),
                         metrics=metrics, judgments=judgments)

  def demonstrate(self, task, layout, problems, key_B):
    """Round 1: a (noisy) solver answer and a (noisy) verdict; a rejected answer is revised to the
    target, and in a second round the solver adopts the revision and the verifier accepts it."""
    keys = jax.vmap(lambda k: jax.random.split(k, 3))(key_B)
    answer_BxA = jax.vmap(task.demonstrate)(problems, keys[:, 0])
    right_B = jax.vmap(task.score)(problems, answer_BxA) > 0
    flip_B = jax.vmap(jax.random.bernoulli, in_axes=(0, None))(keys[:, 1], self.verifier_demo_error_rate)
    accept_B = right_B != flip_B
    revision_BxA = jax.vmap(task.demonstrate)(problems, keys[:, 2])
    B, A = answer_BxA.shape
    accept_msg = jnp.concatenate([jnp.full((B, 1), text.ACCEPT), jnp.full((B, A), text.PAD)], 1)
    reject_msg = jnp.concatenate([jnp.full((B, 1), text.REJECT), revision_BxA], 1)
    verdict = jnp.where(accept_B[:, None], accept_msg, reject_msg)
    messages = [answer_BxA, verdict]
    if self.rounds > 1:
      revisit = lambda msg: jnp.where(accept_B[:, None], text.PAD, msg)
      messages += [revisit(revision_BxA), revisit(accept_msg)]
    messages += [None] * (2 * self.rounds - len(messages))
    return engine.assemble(layout, problems["prompt"], messages)
