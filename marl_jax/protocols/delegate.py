"""Delegate: orchestrator-workers as in Kimi's Parallel-Agent RL (PARL), on decomposable tasks
(`task.parts`, e.g. multi_chain).

Turns: the orchestrator writes one assignment per worker slot (`workers`, 0: one per part): a
sub-problem (a part's tokens, copied or rewritten, then EOS; `task.part_value` reads it) or nothing
(EOS first).  Then the workers, in parallel: worker s reads only its own assignment (not the problem,
not the other slots or reports) and reports the answer.  Last, the orchestrator reads everything and
writes the final answer; it may ignore the reports and solve alone.

Training reward (PARL): r_task + lambda1 * r_parallel + lambda2 * r_finish.  The auxiliary terms are
`Scored.aux_KxB`; their weights at step t are `aux_weights(t)` = (`parallel_weight`,
`finish_weight`) x an optax schedule (`anneal`: `linear` to 0 at `anneal_steps`, or `never`); weights
0 switch them off. ::

  r_parallel: the fraction of slots holding a well-formed sub-problem that no earlier slot holds;
  r_finish:   the fraction of well-formed assignments (assigned sub-tasks) whose report is right.

Metrics, rates over the batch::

  critical_steps:       PARL's critical steps, in tokens: every token the orchestrator wrote plus the
                        longest report (the workers are one parallel stage);
  workers_used:         slots given an assignment (anything but EOS first or `<absent>`), per episode;
  spurious_parallelism: among those slots, the malformed ones and the repeats of an earlier slot (an
                        empty slot is a worker not spawned, counted by workers_used instead);
  serial_collapse:      episodes answered without using a correct report: no report is right, or the
                        final answer is not `task.answer_of_parts` of the well-formed slots'
                        reports (in slot order; a slot without one counts as 0);
  coverage:             parts of the problem whose exact tokens some slot holds.

Per-role signals: the orchestrator's is the team outcome, a worker's is that its report is right.
`workerS/member_accuracy`: slot S's right reports among its well-formed assignments (NaN when it got none).
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from marl_jax import checks, judging, tasks, text
from marl_jax.protocols import engine
from marl_jax.protocols.orchestrator import number_B
from marl_jax.tasks import base

ANNEALS = {"linear": lambda steps: optax.linear_schedule(1.0, 0.0, steps),
           "never": lambda steps: optax.constant_schedule(1.0)}
_EMPTY = (text.EOS, text.ABSENT, text.PAD)  # first tokens of an assignment that gives no work
MAX_WORKERS = 64


def part_messages(task, prompt_BxP, length: int):
  """The problem's parts as messages (each part's prompt segment, its separator made EOS): CxBxL."""
  names = [name for name, _ in task.prompt_segments]
  offsets = np.cumsum([0] + [n for _, n in task.prompt_segments])
  out = []
  for part in task.parts:
    i = names.index(part)
    msg_BxN = prompt_BxP[:, offsets[i]:offsets[i + 1]].at[:, -1].set(text.EOS)
    out.append(jnp.pad(msg_BxN, ((0, 0), (0, length - msg_BxN.shape[1])), constant_values=text.PAD))
  return jnp.stack(out)


def _nothing(B: int, length: int):
  return jnp.full((B, length), text.PAD).at[:, 0].set(text.EOS)


@engine.register("delegate")
@dataclasses.dataclass(frozen=True)
class Delegate(engine.Protocol):
  workers: int = 0  # worker slots, up to MAX_WORKERS; 0: one per part of the task
  parallel_weight: float = 0.5  # lambda1 before annealing
  finish_weight: float = 0.5  # lambda2 before annealing
  anneal: str = "linear"  # linear | never
  anneal_steps: int = 200  # linear: the step at which both weights reach 0
  # Warm start: the demonstrated orchestrator copies every part into a slot at this rate and otherwise
  # answers alone (the task's noisy answer); a demonstrated report is wrong (the part's mistake) at
  # `worker_demo_error_rate`, and the final answer combines the reports as given.
  demo_delegate_rate: float = 0.5
  worker_demo_error_rate: float = 0.1

  @classmethod
  def build(cls, task, workers: int = 0, **kwargs):
    if not task.parts:
      decomposable = sorted(name for name, t in tasks.REGISTRY.items() if t().parts)
      raise ValueError(f"protocol 'delegate' needs a decomposable task; config.task.name={task.name!r} "
                       f"has no parts; tasks with parts: {decomposable}")
    checks.integer("protocol.workers", workers, 0, MAX_WORKERS, note="0: one per part")
    W = workers or len(task.parts)
    if W > MAX_WORKERS:
      raise ValueError(f"config.protocol.workers=0 gives one worker per part, {W} for config.task.name="
                       f"{task.name!r}; allowed: at most {MAX_WORKERS} workers")
    slots = tuple(f"worker{s}" for s in range(W))
    assignment_len = max(n for name, n in task.prompt_segments if name in task.parts)
    turns = tuple(engine.Turn("orchestrator", assignment_len) for _ in slots)
    turns += tuple(engine.Turn(w, task.part_answer_len) for w in slots)
    turns += (engine.Turn("orchestrator", task.answer_len),)
    protocol = cls(roles=("orchestrator",) + slots, turns=turns, workers=W, **kwargs)
    if "hidden" not in kwargs:  # worker s reads its own assignment (orchestrator{s}) and nothing else
      names = protocol.segment_names(task)
      protocol = dataclasses.replace(protocol, hidden=tuple(
          (name, w) for s, w in enumerate(slots) for name in names if name != f"orchestrator{s}"))
    if protocol.anneal not in ANNEALS:
      raise ValueError(f"config.protocol.anneal={protocol.anneal!r} is unknown; allowed: {list(ANNEALS)}")
    checks.integer("protocol.anneal_steps", protocol.anneal_steps, 1)
    for key in ("parallel_weight", "finish_weight"):  # 0 turns the term off
      checks.number(f"protocol.{key}", getattr(protocol, key), 0)
    return protocol

  def role_markers(self) -> tuple[int, ...]:
    """A marker per slot while they last (the orchestrator's, then one per worker); past that every
    worker writes under marker 1: no worker reads another's slot, and the orchestrator tells the
    reports apart by their place on the canvas."""
    if len(self.roles) <= len(text.ROLE_MARKERS):
      return super().role_markers()
    return (0,) + (1,) * self.workers

  def aux_weights(self, step):
    """(lambda1, lambda2) at training step `step`, weighting (r_parallel, r_finish)."""
    return ANNEALS[self.anneal](self.anneal_steps)(step) * jnp.array(
        [self.parallel_weight, self.finish_weight])

  def final_answer(self, layout, tokens_BxT):
    return engine.message(layout, tokens_BxT, 2 * self.workers)

  def rewards(self, task, layout, problems, tokens_BxT):
    W, P = self.workers, task.part_answer_len
    canonical_B = jax.vmap(base.canonical)
    canonical = jax.vmap(canonical_B)
    assign_WxBxL = canonical(jnp.stack([engine.message(layout, tokens_BxT, s) for s in range(W)]))
    report_WxBxP = jnp.stack([engine.message(layout, tokens_BxT, W + s) for s in range(W)])
    final_BxA = self.final_answer(layout, tokens_BxT)
    team_B = jax.vmap(task.score)(problems, final_BxA)

    # The assignments: used (given any work), well-formed (a sub-problem), repeats of an earlier slot.
    value_WxB, ok_WxB = jax.vmap(jax.vmap(task.part_value))(assign_WxBxL)
    used_WxB = ~jnp.isin(assign_WxBxL[..., 0], jnp.asarray(_EMPTY))
    same_WxWxB = engine.same_messages(assign_WxBxL)
    earlier_WxW = np.tri(W, k=-1, dtype=bool)  # [s, s']: slot s' comes before slot s
    repeat_WxB = ok_WxB & jnp.any(same_WxWxB & ok_WxB[None] & earlier_WxW[:, :, None], 1)
    distinct_WxB = ok_WxB & ~repeat_WxB
    right_WxB = ok_WxB & jnp.all(
        canonical(report_WxBxP) == jax.vmap(number_B, in_axes=(0, None))(value_WxB, P - 1), -1)
    r_parallel_B = distinct_WxB.mean(0)
    r_finish_B = right_WxB.sum(0) / jnp.maximum(ok_WxB.sum(0), 1)

    # Serial collapse: no right report, or a final answer other than the reports' combination.
    reported_WxB, readable_WxB = jax.vmap(jax.vmap(base.parse_number))(report_WxBxP)
    combined_BxA = jax.vmap(task.answer_of_parts)(jnp.where(ok_WxB, reported_WxB, 0).T)
    uses_reports_B = jnp.all(readable_WxB | ~ok_WxB, 0) & jnp.all(canonical_B(final_BxA) == combined_BxA, -1)
    serial_B = ~(right_WxB.any(0) & uses_reports_B)

    written = lambda msg_xL: (msg_xL != text.PAD).sum(-1)
    # The parallel stage is the spawned workers' (an empty slot is a worker not spawned).
    critical_B = (written(assign_WxBxL).sum(0) + written(final_BxA)
                  + jnp.where(used_WxB, written(report_WxBxP), 0).max(0))
    parts_CxBxL = part_messages(task, problems["prompt"], assign_WxBxL.shape[-1])
    covered_CxB = jnp.any(jnp.all(parts_CxBxL[:, None] == assign_WxBxL[None], -1) & ok_WxB[None], 1)
    metrics = {
        "accuracy": team_B.mean(),
        "r_parallel": r_parallel_B.mean(),
        "r_finish": r_finish_B.mean(),
        "worker_accuracy": judging.rate(right_WxB, ok_WxB),  # right reports among well-formed assignments
        "workers_used": used_WxB.sum(0).mean(),
        "spurious_parallelism": judging.rate(~distinct_WxB, used_WxB),
        "serial_collapse": serial_B.mean(),
        "critical_steps": critical_B.mean(),
        "coverage": covered_CxB.mean(),
        # Each slot's report against its own assignment's answer, among the rows it got a sub-problem.
        **engine.member_accuracy(self.roles[1:], right_WxB, ok_WxB),
    }
    role_RxB = jnp.concatenate([team_B[None], right_WxB.astype(jnp.float32)])
    return engine.Scored(team_B=team_B, role_RxB=role_RxB, metrics=metrics,
                         aux_KxB=jnp.stack([r_parallel_B, r_finish_B]))

  def demonstrate(self, task, layout, problems, key_B):
    """Delegating (at `demo_delegate_rate`): slot s gets part s (s < parts; the rest nothing), each
    worker reports its part (wrong at `worker_demo_error_rate`), the final answer combines the
    reports as given (parts beyond the slots: solved alone, wrong at the task's rate).  Otherwise
    every slot gets nothing, workers write nothing and the orchestrator answers alone
    (`task.demonstrate`)."""
    W, C, P = self.workers, len(task.parts), task.part_answer_len
    B = key_B.shape[0]
    keys = jax.vmap(lambda k: jax.random.split(k, 4))(key_B)
    delegate_Bx1 = jax.vmap(jax.random.bernoulli, in_axes=(0, None))(keys[:, 0], self.demo_delegate_rate)[:, None]
    flip = lambda k_B, rate: jax.vmap(lambda k: jax.random.bernoulli(k, rate, (C,)))(k_B)
    reported_BxC = jnp.where(flip(keys[:, 1], self.worker_demo_error_rate), problems["part_mistakes"],
                             problems["part_values"])
    alone_BxC = jnp.where(flip(keys[:, 2], task.demo_error_rate), problems["part_mistakes"],
                          problems["part_values"])
    L = layout.turn_slices[0][1] - layout.turn_slices[0][0]
    parts_CxBxL = part_messages(task, problems["prompt"], L)
    assignments = [jnp.where(delegate_Bx1, parts_CxBxL[s], _nothing(B, L)) if s < C else _nothing(B, L)
                   for s in range(W)]
    reports = [jnp.where(delegate_Bx1, number_B(reported_BxC[:, s], P - 1), _nothing(B, P)) if s < C
               else _nothing(B, P) for s in range(W)]
    values_BxC = jnp.where(np.arange(C) < W, reported_BxC, alone_BxC)
    delegated_BxA = jax.vmap(task.answer_of_parts)(values_BxC)
    final_BxA = jnp.where(delegate_Bx1, delegated_BxA, jax.vmap(task.demonstrate)(problems, keys[:, 3]))
    return engine.assemble(layout, problems["prompt"], assignments + reports + [final_BxA])
