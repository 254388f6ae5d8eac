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

from marl_jax import checks, judging, losses, parallel, registry
from marl_jax.credit import Outcome
from marl_jax.protocols import engine

REGISTRY = registry.Registry("reward.pay", "payment rule")
register = REGISTRY.register

SOURCES = ("checker", "peer")
# What the judged roles' reward reads of a judge: `sampled`, the statement it wrote; `expected`, the
# probability it puts on the answer being right (its distribution over the levels at its verdict).
VERDICTS = ("sampled", "expected")
JUDGE_LOSSES = ("none", *losses.JUDGE_LOSSES)  # a proper score of that probability against the labels
# Cross-judging: `none`; `other_set`: no judge shares its parameter set with a role it judges (the
# judged roles are every role that is not a judge, in every judging workflow); `frozen`: that, and
# the judges' sets are not trained (config.roles.trainable), a reference judge; `rotate`: that, and
# after every step the judges' sets move on to the next seed's team (`rotate_judges`), so each seed's
# solver is judged, and its judges trained on its episodes, by another seed's judges at every step.
CROSS = ("none", "other_set", "frozen", "rotate")
# The audit draw's stream: folded into the run's key at a step count no run reaches, so it is never
# the key of a step's problems, samples or re-runs (`train.make_train_call` folds the step in).
AUDIT_STREAM = 2**31 - 1
PLANT_STREAM = 2**31 - 2  # the planted answers' draw, likewise
REPLAY_STREAM = 2**31 - 3  # the replayed episodes' draw (`rewards.replay`), likewise


@flax.struct.dataclass
class Reviewed:
  """What a payment rule sees of the global batch's A judged answers: the judges' verdicts, which are
  labelled (their episode was audited, or the answer planted) and the label of those (0 on the others)."""
  level_JxA: jax.Array  # each judge's stated confidence level
  labelled_A: jax.Array  # bool: the answer's truth reaches the loss
  label_A: jax.Array  # the checker's verdict (0 or 1) where audited, a planted answer's truth, 0 elsewhere
  levels: tuple[float, ...] = flax.struct.field(pytree_node=False)  # level d states probability levels[d]
  # The probability each judge puts on each answer being right (`Judgments.expected_JxKxB`), where the
  # step reads it; None elsewhere.
  expected_JxA: jax.Array | None = None
  verdict: str = flax.struct.field(pytree_node=False, default="sampled")  # what the judged roles' reward reads

  @property
  def stated_JxA(self) -> jax.Array:
    """Each judge's sampled statement, the probability of its level: what it is paid for."""
    return jnp.asarray(self.levels, jnp.float32)[self.level_JxA]

  @property
  def read_JxA(self) -> jax.Array:
    """What the judged roles' reward reads of each judge: its sampled statement (`verdict=sampled`) or
    the probability it puts on the answer being right (`verdict=expected`)."""
    return self.expected_JxA if self.verdict == "expected" else self.stated_JxA

  @property
  def accept_JxA(self) -> jax.Array:
    return self.stated_JxA > 0.5


@dataclasses.dataclass(frozen=True)
class PayRule:
  source: str = "checker"  # checker | peer
  audit_rate: float = 0.0  # share of episodes whose checker verdict reaches the loss (source=peer)
  penalty: float = 0.0  # charged to the judged roles when an audit catches an accepted wrong answer
  cross: str = "none"  # none | other_set | frozen: what the judges may share with the judged roles
  verdict: str = "sampled"  # sampled | expected: what the judged roles' reward reads of a judge
  # A proper score of each judge's probability against the labelled answers (audited, planted, or
  # with source=checker every answer), a differentiable term of its loss at weight `judge_weight`, beside
  # its policy gradient or, with `judge_pg=False`, instead of it (a supervised judge).
  judge_loss: str = "none"  # none | brier | log
  judge_weight: float = 1.0
  judge_pg: bool = True
  # Share of problems whose judged answers are planted: the task's reference answer or a corruption of
  # it (half each), whose truth is known by construction, instead of the judged roles' own (source=peer).
  plant_rate: float = 0.0
  # A replay of the last `replay` labelled episodes, `replay_rows` of them (per device) added to each
  # step's update for the judge loss alone (`rewards.replay`): each label teaches many times.  0: none.
  replay: int = 0
  replay_rows: int = 0

  min_judges: ClassVar[int] = 1
  needs_audits: ClassVar[bool] = False  # pays or weighs judges by audits: audit_rate > 0
  # Every judge is paid the judged roles' reward, so credit that gives every role the team's fits.
  pays_team_reward: ClassVar[bool] = True

  def check(self, num_judges: int) -> None:
    """Raises a ValueError naming `config.reward.KEY` when a setting cannot work with this run."""

  def init(self, num_judges: int) -> Any:
    return ()

  def label_weight(self, state, label_A) -> jax.Array:
    """weight_A: how much each labelled answer counts in the judge loss (`judge_loss`): 1, so the judges'
    probabilities are calibrated at the labels' base rate, as this rule's aggregate reads them."""
    return jnp.ones_like(label_A)

  def aggregate(self, state, reviewed: Reviewed) -> jax.Array:
    """reported_A: the judges' joint verdict on each answer, its role's reward where there is no audit."""
    return reviewed.read_JxA.mean(0)

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


def audit_keys(run_key, step, rows_B, stream: int = AUDIT_STREAM) -> jax.Array:
  """The audit key of each row (its index in the global batch) at training step `step`: the same for
  a row whatever the device count.  `PLANT_STREAM` gives the plants' keys (of each row's problem)."""
  step_key = jax.random.fold_in(jax.random.fold_in(run_key, stream), step)
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(step_key, rows_B)


def check(rule: PayRule, judge_roles: tuple[int, ...], reruns: bool, role_credit: bool,
          role_set_R: tuple[int, ...], trainable_S: tuple[bool, ...], readout: bool = False) -> None:
  """Refuses a reward setting that cannot work with the workflow's judges (`judge_roles`; `readout`:
  each writes its level as one token, `Protocol.verdict_readout`), the credit estimator (`reruns`: it
  scores re-runs; `role_credit`: it gives each role its own reward) or the role map (`role_set_R`, the
  sets' `trainable_S`, for cross-judging)."""
  name = next(n for n, cls in REGISTRY.items() if cls is type(rule))
  for key, value, allowed in (("source", rule.source, SOURCES), ("cross", rule.cross, CROSS),
                              ("verdict", rule.verdict, VERDICTS), ("judge_loss", rule.judge_loss, JUDGE_LOSSES)):
    if value not in allowed:
      raise ValueError(f"config.reward.{key}={value!r} is unknown; allowed: {list(allowed)}")
  checks.probability("reward.audit_rate", rule.audit_rate)
  checks.probability("reward.plant_rate", rule.plant_rate)
  checks.number("reward.penalty", rule.penalty, 0)
  checks.number("reward.judge_weight", rule.judge_weight, 0)
  reading = [f"config.reward.{key}={value!r}" for key, value, default in (
      ("verdict", rule.verdict, "sampled"), ("judge_loss", rule.judge_loss, "none"),
      ("plant_rate", rule.plant_rate, 0.0)) if value != default]
  if reading and not readout:
    raise ValueError(f"{', '.join(reading)} reads each judge's level as one token at a fixed position, which this "
                     f"workflow's judges do not write; allowed: verdict='sampled', judge_loss='none', plant_rate=0, "
                     f"or a workflow whose judges do (peer_review, solver_verifier)")
  checks.integer("reward.replay", rule.replay, 0)
  checks.integer("reward.replay_rows", rule.replay_rows, 0)
  if (rule.replay > 0) != (rule.replay_rows > 0):
    raise ValueError(f"config.reward.replay={rule.replay} with config.reward.replay_rows={rule.replay_rows}: a "
                     f"replay needs rows drawn from it and rows need a replay; allowed: both 0, or both >= 1")
  if rule.replay and rule.judge_loss == "none":
    raise ValueError(f"config.reward.replay={rule.replay} replays labels for the judge loss, and there is none; "
                     f"allowed: 0, or config.reward.judge_loss='brier' or 'log'")
  if not rule.judge_pg and rule.judge_loss == "none":
    raise ValueError("config.reward.judge_pg=False leaves the judges no loss at all; allowed: judge_pg=True, or "
                     "config.reward.judge_loss='brier' or 'log' (a supervised judge)")
  if rule.source == "checker":
    for key, value, default in (("pay", name, "team"), ("audit_rate", rule.audit_rate, 0.0),
                                ("penalty", rule.penalty, 0.0), ("cross", rule.cross, "none"),
                                ("verdict", rule.verdict, "sampled"), ("plant_rate", rule.plant_rate, 0.0)):
      if value != default:
        raise ValueError(f"config.reward.{key}={value!r} acts only with config.reward.source='peer' (the "
                         f"checker rewards every episode); allowed with source='checker': {default!r}")
    return
  if rule.judge_loss != "none" and not (rule.audit_rate > 0 or rule.plant_rate > 0):
    raise ValueError(f"config.reward.judge_loss={rule.judge_loss!r} learns from labelled answers; allowed: "
                     f"config.reward.audit_rate > 0 or config.reward.plant_rate > 0")
  if len(judge_roles) < rule.min_judges:
    raise ValueError(f"config.reward.pay={name!r} needs at least {rule.min_judges} judging roles; this "
                     f"workflow has {len(judge_roles)} (allowed: a workflow with judges, such as "
                     f"peer_review with config.protocol.judges >= {max(rule.min_judges, 1)})")
  if rule.penalty > 0 and not rule.audit_rate > 0:
    raise ValueError("config.reward.penalty acts on audited episodes; allowed: 0, or config.reward.audit_rate > 0")
  if rule.needs_audits and not (rule.audit_rate > 0 or rule.plant_rate > 0):
    raise ValueError(f"config.reward.pay={name!r} learns from labelled answers; allowed: config.reward.audit_rate "
                     f"> 0 or config.reward.plant_rate > 0")
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


@flax.struct.dataclass
class Plants:
  """The answers planted into this device's rows (`config.reward.plant_rate`): which episodes hold planted
  answers and each one's truth by construction (1: the reference answer, 0: a corrupted one)."""
  planted_B: jax.Array  # bool
  truth_BxK: jax.Array  # row-major, as every per-row record is, so rows can be chunked and gathered


def draw_plants(key_B, plant_rate: float, answers: int) -> Plants:
  """Each episode planted with probability `plant_rate`, each of its `answers` planted answers the
  reference with probability 1/2, from the episode's key alone (`PLANT_STREAM`'s key of its problem:
  the rows of one problem are planted together, so a group of samples holds either its roles' own
  answers only or planted ones only)."""
  def draw(key):
    k_plant, k_truth = jax.random.split(key)
    return jax.random.bernoulli(k_plant, plant_rate), jax.random.bernoulli(k_truth, 0.5, (answers,))
  planted_B, reference_BxK = jax.vmap(draw)(key_B)
  return Plants(planted_B=planted_B, truth_BxK=reference_BxK.astype(jnp.float32))


@flax.struct.dataclass
class Labels:
  """What the judge loss reads of this device's rows: how much each judged answer counts (0 where it
  is not labelled; labelled are the audited or planted ones, with `source=checker` every one:
  `PayRule.label_weight`) and its label."""
  weight_BxK: jax.Array
  label_BxK: jax.Array


def labels(rule: PayRule, truth_KxB, audited_B, plants: Plants | None) -> tuple[jax.Array, jax.Array]:
  """(labelled_KxB, label_KxB): an answer's truth reaches the loss where its episode is audited (the
  checker's verdict) or it was planted (its truth by construction, never the checker's); every answer is
  labelled by the checker with `source=checker`."""
  if rule.source == "checker":
    return jnp.ones(truth_KxB.shape, bool), truth_KxB
  audited_KxB = jnp.broadcast_to(audited_B, truth_KxB.shape)
  if plants is None:
    return audited_KxB, jnp.where(audited_KxB, truth_KxB, 0.0)
  planted_KxB = jnp.broadcast_to(plants.planted_B, truth_KxB.shape)
  label_KxB = jnp.where(planted_KxB, plants.truth_BxK.T, jnp.where(audited_KxB, truth_KxB, 0.0))
  return audited_KxB | planted_KxB, label_KxB


def assign(rule: PayRule, roles: tuple[str, ...], judge_roles: tuple[int, ...], state,
           scored: engine.Scored, outcome: Outcome, audit_key_B, plants: Plants | None = None
           ) -> tuple[engine.Scored, Outcome, Any, dict, Labels | None]:
  """The stage: (`scored` with the rewards paid, logged as `reward` and `ROLE/reward`; the outcome
  credit reads; the rule's updated state; metrics; the labels of this device's rows for the judge loss,
  None without one).  `scored` is the global batch, `outcome`, `audit_key_B` and `plants` this device's
  rows."""
  if rule.source == "checker" and rule.judge_loss == "none":
    return scored, outcome, state, {}, None
  B = outcome.team_B.shape[0]
  judgments = scored.judgments
  audited_B = parallel.gather_rows(draw_audits(audit_key_B, rule.audit_rate))
  plants = None if plants is None else parallel.gather_rows(plants)
  own_labels = None
  if rule.judge_loss != "none":
    labelled_KxB, label_KxB = labels(rule, judgments.truth_KxB, audited_B, plants)
    weight_KxB = jnp.where(labelled_KxB, rule.label_weight(state, label_KxB), 0.0)
    own_labels = Labels(weight_BxK=parallel.own_rows(weight_KxB, B).T, label_BxK=parallel.own_rows(label_KxB, B).T)
  if rule.source == "checker":
    return scored, outcome, state, {}, own_labels
  judged_KxB, pay_JxB, state, metrics = settle(rule, state, judgments, audited_B, plants)
  # The team outcome, and the reward of any role that neither judges nor answers: the mean over the
  # episode's judged answers (the one answer's reward where there is one).
  team_B = judged_KxB.mean(0)
  role_RxB = jnp.broadcast_to(team_B, (len(roles),) + team_B.shape)
  role_RxB = role_RxB.at[jnp.asarray(judgments.answer_roles)].set(judged_KxB).at[jnp.asarray(judge_roles)].set(pay_JxB)
  outcome = outcome.replace(team_B=parallel.own_rows(team_B, B), role_RxB=parallel.own_rows(role_RxB, B))
  return (scored.replace(team_B=team_B, role_RxB=role_RxB), outcome, state,
          name_judges(metrics, roles, judge_roles), own_labels)


def reviewed_by(rule: PayRule, judgments: engine.Judgments, labelled_KxB, label_KxB) -> Reviewed:
  """The judgments as a payment rule sees them: the K x B answers as one axis."""
  J, K, B = judgments.level_JxKxB.shape
  expected_JxA = None if judgments.level_logp_JxKxBxL is None else judgments.expected_JxKxB.reshape(J, K * B)
  return Reviewed(level_JxA=judgments.level_JxKxB.reshape(J, K * B), labelled_A=labelled_KxB.reshape(K * B),
                  label_A=label_KxB.reshape(K * B), levels=judgments.levels, expected_JxA=expected_JxA,
                  verdict=rule.verdict)


def settle(rule: PayRule, state, judgments: engine.Judgments, audited_B, plants: Plants | None = None
           ) -> tuple[jax.Array, jax.Array, Any, dict]:
  """(judged_KxB: each answer's role's reward, labels and penalty applied; pay_JxB: each judge's, the
  mean of its pay over the episode's answers; the rule's updated state; metrics) for the episodes
  `audited_B` (and `plants`) of the global batch."""
  J, K, B = judgments.level_JxKxB.shape
  reviewed = reviewed_by(rule, judgments, *labels(rule, judgments.truth_KxB, audited_B, plants))
  reported_A = rule.aggregate(state, reviewed)
  caught_A = reviewed.labelled_A & (reported_A > 0.5) & (reviewed.label_A == 0)
  judged_A = jnp.where(reviewed.labelled_A, reviewed.label_A - rule.penalty * caught_A, reported_A)
  pay_JxA, state, rule_metrics = rule.pay(state, reviewed, judged_A)
  metrics = {**monitor(reviewed, judgments, reported_A), **rule_metrics}
  return judged_A.reshape(K, B), pay_JxA.reshape(J, K, B).mean(1), state, metrics


def monitor(reviewed: Reviewed, judgments: engine.Judgments, reported_A, draw_key=None) -> dict:
  """What the checker says of the judges (it scores every answer for these, never for the loss): the
  judged answers' accuracy, what the judges' verdict reports of it and the distortion between them,
  each judge's false accepts (accepted among wrong answers), false rejects, balanced accuracy and the
  AUROC of its statements, with two judges or more their agreement, error correlation and effective
  number (`marl_jax.judging`), and the labels (one per labelled answer) that reached the loss per
  episode.  Where the judges' distributions over the levels are read, also the AUROC of their greedy
  level (`auroc_greedy`), of the probability they put on right (`auroc_expected`) and, with `draw_key`,
  of a level drawn from it (`auroc_sampled`: at evaluation, whose statements are greedy)."""
  J, K, B = judgments.level_JxKxB.shape
  truth_A = judgments.truth_KxB.reshape(K * B)
  wrong_A, accept_JxA = truth_A == 0, reviewed.accept_JxA
  metrics = {"true_accuracy": truth_A.mean(), "reported_accuracy": reported_A.mean(),
             "distortion": reported_A.mean() - truth_A.mean(),
             "labels_per_episode": reviewed.labelled_A.mean() * K,
             "false_accept": jax.vmap(judging.rate, (0, None))(accept_JxA, wrong_A),
             "false_reject": jax.vmap(judging.rate, (0, None))(~accept_JxA, ~wrong_A),
             "balanced_accuracy": judging.balanced_accuracy(accept_JxA, truth_A),
             "auroc": judging.auroc(reviewed.stated_JxA, truth_A)}
  if judgments.level_logp_JxKxBxL is not None:
    level_logp_JxAxL = judgments.level_logp_JxKxBxL.reshape(J, K * B, -1)
    metrics.update(auroc_greedy=judging.auroc(jnp.argmax(level_logp_JxAxL, -1), truth_A),
                   auroc_expected=judging.auroc(reviewed.expected_JxA, truth_A),
                   expected=reviewed.expected_JxA.mean(1))
    if draw_key is not None:
      drawn_JxA = jax.random.categorical(draw_key, level_logp_JxAxL)
      metrics["auroc_sampled"] = judging.auroc(drawn_JxA, truth_A)
  if J > 1:
    metrics.update(judge_agreement=judging.agreement(accept_JxA),
                   judge_error_correlation=judging.error_correlation(accept_JxA, truth_A),
                   effective_judges=judging.effective_judges(accept_JxA, truth_A))
  return metrics


def evaluation(rule: PayRule, roles: tuple[str, ...], judge_roles: tuple[int, ...],
               judgments: engine.Judgments | None) -> dict:
  """The judges' `monitor` metrics on an evaluation batch, for a run rewarded by them (none for
  `source=checker`): nothing is labelled there, and the reported accuracy is the judges' mean verdict
  as the judged roles' reward reads it (the `reputation` rule's weights are training state)."""
  if rule.source == "checker":
    return {}
  J, K, B = judgments.level_JxKxB.shape
  unlabelled_KxB = jnp.zeros((K, B), bool)
  reviewed = reviewed_by(rule, judgments, unlabelled_KxB, jnp.zeros((K, B)))
  metrics = monitor(reviewed, judgments, reviewed.read_JxA.mean(0), draw_key=jax.random.key(0))
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
