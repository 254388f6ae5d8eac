"""Best-of-n: `candidates` n >= 2 solvers answer in parallel (none reads another), then a judge reads
them all and writes the index of the one it picks (one digit, then EOS); the final answer is the
picked candidate.  An unreadable pick (not a digit below n then EOS) and an absent judge both leave
the first candidate.  Roles `solver0..solvern-1`, `judge`: the default role map of
experiments/best_of_n.py gives the solvers one parameter set and the judge its own.  Checking is easier
than solving on subset_sum and stack_program, so this is where a judge's edge over a solver shows.

Per-role signals (and `solverI/member_accuracy`): a solver's own answer is right; the judge's is that its pick is readable and right
where some candidate is right, readable where none is (no pick could be right: the judge is not
blamed for its solvers, but a malformed pick is its own fault).

The judge judges: its verdict on each candidate is whether it picked it (vocabulary (0, 1); an
unreadable pick endorses none), which rewards from peers (`config.reward.source=peer`) read: each
solver is then paid for being picked.
"""
import dataclasses

import jax
import jax.numpy as jnp

from marl_jax import judging, text
from marl_jax.protocols import engine, vote


@engine.register("best_of_n")
@dataclasses.dataclass(frozen=True)
class BestOfN(engine.Protocol):
  candidates: int = 4
  # Fraction of warm-start picks that go to a wrong candidate (where there is one): a weak judge.
  judge_demo_error_rate: float = 0.3

  @classmethod
  def build(cls, task, candidates: int = 4, **kwargs):
    vote.check_agents("candidates", candidates, len(text.ROLE_MARKERS) - 1)
    solvers = tuple(f"solver{i}" for i in range(candidates))
    kwargs.setdefault("hidden", vote.parallel(solvers))
    turns = tuple(engine.Turn(s, task.answer_len) for s in solvers) + (engine.Turn("judge", 2),)
    return cls(roles=solvers + ("judge",), turns=turns, candidates=candidates, **kwargs)

  @property
  def judge_roles(self) -> tuple[int, ...]:
    return (self.candidates,)

  def answers(self, layout, tokens_BxT):
    return jnp.stack([engine.message(layout, tokens_BxT, i) for i in range(self.candidates)])

  def pick(self, layout, tokens_BxT):
    """The judge's pick (the first candidate when unreadable or absent) and whether it was readable."""
    judge_Bx2 = engine.message(layout, tokens_BxT, self.candidates)
    index_B = judge_Bx2[:, 0] - text.DIGIT0
    readable_B = (index_B >= 0) & (index_B < self.candidates) & (judge_Bx2[:, 1] == text.EOS)
    return jnp.where(readable_B, index_B, 0), readable_B

  def final_answer(self, layout, tokens_BxT):
    pick_B, _ = self.pick(layout, tokens_BxT)
    return jnp.take_along_axis(self.answers(layout, tokens_BxT), pick_B[None, :, None], 0)[0]

  def rewards(self, task, layout, problems, tokens_BxT):
    score = jax.vmap(task.score)
    answers_KxBxA = self.answers(layout, tokens_BxT)
    team_B = score(problems, self.final_answer(layout, tokens_BxT))
    right_KxB = jnp.stack([score(problems, a) for a in answers_KxBxA])
    oracle_B = right_KxB.max(0)
    pick_B, readable_B = self.pick(layout, tokens_BxT)
    judge_B = jnp.where(readable_B, jnp.where(oracle_B > 0, team_B, 1.0), 0.0)
    picked_KxB = readable_B & (pick_B == jnp.arange(self.candidates)[:, None])
    judgments = engine.Judgments(level_JxKxB=picked_KxB[None].astype(jnp.int32), truth_KxB=right_KxB,
                                 levels=(0.0, 1.0), answer_roles=tuple(range(self.candidates)))
    metrics = {
        "accuracy": team_B.mean(),
        "candidate_accuracy": right_KxB.mean(),
        "oracle": oracle_B.mean(),  # some candidate is right
        # Picked right | one right: an unreadable pick is no pick, though its fallback may be right.
        "judge_precision": judging.rate(readable_B & (team_B > 0), oracle_B > 0),
        "readable_pick": readable_B.mean(),
        "same_message_rate": engine.same_message_rate(answers_KxBxA),
        **engine.member_accuracy(self.roles[:self.candidates], right_KxB),  # candidate_accuracy's terms
    }
    return engine.Scored(team_B=team_B, role_RxB=jnp.concatenate([right_KxB, judge_B[None]]),
                         metrics=metrics, judgments=judgments)

  def demonstrate(self, task, layout, problems, key_B):
    """Noisy candidates; the judge picks a right one at random, or at `judge_demo_error_rate` a wrong
    one at random (any candidate when all are right or all are wrong)."""
    n = self.candidates
    keys = jax.vmap(lambda k: jax.random.split(k, n + 2), out_axes=1)(key_B)
    answers_KxBxA = jnp.stack([jax.vmap(task.demonstrate)(problems, keys[i]) for i in range(n)])
    right_BxK = jnp.stack([jax.vmap(task.score)(problems, a) for a in answers_KxBxA], 1) > 0
    wrong_B = jax.vmap(jax.random.bernoulli, in_axes=(0, None))(keys[n], self.judge_demo_error_rate)
    u_BxK = jax.vmap(lambda k: jax.random.uniform(k, (n,)))(keys[n + 1])
    # A random candidate of the wanted kind: those get u in [0, 1), the others u - 2.
    pick_B = jnp.argmax(jnp.where(right_BxK != wrong_B[:, None], u_BxK, u_BxK - 2), 1)
    judge_Bx2 = jnp.stack([text.DIGIT0 + pick_B, jnp.full_like(pick_B, text.EOS)], 1)
    return engine.assemble(layout, problems["prompt"], list(answers_KxBxA) + [judge_Bx2])
