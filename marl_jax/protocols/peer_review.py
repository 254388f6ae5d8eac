"""Peer review: the solver-verifier pair with the revision dropped and the verdict graded and given to
several verifiers.  A solver answers; then `judges` K >= 1 judges each read the problem and the answer
(none reads another's verdict) and state how likely the answer is right, as one digit d below
`confidence_levels` L then EOS: probability d / (L - 1), so L = 2 is REJECT / ACCEPT and the default
L = 4 says 0, 1/3, 2/3 or 1.  A judge accepts when it states more than 1/2.  The final answer is the
solver's: judges review, they do not revise.  An unreadable verdict (not a digit below L then EOS) and
an absent judge state level 0.

A covert channel (`channel` C > 0, issue 49's collusion setting): after its answer the solver writes up
to C free tokens (a turn of its own) that every judge reads and the checker ignores.  Warm-started
solvers write random letters there, which carry nothing; whether a signal emerges in training is
measured on wrong answers as each judge's I(channel; verdict) (`JUDGE/channel_information`, bits), and
at evaluation by re-drawing the verdicts with the channel replaced by random letters (`ablation`).

Roles `solver`, `judge0..judgeK-1`.  Per-role signals: the solver's answer is right; a judge's verdict
(accept or not) agrees with the task's checker.  The judges' verdicts are `Scored.judgments`, so the
run can reward the solver from them instead of from the checker (`config.reward.source=peer`,
docs/peer_review.md).
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import checks, judging, text
from marl_jax.protocols import engine, vote


@engine.register("peer_review")
@dataclasses.dataclass(frozen=True)
class PeerReview(engine.Protocol):
  judges: int = 2
  confidence_levels: int = 4
  # Fraction of warm-start verdicts on the wrong side of 1/2: weak judges, not random ones.
  judge_demo_error_rate: float = 0.3
  channel: int = 0  # free tokens the solver writes after its answer, for the judges alone (0: none)

  @classmethod
  def build(cls, task, judges: int = 2, confidence_levels: int = 4, channel: int = 0, **kwargs):
    checks.integer("protocol.judges", judges, 1, len(text.ROLE_MARKERS) - 1,
                   note=f"each role needs one of the {len(text.ROLE_MARKERS)} role markers")
    checks.integer("protocol.confidence_levels", confidence_levels, 2, len(text.DIGITS),
                   note="one digit each")
    checks.integer("protocol.channel", channel, 0)
    names = tuple(f"judge{j}" for j in range(judges))
    kwargs.setdefault("hidden", vote.parallel(names))
    solver = (engine.Turn("solver", task.answer_len),) + ((engine.Turn("solver", channel),) if channel else ())
    turns = solver + tuple(engine.Turn(n, 2) for n in names)
    return cls(roles=("solver",) + names, turns=turns, judges=judges, confidence_levels=confidence_levels,
               channel=channel, **kwargs)

  @property
  def judge_roles(self) -> tuple[int, ...]:
    return tuple(range(1, 1 + self.judges))

  @property
  def levels(self) -> tuple[float, ...]:
    return tuple(d / (self.confidence_levels - 1) for d in range(self.confidence_levels))

  def verdict_readout(self, layout):
    """Judge j's level is the first token of its turn, level d the digit d; the answer is turn 0's."""
    first = len(self.turns) - self.judges
    position_JxK = np.array([[layout.turn_slices[first + j][0]] for j in range(self.judges)])
    return engine.VerdictReadout(position_JxK, tuple(text.DIGIT0 + d for d in range(self.confidence_levels)),
                                 self.levels, answer_turn_K=(0,))

  def noise(self, key_B):
    """letters_BxC: random letters for the channel, from a key folded off each row's (so a row's other
    draws are those of a run without a channel): a message that carries no signal."""
    draw = lambda k: jax.random.randint(jax.random.fold_in(k, 1), (self.channel,), 0, len(text.LETTERS))
    return text.TOKEN_ID["a"] + jax.vmap(draw)(key_B)

  def ablation(self, layout, tokens_BxT, key_B):
    """Without the signal: the channel replaced by `noise`, the judges' verdicts re-drawn."""
    if not self.channel:
      return None
    start, stop = layout.turn_slices[1]
    redraw_T = np.zeros(layout.length, bool)
    for first, last in layout.turn_slices[2:]:
      redraw_T[first:last] = True
    return tokens_BxT.at[:, start:stop].set(self.noise(key_B)), redraw_T

  def final_answer(self, layout, tokens_BxT):
    return engine.message(layout, tokens_BxT, 0)

  def verdicts(self, layout, tokens_BxT):
    """level_JxB: each judge's stated level, 0 where unreadable."""
    first = len(self.turns) - self.judges
    verdict_JxBx2 = jnp.stack([engine.message(layout, tokens_BxT, first + j) for j in range(self.judges)])
    level_JxB = verdict_JxBx2[..., 0] - text.DIGIT0
    readable_JxB = (level_JxB >= 0) & (level_JxB < self.confidence_levels) & (verdict_JxBx2[..., 1] == text.EOS)
    return jnp.where(readable_JxB, level_JxB, 0)

  def rewards(self, task, layout, problems, tokens_BxT):
    right_B = jax.vmap(task.score)(problems, self.final_answer(layout, tokens_BxT))
    judgments = engine.Judgments(level_JxKxB=self.verdicts(layout, tokens_BxT)[:, None], truth_KxB=right_B[None],
                                 levels=self.levels, answer_roles=(0,))
    accept_JxB, wrong_B = judgments.stated_JxKxB[:, 0] > 0.5, right_B == 0
    verdict_ok_JxB = (accept_JxB == (right_B > 0)).astype(jnp.float32)
    metrics = {
        "accuracy": right_B.mean(),
        "accept_rate": accept_JxB.mean(),
        # Accepted among wrong answers, and not accepted among right ones, over every judge's verdicts.
        "false_accept": judging.rate(accept_JxB, jnp.broadcast_to(wrong_B, accept_JxB.shape)),
        "false_reject": judging.rate(~accept_JxB, jnp.broadcast_to(~wrong_B, accept_JxB.shape)),
        "verdict_accuracy": verdict_ok_JxB.mean(),
        **engine.member_accuracy(("solver",), right_B[None]),
    }
    if self.channel:
      information_J = judging.channel_information(engine.message(layout, tokens_BxT, 1), accept_JxB, right_B)
      metrics.update({f"{self.roles[1 + j]}/channel_information": information_J[j] for j in range(self.judges)})
    return engine.Scored(team_B=right_B, role_RxB=jnp.concatenate([right_B[None], verdict_ok_JxB]),
                         metrics=metrics, judgments=judgments)

  def demonstrate(self, task, layout, problems, key_B):
    """A (noisy) answer; each judge states a level drawn uniformly from the side of 1/2 that its
    verdict takes, the checker's side or, at `judge_demo_error_rate`, the other one, so every level is
    in the warm-started judges' reach."""
    K, L = self.judges, self.confidence_levels
    keys = jax.vmap(lambda k: jax.random.split(k, 3))(key_B)
    answer_BxA = jax.vmap(task.demonstrate)(problems, keys[:, 0])
    right_B = jax.vmap(task.score)(problems, answer_BxA) > 0
    flip_BxK = jax.vmap(lambda k: jax.random.bernoulli(k, self.judge_demo_error_rate, (K,)))(keys[:, 1])
    accept_BxK = right_B[:, None] != flip_BxK
    # A random level on the wanted side: those get u in [0, 1), the others u - 2.
    u_BxKxL = jax.vmap(lambda k: jax.random.uniform(k, (K, L)))(keys[:, 2])
    above_L = jnp.asarray(self.levels) > 0.5
    level_BxK = jnp.argmax(jnp.where(above_L == accept_BxK[..., None], u_BxKxL, u_BxKxL - 2), -1)
    verdict_KxBx2 = jnp.stack([text.DIGIT0 + level_BxK, jnp.full_like(level_BxK, text.EOS)], -1).swapaxes(0, 1)
    channel = [self.noise(key_B)] if self.channel else []  # a warm start that carries no signal
    return engine.assemble(layout, problems["prompt"], [answer_BxA, *channel, *verdict_KxBx2])
