"""Protocol engine: a workflow is a static schedule of turns laid out on one token canvas.

Canvas = the task's prompt segments, then one segment per turn: [header, message...], where the
header is the role marker (or, for a task in a chat layout, the tokens that open the role's turn,
`Task.turn_headers`), written by the environment.  Every
position has a static segment, author (a role, or -1 for the environment) and a flag for whether the
environment writes it.  A static visibility table (segment x role) decides what each role reads; a
turn may read less than its role (segment x turn), e.g. a debate round only the previous round.
Authorship comes from this layout, never from tokens, and roles cannot write role markers, so no role
can speak as another.

Roles are mapped to parameter sets (`role_set_R`); turns with the same parameter set and the same
visibility share one *view* (one forward pass, one KV cache), so a shared-parameter team with full
visibility costs one model, not R.
"""
import dataclasses
import functools
from collections.abc import Collection

import flax
import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import registry, text
from marl_jax.tasks import Task
from marl_jax.tasks.base import canonical

ENV = -1


@dataclasses.dataclass(frozen=True)
class Turn:
  role: str
  length: int  # most tokens the role may write, EOS included
  ends_episode_on: tuple[int, ...] = ()  # a first token from this set closes the message and episode
  # Segments this turn does not read on top of those its role does not (`Protocol.hidden`): a debate
  # round reads only the others' previous round.  The role's own messages stay visible.
  hidden: tuple[str, ...] = ()
  # The tokens this turn may write, () for any the policy may write: a small alphabet (signalling's
  # sender, `Task.message_vocab`), enforced by the sampler's mask (`sampling.policy_log_probs`).
  vocab: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Layout:
  """Static description of a canvas (numpy arrays, closed over by jitted code)."""
  roles: tuple[str, ...]
  segment_names: tuple[str, ...]
  segment_T: np.ndarray  # segment id of each position
  author_T: np.ndarray  # role id, or ENV
  env_T: np.ndarray  # the environment writes this position (prompt, role markers)
  marker_T: np.ndarray  # the header's tokens at header positions, PAD elsewhere
  turn_T: np.ndarray  # turn id of message/header positions, -1 in the prompt
  ends_episode_TxV: np.ndarray  # tokens that end the episode when written at this position
  turn_slices: tuple[tuple[int, int], ...]  # (start, stop) of each turn's message tokens
  header_starts: tuple[int, ...]  # where each turn's header starts (it ends at the message's start)
  turn_roles: tuple[int, ...]
  visible_SxR: np.ndarray  # what each role reads
  visible_SxN: np.ndarray  # what each turn reads: its role's row less the turn's own `hidden`
  view_set_V: tuple[int, ...]  # parameter set of each view
  visible_SxV: np.ndarray  # what each view reads
  role_view_R: tuple[int, ...]  # the view of each role's first turn
  turn_view_N: tuple[int, ...]
  # allowed_TxV[t, v]: position t may hold token v; None when no turn narrows its vocabulary (the
  # sampler then masks only the environment's tokens).
  allowed_TxV: np.ndarray | None = None

  @property
  def length(self) -> int:
    return len(self.segment_T)

  @property
  def prompt_len(self) -> int:
    return int(np.argmax(self.turn_T >= 0))

  @property
  def visible_VxT(self) -> np.ndarray:
    return self.visible_SxV[self.segment_T].T

  @property
  def author_view_T(self) -> np.ndarray:
    return np.where(self.author_T >= 0, np.asarray(self.turn_view_N)[self.turn_T], 0)

  def render(self, tokens_T) -> str:
    return text.render_transcript(tokens_T, self.segment_T, self.segment_names)

  def role_turns(self, role: int) -> list[int]:
    return [i for i, r in enumerate(self.turn_roles) if r == role]

  def resampled_turns(self, coalition: Collection[int]) -> list[int]:
    """Turns whose messages can change when the messages of the roles in `coalition` change: their
    own, and every later turn whose author reads (directly or through another changed turn) a changed
    message.  A turn that can end the episode changes whether every later turn is played, so all of
    them follow it.  The rest (e.g. a parallel worker, the other player of a simultaneous game) keep
    their sampled tokens in a counterfactual re-run, so credit is measured with the other roles'
    actions held fixed."""
    prompt_segments = len(self.segment_names) - len(self.turn_roles)
    changed: list[int] = []
    for i, r in enumerate(self.turn_roles):
      reads_changed = any(self.visible_SxN[prompt_segments + j, i] for j in changed)
      ends_episode = any(self.ends_episode_TxV[slice(*self.turn_slices[j])].any() for j in changed)
      if r in coalition or reads_changed or ends_episode:
        changed.append(i)
    return changed


@dataclasses.dataclass(frozen=True, eq=False)  # read at trace time, never a static argument: no hash
class VerdictReadout:
  """Where a judge's verdict is written as one token (`Protocol.verdict_readout`): judge j states its
  level on answer k at canvas position `position_JxK[j, k]`, level d as token `token_L[d]`.  The
  judge's distribution over those L tokens there is its distribution over the levels, which state the
  probabilities `levels` (`Judgments.levels`; `sampling.level_log_probs`)."""
  position_JxK: np.ndarray
  token_L: tuple[int, ...]
  levels: tuple[float, ...]
  answer_turn_K: tuple[int, ...]  # the turn whose message is answer k (where a planted answer goes)


@flax.struct.dataclass
class Judgments:
  """What the judging roles (`Protocol.judge_roles`) said of the K answers they judged in each episode,
  for rewards from peers (`marl_jax.rewards`).  A judge states how likely an answer is right as one
  level of a small confidence vocabulary: level d means probability `levels[d]` (a plain ACCEPT /
  REJECT verdict, or picking a candidate or not, is the vocabulary (0, 1))."""
  level_JxKxB: jax.Array  # each judge's stated level on each answer (an unreadable verdict states 0)
  truth_KxB: jax.Array  # the task's checker on each answer, 0 or 1: for audits and monitoring only
  levels: tuple[float, ...] = flax.struct.field(pytree_node=False)
  answer_roles: tuple[int, ...] = flax.struct.field(pytree_node=False)  # the role that wrote answer k
  # Each judge's log-probs of the levels at its verdict position (normalised over the L levels), where
  # the step reads them (`train.score`, a protocol with a `verdict_readout`); None elsewhere.
  level_logp_JxKxBxL: jax.Array | None = None

  @property
  def stated_JxKxB(self) -> jax.Array:
    """Each judge's stated probability that each answer is right."""
    return jnp.asarray(self.levels, jnp.float32)[self.level_JxKxB]

  @property
  def expected_JxKxB(self) -> jax.Array:
    """Each judge's expected statement, the probability it puts on the answer being right: the levels'
    probabilities weighted by its distribution over them."""
    return expected_level(self.level_logp_JxKxBxL, self.levels)


def expected_level(level_logp_xL, levels: tuple[float, ...]) -> jax.Array:
  """sum_d p_d levels[d] of log-probs over the L levels (last axis)."""
  return jnp.exp(level_logp_xL) @ jnp.asarray(levels, jnp.float32)


@flax.struct.dataclass
class Scored:
  """What a protocol's `rewards` returns for a batch of B transcripts."""
  team_B: jax.Array  # the team outcome in [0, 1]: the task's score of the final answer
  role_RxB: jax.Array  # each role's own verifiable signal (the team outcome where none exists)
  metrics: dict[str, jax.Array]  # scalar rates over the batch; always holds "accuracy", the mean of team_B
  # Auxiliary reward terms (delegate's r_parallel, r_finish), or None: training adds
  # `Protocol.aux_weights(step) @ aux_KxB` to the team outcome and every role's signal (`training_rewards`).
  aux_KxB: jax.Array | None = None
  # A per-turn reward on top of any estimator's credit (debate's influence bonuses), or None: the
  # step adds turn_NxB[n] to the advantage of every token turn n sampled (`train.token_advantages`),
  # whatever the estimator, so it needs no estimator of its own and each one stays usable.
  turn_NxB: jax.Array | None = None
  # What the judging roles said (a protocol with `judge_roles`), or None: rewards from peers read it.
  judgments: Judgments | None = None


REGISTRY = registry.Registry("protocol.name", "protocol")
register = REGISTRY.register


@dataclasses.dataclass(frozen=True)
class Protocol:
  """Base workflow: roles, a turn schedule and hidden segments.

  A subclass is a frozen dataclass whose extra fields are its knobs (`config.protocol.KEY`), and
  provides, all pure and vmap-free over a batch of B rows::

    build(task, **knobs) -> Protocol       (classmethod) validates knobs, lays out roles and turns;
                                           raises ValueError naming `config.protocol.KEY` when bad
    final_answer(layout, tokens_BxT)       the final-answer message, BxA
    rewards(task, layout, problems, tokens_BxT) -> Scored
    demonstrate(task, layout, problems, key_B) -> tokens_BxT   warm-start transcripts on the canvas
                                           (prompt, headers), noisy; with every `*_rate` knob at 0, right

  and, when `rewards` returns auxiliary terms (`Scored.aux_KxB`, e.g. PARL's shaping rewards)::

    aux_weights(step) -> weights_K         their weights at training step `step` (a traced scalar)

  and, when some roles judge another's answer (solver-verifier's verifier, peer review's judges,
  best-of-n's judge, debate's verifier)::

    judge_roles -> tuple[int, ...]         those roles; `rewards` then returns `Scored.judgments`, no
                                           auxiliary terms, and per-turn rewards that do not read the
                                           checker (rewards from peers keep them as they are)

  and, when each judge writes its level as one token at a fixed position (peer review, solver-verifier)::

    verdict_readout(layout) -> VerdictReadout   where, and which token states each level

  and, for an evaluation diagnostic (peer review's covert channel replaced by noise)::

    ablation(layout, tokens_BxT, key_B)    (canvas_BxT, redraw_T): a message replaced, the positions to
                                           re-draw given it; its metrics are logged as ablated_NAME

  `hidden` lists (segment, role) pairs a role does not read; a `Turn.hidden` hides more from one turn.
  `rewards` does not take the training step: a reward that changes over training (delegate's annealed
  auxiliaries) is returned as terms, and the step weights them where it knows the step
  (`training_rewards`, called by `train.score` and `rollout.rerun`), so evaluation, `accuracy` and
  every protocol without such terms are unchanged.
  A message slot may hold `<absent>` then EOS (a counterfactual without that role, `text.ABSENT`):
  `final_answer` and `rewards` must treat it as "this role did nothing" (e.g. an absent verifier lets
  the answer stand).  Each role has its own marker token (`role_markers`), so at most
  `len(text.ROLE_MARKERS)` roles unless some share one.
  `tests/contract_test.py` checks this contract on every registered workflow.
  """
  roles: tuple[str, ...]
  turns: tuple[Turn, ...]
  hidden: tuple[tuple[str, str], ...] = ()  # (segment name, role): that role does not read it

  @property
  def judge_roles(self) -> tuple[int, ...]:
    """The roles that judge another role's answer; their verdicts come back as `Scored.judgments`, so
    the run can reward the judged roles from them (`config.reward.source=peer`).  None here."""
    return ()

  def verdict_readout(self, layout: Layout) -> VerdictReadout | None:
    """Where each judge writes its level on each answer as one token, so that its distribution over the
    levels can be read (`config.reward.verdict=expected`, `config.reward.judge_loss`); None (the
    default): the verdict is not one token at a fixed position."""
    return None

  def ablation(self, layout: Layout, tokens_BxT, key_B):
    """An evaluation diagnostic: (canvas_BxT, redraw_T), the sampled transcripts with a message replaced
    and the positions to re-draw given it, whose metrics evaluation logs as `ablated_NAME` (peer
    review's covert channel replaced by noise); None (the default): none."""
    return None

  def role_markers(self) -> tuple[int, ...]:
    """Each role's marker (`text.role_marker` index), the header the environment writes before its
    turns: by default its own, role r's marker r.  Authorship comes from the layout, so roles that
    never read each other's turns (delegate's many workers) may share one."""
    return tuple(range(len(self.roles)))

  def segment_names(self, task: Task) -> tuple[str, ...]:
    names = [name for name, _ in task.prompt_segments]
    counts: dict[str, int] = {}
    for turn in self.turns:
      names.append(f"{turn.role}{counts.get(turn.role, 0)}")
      counts[turn.role] = counts.get(turn.role, 0) + 1
    return tuple(names)

  def layout(self, task: Task, role_set_R: tuple[int, ...]) -> Layout:
    return _layout(self, task, tuple(role_set_R))


def training_rewards(protocol: Protocol, scored: Scored, step=None):
  """(team_B, role_RxB) as credit sees them at training step `step`: the scored outcomes plus the
  protocol's weighted auxiliary terms, if it has any; `step=None` (outside training): none."""
  if scored.aux_KxB is None or step is None:
    return scored.team_B, scored.role_RxB
  bonus_B = protocol.aux_weights(step) @ scored.aux_KxB
  return scored.team_B + bonus_B, scored.role_RxB + bonus_B[None]


@functools.lru_cache(maxsize=None)
def _layout(protocol: Protocol, task: Task, role_set_R: tuple[int, ...]) -> Layout:
  roles, markers_R = protocol.roles, protocol.role_markers()
  if len(markers_R) != len(roles) or not all(0 <= m < len(text.ROLE_MARKERS) for m in markers_R):
    raise ValueError(f"role markers {list(markers_R)} for roles {list(roles)}: one per role, each in "
                     f"0..{len(text.ROLE_MARKERS) - 1} (the marker tokens)")
  if len(role_set_R) != len(roles):
    raise ValueError(f"the role map gives {len(role_set_R)} parameter sets for roles {roles}")
  unknown = sorted({t.role for t in protocol.turns} - set(roles))
  if unknown:
    raise ValueError(f"turns name roles {unknown}; the protocol's roles are {list(roles)}")
  names = protocol.segment_names(task)
  headers_N = task.turn_headers(tuple(t.role for t in protocol.turns))
  if headers_N is None:  # the engine's own layout: each turn opens with its role's marker
    headers_N = tuple((text.role_marker(markers_R[roles.index(t.role)]),) for t in protocol.turns)
  seg, author, env, marker, turn, ends, slices = [], [], [], [], [], [], []
  for s, (_, n) in enumerate(task.prompt_segments):
    seg += [s] * n; author += [ENV] * n; env += [True] * n; marker += [text.PAD] * n
    turn += [-1] * n; ends += [()] * n
  for i, (t, h_tokens) in enumerate(zip(protocol.turns, headers_N)):
    if t.length < 1:
      raise ValueError(f"turn {i} ({t.role}) has length {t.length}; it must be >= 1")
    r, s, h = roles.index(t.role), len(task.prompt_segments) + i, len(h_tokens)
    slices.append((len(seg) + h, len(seg) + h + t.length))
    seg += [s] * (h + t.length); author += [ENV] * h + [r] * t.length
    env += [True] * h + [False] * t.length; marker += list(h_tokens) + [text.PAD] * t.length
    turn += [i] * (h + t.length)
    ends += [()] * h + [t.ends_episode_on] + [()] * (t.length - 1)
  ends_TxV = np.zeros((len(seg), text.VOCAB_SIZE), bool)
  for p, toks in enumerate(ends):
    ends_TxV[p, list(toks)] = True
  allowed_TxV = None
  if any(t.vocab for t in protocol.turns):
    allowed_TxV = np.ones((len(seg), text.VOCAB_SIZE), bool)
    for t, (start, stop) in zip(protocol.turns, slices):
      if t.vocab:
        allowed_TxV[start:stop] = np.isin(np.arange(text.VOCAB_SIZE), t.vocab)

  visible = np.ones((len(names), len(roles)), bool)
  for segment, role in protocol.hidden:
    if segment not in names or role not in roles:
      raise ValueError(f"hidden entry ({segment!r}, {role!r}): segments are {list(names)}, "
                       f"roles are {list(roles)}")
    visible[names.index(segment), roles.index(role)] = False
  turn_roles = tuple(roles.index(t.role) for t in protocol.turns)
  for i, r in enumerate(turn_roles):
    visible[len(task.prompt_segments) + i, r] = True  # a role always reads its own messages
  for s, (name, _) in enumerate(task.prompt_segments):
    if not visible[s].any():
      raise ValueError(f"the visibility table hides prompt segment {name!r} from every role {roles}")
  P = len(task.prompt_segments)
  visible_SxN = visible[:, list(turn_roles)]
  for i, t in enumerate(protocol.turns):
    for segment in t.hidden:
      if segment not in names:
        raise ValueError(f"turn {i} ({t.role}) hides {segment!r}; segments are {list(names)}")
      if names.index(segment) < P or turn_roles[names.index(segment) - P] != turn_roles[i]:
        visible_SxN[names.index(segment), i] = False

  # One view per distinct (parameter set, visibility) of a turn, or of a role that has no turn; in
  # role order, so protocols without per-turn visibility get one view per distinct role row.
  key = lambda r, visible_S: (role_set_R[r], visible_S.tobytes())
  distinct = {}
  for r in range(len(roles)):
    for visible_S in [visible_SxN[:, i] for i, ri in enumerate(turn_roles) if ri == r] or [visible[:, r]]:
      distinct.setdefault(key(r, visible_S), (r, visible_S))
  views = list(distinct)
  turn_view_N = tuple(views.index(key(r, visible_SxN[:, i])) for i, r in enumerate(turn_roles))
  return Layout(
      roles=roles, segment_names=names, segment_T=np.array(seg), author_T=np.array(author),
      env_T=np.array(env), marker_T=np.array(marker), turn_T=np.array(turn),
      ends_episode_TxV=ends_TxV,
      turn_slices=tuple(slices), header_starts=tuple(a - len(h) for (a, _), h in zip(slices, headers_N)),
      turn_roles=turn_roles, visible_SxR=visible, visible_SxN=visible_SxN,
      view_set_V=tuple(k[0] for k in views),
      visible_SxV=np.stack([v for _, v in distinct.values()], 1),
      role_view_R=tuple(turn_view_N[turn_roles.index(r)] if r in turn_roles
                        else views.index(key(r, visible[:, r])) for r in range(len(roles))),
      turn_view_N=turn_view_N, allowed_TxV=allowed_TxV)


def message(layout: Layout, tokens_BxT, turn: int):
  """The message slot of one turn: tokens_BxL (EOS-terminated, PAD after; all PAD if never played)."""
  start, stop = layout.turn_slices[turn]
  return tokens_BxT[:, start:stop]


def assemble(layout: Layout, prompt_BxP, messages):
  """A canvas from a prompt and one message per turn (each BxL_turn, or None to leave it blank).

  Used for demonstrations and for forcing counterfactual overrides; turn headers come from the layout.
  """
  B = prompt_BxP.shape[0]
  pieces = [prompt_BxP]
  for (start, stop), header_start, msg in zip(layout.turn_slices, layout.header_starts, messages):
    header = jnp.broadcast_to(layout.marker_T[header_start:start], (B, start - header_start))
    pieces += [header, jnp.full((B, stop - start), text.PAD) if msg is None else msg]
  return jnp.concatenate(pieces, axis=1).astype(jnp.int32)


def same_messages(messages_KxBxL, key=canonical):
  """same_KxKxB[i, j, b]: messages i and j of row b are the same: equal `key`s (by default the tokens
  up to the first EOS; a task's `vote_key` compares final answers)."""
  key_KxBxN = jax.vmap(jax.vmap(key))(messages_KxBxL)
  return jnp.all(key_KxBxN[:, None] == key_KxBxN[None], -1)


def member_accuracy(roles, right_KxB, among_KxB=None) -> dict:
  """`ROLE/member_accuracy` of K members who answer (`roles`, their names): the mean of each one's own
  answer's score by the task's checker (right_KxB), or with `among_KxB` the share of the rows where
  it had something to answer (`judging.rate`'s NaN where it had nothing).  Logged beside the team's
  `accuracy`, so a report shows each member against the team and against a single agent (whose only
  member is itself)."""
  among_KxB = jnp.ones(right_KxB.shape, bool) if among_KxB is None else among_KxB
  return {f"{role}/member_accuracy": jnp.sum(jnp.where(among_B, right_B, 0)) / jnp.sum(among_B)
          for role, right_B, among_B in zip(roles, right_KxB, among_KxB, strict=True)}


def same_message_rate(messages_KxBxL, key=canonical):
  """Role-collapse diagnostic of K parallel same-role agents: the fraction of (pair of agents, row)
  where both wrote the same message on the same problem (or, with a task's `vote_key`, answer)."""
  K = messages_KxBxL.shape[0]
  return same_messages(messages_KxBxL, key)[~np.eye(K, dtype=bool)].mean()
