"""The reward stage: where the judged roles' outcome reward comes from, and how the judges are paid.

It runs in the step between the protocol's scoring and credit.  `source=checker` (the default) passes
the scored outcome through untouched.  `source=peer` replaces it: the role that wrote each judged
answer (`Judgments.answer_roles`) gets the judges' aggregate verdict on it, each judge
(`Protocol.judge_roles`) gets what its payment rule pays, any other role and the team outcome get the
mean over the episode's judged answers, and the task's checker reaches the loss only on audited
episodes, drawn per episode at `audit_rate` from a key of their own (after sampling, so nothing an
agent reads tells an audited episode from another).  On an audited episode each judged answer's role
gets the checker's verdict, less `penalty` when the judges accepted a wrong answer (caught).

A payment rule is a frozen dataclass whose fields are its settings (`config.reward.KEY`, beside the
shared `source`, `audit_rate`, `penalty`), registered by name with `@register("name")`
(`config.reward.pay`).  It sees the judges' verdicts and the audits (`Reviewed`), never the checker's
verdict on an episode that was not audited, so with `audit_rate=0` no ground truth reaches the loss
by construction.  It works on the judged answers of the global batch (A = K answers x B episodes, one
axis), and may keep state in `TrainState.reward` (`init`), updated from the global batch so that every
device holds the same.
"""
import dataclasses
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import checks, judging, parallel, registry
from marl_jax.credit import Outcome
from marl_jax.protocols import engine

REGISTRY = registry.Registry("reward.pay", "payment rule")
register = REGISTRY.register

SOURCES = ("checker", "peer")
# Cross-judging: `none`; `other_set`: no judge shares its parameter set with a role it judges (the
# judged roles are every role that is not a judge, in every judging workflow); `frozen`: that, and
# the judges' sets are not trained (config.roles.trainable), a reference judge; `rotate`: that, and
# after every step the judges' sets move on to the next seed's team (`rotate_judges`), so each seed's
# solver is judged, and its judges trained on its episodes, by another seed's judges at every step.
CROSS = ("none", "other_set", "frozen", "rotate")
# The audit draw's stream: folded into the run's key at a step count no run reaches, so it is never
# the key of a step's problems, samples or re-runs (`train.make_train_call` folds the step in).
AUDIT_STREAM = 2**31 - 1


@flax.struct.dataclass
class Reviewed:
  """What a payment rule sees of the global batch's A judged answers: the judges' verdicts, which were
  audited (their episode was) and the checker's verdict on those (0 on the others)."""
  level_JxA: jax.Array  # each judge's stated confidence level
  audited_A: jax.Array  # bool
  label_A: jax.Array  # the checker's verdict (0 or 1) where audited, 0 elsewhere
  levels: tuple[float, ...] = flax.struct.field(pytree_node=False)  # level d states probability levels[d]

  @property
  def stated_JxA(self) -> jax.Array:
    return jnp.asarray(self.levels, jnp.float32)[self.level_JxA]

  @property
  def accept_JxA(self) -> jax.Array:
    return self.stated_JxA > 0.5


@dataclasses.dataclass(frozen=True)
class PayRule:
  source: str = "checker"  # checker | peer
  audit_rate: float = 0.0  # share of episodes whose checker verdict reaches the loss (source=peer)
  penalty: float = 0.0  # charged to the judged roles when an audit catches an accepted wrong answer
  cross: str = "none"  # none | other_set | frozen: what the judges may share with the judged roles

  min_judges: ClassVar[int] = 1
  needs_audits: ClassVar[bool] = False  # pays or weighs judges by audits: audit_rate > 0
  # Every judge is paid the judged roles' reward, so credit that gives every role the team's fits.
  pays_team_reward: ClassVar[bool] = True

  def check(self, num_judges: int) -> None:
    """Raises a ValueError naming `config.reward.KEY` when a setting cannot work with this run."""

  def init(self, num_judges: int) -> Any:
    return ()

  def aggregate(self, state, reviewed: Reviewed) -> jax.Array:
    """reported_A: the judges' joint verdict on each answer, its role's reward where there is no audit."""
    return reviewed.stated_JxA.mean(0)

  def pay(self, state, reviewed: Reviewed, judged_A) -> tuple[jax.Array, Any, dict]:
    """(pay_JxA: each judge's pay for its verdict on each answer; the updated state; metrics: scalars,
    or J-vectors logged as JUDGE/NAME), given the judged roles' reward for each answer judged_A."""
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class BetaPrior(PayRule):
  """A rule that keeps counts of audited outcomes from a Beta(`prior_right`, `prior_wrong`) prior: the
  prior's settings and their check (each rule says what it counts)."""
  prior_right: float = 1.0  # Beta prior pseudo-counts: right, wrong
  prior_wrong: float = 1.0

  def check(self, num_judges: int) -> None:
    checks.number("reward.prior_right", self.prior_right, 0, above=True)
    checks.number("reward.prior_wrong", self.prior_wrong, 0, above=True)


def draw_audits(key_B, audit_rate: float) -> jax.Array:
  """audited_B: each episode audited with probability `audit_rate`, from its own key alone."""
  return jax.vmap(lambda k: jax.random.bernoulli(k, audit_rate))(key_B)


def audit_keys(run_key, step, rows_B) -> jax.Array:
  """The audit key of each row (its index in the global batch) at training step `step`: the same for
  a row whatever the device count."""
  step_key = jax.random.fold_in(jax.random.fold_in(run_key, AUDIT_STREAM), step)
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(step_key, rows_B)


def check(rule: PayRule, judge_roles: tuple[int, ...], reruns: bool, role_credit: bool,
          role_set_R: tuple[int, ...], trainable_S: tuple[bool, ...]) -> None:
  """Refuses a reward setting that cannot work with the workflow's judges (`judge_roles`), the credit
  estimator (`reruns`: it scores re-runs; `role_credit`: it gives each role its own reward) or the role
  map (`role_set_R`, the sets' `trainable_S`, for cross-judging)."""
  name = next(n for n, cls in REGISTRY.items() if cls is type(rule))
  if rule.source not in SOURCES:
    raise ValueError(f"config.reward.source={rule.source!r} is unknown; allowed: {list(SOURCES)}")
  if rule.cross not in CROSS:
    raise ValueError(f"config.reward.cross={rule.cross!r} is unknown; allowed: {list(CROSS)}")
  checks.probability("reward.audit_rate", rule.audit_rate)
  checks.number("reward.penalty", rule.penalty, 0)
  if rule.source == "checker":
    for key, value, default in (("pay", name, "team"), ("audit_rate", rule.audit_rate, 0.0),
                                ("penalty", rule.penalty, 0.0), ("cross", rule.cross, "none")):
      if value != default:
        raise ValueError(f"config.reward.{key}={value!r} acts only with config.reward.source='peer' (the "
                         f"checker rewards every episode); allowed with source='checker': {default!r}")
    return
  if len(judge_roles) < rule.min_judges:
    raise ValueError(f"config.reward.pay={name!r} needs at least {rule.min_judges} judging roles; this "
                     f"workflow has {len(judge_roles)} (allowed: a workflow with judges, such as "
                     f"peer_review with config.protocol.judges >= {max(rule.min_judges, 1)})")
  if rule.penalty > 0 and not rule.audit_rate > 0:
    raise ValueError("config.reward.penalty acts on audited episodes; allowed: 0, or config.reward.audit_rate > 0")
  if rule.needs_audits and not rule.audit_rate > 0:
    raise ValueError(f"config.reward.pay={name!r} learns from audits; allowed: config.reward.audit_rate > 0")
  if reruns:
    raise ValueError("config.reward.source='peer' with a credit estimator that re-runs episodes: the re-runs' "
                     "outcomes come from the task's checker; allowed: an estimator without re-runs (team, "
                     "per_role, role_baseline, role_normalized)")
  if not rule.pays_team_reward and not role_credit:
    raise ValueError(f"config.reward.pay={name!r} pays each judge its own reward, and this credit estimator "
                     f"gives every role the team's; allowed: config.credit.name='per_role', or role_baseline "
                     f"or role_normalized with config.credit.signal='role'")
  check_cross(rule.cross, judge_roles, role_set_R, trainable_S)
  rule.check(len(judge_roles))


def check_cross(cross: str, judge_roles: tuple[int, ...], role_set_R: tuple[int, ...],
                trainable_S: tuple[bool, ...]) -> None:
  """Cross-judging: with `other_set` or `frozen` no judge's parameter set is a judged role's; with
  `frozen` no judge's set is trained either."""
  if cross == "none":
    return
  judge_sets = {role_set_R[r] for r in judge_roles}
  shared = sorted({r for r in range(len(role_set_R)) if r not in judge_roles and role_set_R[r] in judge_sets})
  if shared:
    raise ValueError(f"config.reward.cross={cross!r}: config.roles.sharing={','.join(map(str, role_set_R))} "
                     f"gives judged roles {shared} a judge's parameter set; allowed: a role map whose judges' "
                     f"sets are theirs alone (experiments/peer_review.py: sharing=judges or isolated)")
  trained = sorted(s for s in judge_sets if trainable_S[s])
  if cross == "frozen" and trained:
    raise ValueError(f"config.reward.cross='frozen': the judges' parameter sets {trained} are trained; allowed: "
                     f"config.roles.trainable with 0 for each of them (a reference judge)")


def check_rotation(num_seeds: int, set_axes) -> None:
  """`cross=rotate` moves the judges between the vmapped seeds: it needs two seeds or more and a model
  whose every parameter is stacked over the sets (`set_axes` 0)."""
  if num_seeds < 2:
    raise ValueError(f"config.reward.cross='rotate' passes the judges from seed to seed; config.num_seeds="
                     f"{num_seeds}; allowed: 2 or more")
  if set_axes != 0:
    raise ValueError("config.reward.cross='rotate': this model has parameters every set shares (adapters over "
                     "one base); allowed: a model whose every parameter is per set (the built-in model)")


def rotate_judges(state_S, judge_sets: tuple[int, ...]):
  """state_S (a TrainState of S seeds) with the judges' parameter sets `judge_sets` (their parameters
  and optimiser state) and the payment rule's state (the judges' records) moved one seed down: seed s
  gets seed s + 1's (mod S), the judged roles' sets stay."""
  sets = np.asarray(judge_sets)
  move = lambda leaf_SxRx: leaf_SxRx.at[:, sets].set(jnp.roll(leaf_SxRx[:, sets], -1, axis=0))
  return state_S.replace(params=jax.tree.map(move, state_S.params), opt_state=jax.tree.map(move, state_S.opt_state),
                         reward=jax.tree.map(lambda leaf_Sx: jnp.roll(leaf_Sx, -1, axis=0), state_S.reward))


def assign(rule: PayRule, roles: tuple[str, ...], judge_roles: tuple[int, ...], state,
           scored: engine.Scored, outcome: Outcome, audit_key_B
           ) -> tuple[engine.Scored, Outcome, Any, dict]:
  """The stage: (`scored` with the rewards paid, logged as `reward` and `ROLE/reward`; the outcome
  credit reads; the rule's updated state; metrics).  `scored` is the global batch, `outcome` and
  `audit_key_B` this device's rows."""
  if rule.source == "checker":
    return scored, outcome, state, {}
  B = outcome.team_B.shape[0]
  judgments = scored.judgments
  audited_B = parallel.gather_rows(draw_audits(audit_key_B, rule.audit_rate))
  judged_KxB, pay_JxB, state, metrics = settle(rule, state, judgments, audited_B)
  # The team outcome, and the reward of any role that neither judges nor answers: the mean over the
  # episode's judged answers (the one answer's reward where there is one).
  team_B = judged_KxB.mean(0)
  role_RxB = jnp.broadcast_to(team_B, (len(roles),) + team_B.shape)
  role_RxB = role_RxB.at[jnp.asarray(judgments.answer_roles)].set(judged_KxB).at[jnp.asarray(judge_roles)].set(pay_JxB)
  outcome = outcome.replace(team_B=parallel.own_rows(team_B, B), role_RxB=parallel.own_rows(role_RxB, B))
  return (scored.replace(team_B=team_B, role_RxB=role_RxB), outcome, state,
          name_judges(metrics, roles, judge_roles))


def settle(rule: PayRule, state, judgments: engine.Judgments, audited_B
           ) -> tuple[jax.Array, jax.Array, Any, dict]:
  """(judged_KxB: each answer's role's reward, audits and penalty applied; pay_JxB: each judge's, the
  mean of its pay over the episode's answers; the rule's updated state; metrics) for the episodes
  `audited_B` of the global batch.  The rule sees the K x B answers as one axis."""
  J, K, B = judgments.level_JxKxB.shape
  audited_A = jnp.broadcast_to(audited_B, (K, B)).reshape(K * B)
  reviewed = Reviewed(level_JxA=judgments.level_JxKxB.reshape(J, K * B), audited_A=audited_A,
                      label_A=jnp.where(audited_A, judgments.truth_KxB.reshape(K * B), 0.0),
                      levels=judgments.levels)
  reported_A = rule.aggregate(state, reviewed)
  caught_A = audited_A & (reported_A > 0.5) & (reviewed.label_A == 0)
  judged_A = jnp.where(audited_A, reviewed.label_A - rule.penalty * caught_A, reported_A)
  pay_JxA, state, rule_metrics = rule.pay(state, reviewed, judged_A)
  metrics = {**monitor(reviewed, judgments.truth_KxB.reshape(K * B), reported_A, K), **rule_metrics}
  return judged_A.reshape(K, B), pay_JxA.reshape(J, K, B).mean(1), state, metrics


def monitor(reviewed: Reviewed, truth_A, reported_A, answers_per_episode: int) -> dict:
  """What the checker says of the judges (it scores every answer for these, never for the loss): the
  judged answers' accuracy, what the judges' verdict reports of it and the distortion between them,
  each judge's false accepts (accepted among wrong answers), false rejects, balanced accuracy and the
  AUROC of its statements, with two judges or more their agreement and effective number
  (`marl_jax.judging`), and the ground-truth labels (one per audited answer) that reached the loss per
  episode."""
  wrong_A, accept_JxA = truth_A == 0, reviewed.accept_JxA
  metrics = {"true_accuracy": truth_A.mean(), "reported_accuracy": reported_A.mean(),
             "distortion": reported_A.mean() - truth_A.mean(),
             "labels_per_episode": reviewed.audited_A.mean() * answers_per_episode,
             "false_accept": jax.vmap(judging.rate, (0, None))(accept_JxA, wrong_A),
             "false_reject": jax.vmap(judging.rate, (0, None))(~accept_JxA, ~wrong_A),
             "balanced_accuracy": judging.balanced_accuracy(accept_JxA, truth_A),
             "auroc": judging.auroc(reviewed.level_JxA, truth_A, len(reviewed.levels))}
  if accept_JxA.shape[0] > 1:
    metrics.update(judge_agreement=judging.agreement(accept_JxA),
                   effective_judges=judging.effective_judges(accept_JxA, truth_A))
  return metrics


def evaluation(rule: PayRule, roles: tuple[str, ...], judge_roles: tuple[int, ...],
               judgments: engine.Judgments | None) -> dict:
  """The judges' `monitor` metrics on an evaluation batch, for a run rewarded by them (none for
  `source=checker`): nothing is audited there, and the reported accuracy is the judges' mean
  statement (the `reputation` rule's weights are training state)."""
  if rule.source == "checker":
    return {}
  J, K, B = judgments.level_JxKxB.shape
  reviewed = Reviewed(level_JxA=judgments.level_JxKxB.reshape(J, K * B), audited_A=jnp.zeros(K * B, bool),
                      label_A=jnp.zeros(K * B), levels=judgments.levels)
  metrics = monitor(reviewed, judgments.truth_KxB.reshape(K * B), reviewed.stated_JxA.mean(0), K)
  del metrics["labels_per_episode"]  # no loss at evaluation
  return name_judges(metrics, roles, judge_roles)


def name_judges(metrics: dict, roles, judge_roles) -> dict:
  """Scalars as they are; J-vectors as JUDGE/NAME, one per judging role."""
  named = {}
  for name, value in metrics.items():
    if jnp.ndim(value):
      named.update({f"{roles[r]}/{name}": value[j] for j, r in enumerate(judge_roles)})
    else:
      named[name] = value
  return named
