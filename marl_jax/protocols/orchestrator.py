"""Orchestrator-workers for decomposable tasks (`task.parts`, e.g. multi_chain): one worker per part
reads only the task's header and its own part and reports the part's answer; the workers act in
parallel (none reads another's part or report); then the orchestrator reads everything and writes the
final answer.  Critical path (PARL's "critical steps", in tokens): the longest worker report plus the
orchestrator's answer, against one agent's single answer.

Per-role verifiable signals: a worker's report is its part's answer (its `workerI/member_accuracy`); the orchestrator's answer is the
combination (`task.combine`) of the reports it got, or, when a report is unreadable, the right answer.
"""
import dataclasses

import jax
import jax.numpy as jnp

from marl_jax import text
from marl_jax.protocols import engine
from marl_jax.tasks import base

# number_B(values_B, width): each row's value as decimal tokens, EOS, then PAD.
number_B = jax.vmap(base.number_tokens, in_axes=(0, None))


@engine.register("orchestrator")
@dataclasses.dataclass(frozen=True)
class Orchestrator(engine.Protocol):

  @classmethod
  def build(cls, task, **kwargs):
    parts = task.parts
    if not parts:
      raise ValueError(f"protocol 'orchestrator' needs a decomposable task (one with `parts`, e.g. "
                       f"multi_chain); {type(task).__name__} has none")
    if len(parts) + 1 > len(text.ROLE_MARKERS):
      raise ValueError(f"protocol 'orchestrator' has one worker per part plus the orchestrator; "
                       f"{len(parts)} parts need more than the {len(text.ROLE_MARKERS)} role markers")
    workers = tuple(f"worker{i}" for i in range(len(parts)))
    # Workers are parallel: each reads neither the other parts nor the other reports.
    kwargs.setdefault("hidden", tuple(
        (segment, worker) for i, worker in enumerate(workers)
        for j in range(len(parts)) if j != i for segment in (parts[j], f"{workers[j]}0")))
    turns = tuple(engine.Turn(w, task.part_answer_len) for w in workers)
    turns += (engine.Turn("orchestrator", task.answer_len),)
    # The orchestrator is role 0, so that e.g. sharing '0,1,1' gives the workers one shared set.
    return cls(roles=("orchestrator",) + workers, turns=turns, **kwargs)

  def final_answer(self, layout, tokens_BxT):
    return engine.message(layout, tokens_BxT, len(self.roles) - 1)

  def rewards(self, task, layout, problems, tokens_BxT):
    reports = [engine.message(layout, tokens_BxT, i) for i in range(len(self.roles) - 1)]
    final_BxA = self.final_answer(layout, tokens_BxT)
    team_B = jax.vmap(task.score)(problems, final_BxA)
    canonical = jax.vmap(base.canonical)
    worker_right_CxB = jnp.stack([
        jnp.all(canonical(r) == number_B(problems["part_values"][:, i], task.part_answer_len - 1), -1)
        for i, r in enumerate(reports)]).astype(jnp.float32)
    value_CxB, ok_CxB = jax.vmap(jax.vmap(base.parse_number))(jnp.stack(reports))
    readable_B = ok_CxB.all(0)
    combined_BxA = jax.vmap(task.answer_of_parts)(value_CxB.T)
    faithful_B = jnp.all(canonical(final_BxA) == combined_BxA, -1).astype(jnp.float32)
    orchestrator_B = jnp.where(readable_B, faithful_B, team_B)
    written = lambda msg_BxL: (msg_BxL != text.PAD).sum(-1)
    metrics = {
        "accuracy": team_B.mean(),
        "worker_accuracy": worker_right_CxB.mean(),
        "aggregation_accuracy": orchestrator_B.mean(),  # the orchestrator's own signal
        "critical_tokens": (jnp.stack([written(r) for r in reports]).max(0) + written(final_BxA)).mean(),
        **engine.member_accuracy(self.roles[1:], worker_right_CxB),  # each report against its part's answer
    }
    role_RxB = jnp.concatenate([orchestrator_B[None], worker_right_CxB])
    return engine.Scored(team_B=team_B, role_RxB=role_RxB, metrics=metrics)

  def demonstrate(self, task, layout, problems, key_B):
    """Each worker reports its part's answer, wrong (its systematic mistake) at `demo_error_rate`; the
    orchestrator combines the reports as given, so a wrong report carries into the final answer."""
    C = len(self.roles) - 1
    wrong_BxC = jax.vmap(lambda k: jax.random.bernoulli(k, task.demo_error_rate, (C,)))(key_B)
    value_BxC = jnp.where(wrong_BxC, problems["part_mistakes"], problems["part_values"])
    reports = [number_B(value_BxC[:, i], task.part_answer_len - 1) for i in range(C)]
    final_BxA = jax.vmap(task.answer_of_parts)(value_BxC)
    return engine.assemble(layout, problems["prompt"], reports + [final_BxA])
