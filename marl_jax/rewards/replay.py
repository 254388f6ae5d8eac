"""A replay of labelled judged answers (`config.reward.replay`): the judges' proper score learns from
each label many times, not once.

Why: a judge taught by the Brier score on the step's audited answers sees each label in one update
and never again; trained on labels alone it needs hundreds of updates over thousands of labels to learn
the check (`tools.judge_curve`), more than a run's audits give it at one pass each.  The replay keeps
the transcripts and labels of the last `replay` labelled episodes (a ring buffer in the train state,
the same on every device: each step writes the global batch's labelled rows) and adds `replay_rows`
of them, drawn uniformly, to each device's rows of the update.  Replayed rows carry labels and no
sampled tokens, so they reach the judges' proper score and nothing else; the judges read them afresh
under their current parameters, so an old answer's label teaches today's judge.
"""
import flax
import jax
import jax.numpy as jnp

from marl_jax.rewards.base import Labels


@flax.struct.dataclass
class Replay:
  tokens_NxT: jax.Array  # the N slots' transcripts
  weight_NxK: jax.Array  # each judged answer's weight in the judge loss when written (0: unlabelled)
  label_NxK: jax.Array
  written: jax.Array  # episodes written so far; the next goes to slot written % N


def init(capacity: int, length: int, answers: int) -> Replay:
  return Replay(tokens_NxT=jnp.zeros((capacity, length), jnp.int32), weight_NxK=jnp.zeros((capacity, answers)),
                label_NxK=jnp.zeros((capacity, answers)), written=jnp.zeros((), jnp.int32))


def write(replay: Replay, tokens_BxT, labels: Labels) -> Replay:
  """The rows of `tokens_BxT` with a labelled answer written to the next slots in row order, the oldest
  overwritten (B at most the capacity, so one write never laps itself)."""
  N, B = replay.tokens_NxT.shape[0], tokens_BxT.shape[0]
  labelled_B = (labels.weight_BxK > 0).any(1)
  order_B = jnp.argsort(~labelled_B, stable=True)  # the labelled rows first, in row order
  count = labelled_B.sum()
  slot_B = jnp.where(jnp.arange(B) < count, (replay.written + jnp.arange(B)) % N, N)  # N: not written
  put = lambda buffer_Nx, rows_Bx: buffer_Nx.at[slot_B].set(rows_Bx[order_B], mode="drop")
  return Replay(tokens_NxT=put(replay.tokens_NxT, tokens_BxT), weight_NxK=put(replay.weight_NxK, labels.weight_BxK),
                label_NxK=put(replay.label_NxK, labels.label_BxK), written=replay.written + count)


def draw(replay: Replay, key, rows: int) -> tuple[jax.Array, Labels]:
  """(tokens_BxT, labels) of `rows` slots drawn uniformly from those written; weight 0 while none is."""
  N = replay.tokens_NxT.shape[0]
  filled = jnp.minimum(replay.written, N)
  slot_B = jax.random.randint(key, (rows,), 0, jnp.maximum(filled, 1))
  weight_BxK = jnp.where(filled > 0, replay.weight_NxK[slot_B], 0.0)
  return replay.tokens_NxT[slot_B], Labels(weight_BxK=weight_BxK, label_BxK=replay.label_NxK[slot_B])
