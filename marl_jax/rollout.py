"""Episodes: sampling the whole transcript of a protocol, and the counterfactual re-run service.

A re-run takes sampled transcripts and, for each coalition of roles a credit estimator asks for,
changes those roles' messages (resampled from their policies, or replaced by `<absent>`), re-samples
the later turns that can react to them (`Layout.resampled_turns`) and keeps everything else; in
`replace` mode it re-draws only the coalition's own messages and keeps every other turn as it was.
All coalitions and all K samples go through one batched `sampling.generate` call.
"""
import flax
import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import parallel, sampling, text
from marl_jax.credit import Counterfactuals, Reruns
from marl_jax.protocols import engine


@flax.struct.dataclass
class Episodes:
  tokens_BxT: jax.Array  # the canvas: prompt, role markers, messages (PAD after EOS / episode end)
  logp_BxT: jax.Array  # sampling log-prob of each sampled token (0 elsewhere)
  sampled_BxT: jax.Array  # the token was sampled by a role (not the environment, not forced)


def sample(exp, params_R, problems, key_B, greedy=False, rows_per_pass=0, plants=None) -> Episodes:
  """Every row's episode, `rows_per_pass` rows at a time (`parallel.in_row_chunks`; 0: all at once).
  With `plants` (`rewards.Plants`), a planted episode's judged answers are the planted ones, written
  by the environment (never sampled), and every later turn reads them."""
  def chunk(problems, key_B, plants):
    canvas_BxT = engine.assemble(exp.layout, problems["prompt"], [None] * len(exp.layout.turn_slices))
    force_BxT = jnp.zeros(canvas_BxT.shape, bool)
    if plants is not None:
      canvas_BxT, force_BxT = plant(exp, problems, plants, key_B, canvas_BxT, force_BxT)
    return Episodes(*sampling.generate(exp.model, exp.layout, params_R, canvas_BxT, force_BxT, key_B,
                                       exp.config.rl.temperature, greedy))
  episodes_C = parallel.in_row_chunks(chunk, rows_per_pass, problems, key_B, plants)
  return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), episodes_C)


def plant(exp, problems, plants, key_B, canvas_BxT, force_BxT):
  """(canvas_BxT, force_BxT) with each planted episode's judged answers (`Protocol.verdict_readout`'s
  answer turns) forced to the task's reference answer (truth 1) or `Task.wrong_answer` (truth 0): a
  truth known by construction, never the checker's."""
  readout = exp.protocol.verdict_readout(exp.layout)
  for k, turn in enumerate(readout.answer_turn_K):
    start, stop = exp.layout.turn_slices[turn]
    wrong_BxA = jax.vmap(exp.task.wrong_answer)(problems, jax.vmap(lambda key: jax.random.fold_in(key, k))(key_B))
    answer_BxA = jnp.where(plants.truth_BxK[:, k, None] > 0, problems["answer"], wrong_BxA)
    canvas_BxT = canvas_BxT.at[:, start:stop].set(jnp.where(plants.planted_B[:, None], answer_BxA,
                                                            canvas_BxT[:, start:stop]))
    force_BxT = force_BxT.at[:, start:stop].set(plants.planted_B[:, None])
  return canvas_BxT, force_BxT


def reads_levels(exp) -> bool:
  """Whether a run reads its judges' distributions over their levels (`sampling.level_log_probs`): every
  run rewarded by its judges whose verdicts are one token (for the reward with
  `config.reward.verdict=expected`, and the judges' monitoring)."""
  return exp.reward.source == "peer" and exp.protocol.verdict_readout(exp.layout) is not None


def with_levels(exp, params_R, scored: engine.Scored, tokens_BxT) -> engine.Scored:
  """`scored` (of the global batch) whose judgments carry the judges' distributions over their levels
  under `params_R`, read from this device's rows `tokens_BxT` teacher-forced."""
  level_logp_JxKxBxL = sampling.level_log_probs(exp.model, exp.layout, exp.protocol.verdict_readout(exp.layout),
                                                params_R, tokens_BxT, exp.config.rl.temperature)
  all_level_logp_BxJxKxL = parallel.gather_rows(jnp.moveaxis(level_logp_JxKxBxL, 2, 0))
  return scored.replace(judgments=scored.judgments.replace(level_logp_JxKxBxL=jnp.moveaxis(all_level_logp_BxJxKxL, 0, 2)))


def redraw(exp, params_R, canvas_BxT, redraw_T, key_B, greedy=False):
  """tokens_BxT: `canvas_BxT` with the positions `redraw_T` re-drawn by the policies, the rest kept."""
  force_BxT = jnp.broadcast_to(~jnp.asarray(redraw_T), canvas_BxT.shape)
  return sampling.generate(exp.model, exp.layout, params_R, canvas_BxT, force_BxT, key_B,
                           exp.config.rl.temperature, greedy)[0]


def rerun_masks(layout: engine.Layout, reruns: Reruns):
  """Static masks of coalition c's re-run: positions re-drawn (free_CxT), positions overwritten with
  the absent message (absent_CxT) and that message (absent_msg_CxT)."""
  C, T = len(reruns.changed_CxR), layout.length
  free_CxT, absent_CxT = np.zeros((C, T), bool), np.zeros((C, T), bool)
  absent_msg_CxT = np.zeros((C, T), np.int32)
  for c, changed_R in enumerate(reruns.changed_CxR):
    coalition = {r for r, changed in enumerate(changed_R) if changed}
    own_turns = [i for r in coalition for i in layout.role_turns(r)]
    for i in own_turns if reruns.mode == "replace" else layout.resampled_turns(coalition):
      free_CxT[c, slice(*layout.turn_slices[i])] = True
    for i in own_turns if reruns.mode == "absent" else ():
      start, stop = layout.turn_slices[i]
      absent_CxT[c, start:stop] = True
      absent_msg_CxT[c, start:stop] = ([text.ABSENT, text.EOS] + [text.PAD] * stop)[:stop - start]
  return free_CxT, absent_CxT, absent_msg_CxT


def rerun_tokens(exp, params_R, tokens_BxT, key_B, reruns: Reruns):
  """The re-drawn transcripts, tokens_CxKxBxT (one `generate` over all C x K x B rows)."""
  C, K = len(reruns.changed_CxR), reruns.samples
  B, T = tokens_BxT.shape
  free_CxT, absent_CxT, absent_msg_CxT = rerun_masks(exp.layout, reruns)
  canvas_CxBxT = jnp.where(absent_CxT[:, None], absent_msg_CxT[:, None], tokens_BxT[None])
  canvas = jnp.broadcast_to(canvas_CxBxT[:, None], (C, K, B, T)).reshape(C * K * B, T)
  force_CxT = jnp.asarray(~free_CxT | absent_CxT)
  force = jnp.broadcast_to(force_CxT[:, None, None], (C, K, B, T)).reshape(C * K * B, T)
  # Row b's C x K re-runs draw from keys split off its own key: independent of the device count.
  keys = jnp.swapaxes(jax.vmap(lambda k: jax.random.split(k, C * K))(key_B), 0, 1)
  keys = keys.reshape((C * K * B,) + key_B.shape[1:])
  tokens, _, _ = sampling.generate(exp.model, exp.layout, params_R, canvas, force, keys,
                                   exp.config.rl.temperature)
  return tokens.reshape(C, K, B, T)


def rerun(exp, params_R, problems, tokens_BxT, key_B, reruns: Reruns, step=None) -> Counterfactuals:
  """Each coalition's re-drawn transcripts and their team outcomes (with the protocol's auxiliary
  rewards weighted for training step `step`, as `train.score` gives the sampled episodes)."""
  return score_reruns(exp, problems, rerun_tokens(exp, params_R, tokens_BxT, key_B, reruns), step)


def score_reruns(exp, problems, tokens_CxKxBxT, step=None) -> Counterfactuals:
  """The team outcomes of re-drawn transcripts (separate from drawing them, so one set of re-runs
  can be scored under several games, as the credit benchmark does)."""
  C, K, B, T = tokens_CxKxBxT.shape
  tiled = jax.tree.map(lambda x: jnp.tile(x, (C * K,) + (1,) * (x.ndim - 1)), problems)
  scored = exp.protocol.rewards(exp.task, exp.layout, tiled, tokens_CxKxBxT.reshape(C * K * B, T))
  team_B, _ = engine.training_rewards(exp.protocol, scored, step)
  return Counterfactuals(tokens_CxKxBxT=tokens_CxKxBxT, team_CxKxB=team_B.reshape(C, K, B))
