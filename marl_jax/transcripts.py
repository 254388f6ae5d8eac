"""Reading transcript archives (`marl_jax.tools.archive` writes them): `load_transcripts` gives a
`marl_transcripts/NAME:1.0.0` dataset's rows as numpy arrays and readable text, and `distillation_set`
what a warm start distils from one (`config.sft.transcripts`, `marl_jax.sft`).  Apart from the
archive's writer, which reads trained runs through `marl_jax.loop`, so that the loop can read an
archive."""
import dataclasses
import functools
import os

import numpy as np

from marl_jax import array_records, experiment, sft, tasks, text
from marl_jax.lm import agent as lm_agent


class MarlTranscripts(array_records.ArrayRows):
  """Transcripts of a marl_jax team on its evaluation set or on training problems: tokens, authors,
  rewards, credit per role."""


@dataclasses.dataclass
class Transcripts:
  """An archive read back: `arrays` (one row per transcript) and the layout and run in `metadata`."""
  arrays: dict[str, np.ndarray]
  metadata: dict

  def __len__(self) -> int:
    return len(self.arrays["tokens"])

  @functools.cached_property
  def decode(self):
    """Canvas values -> text: the engine's symbols, or a free-text task's tokens through the run's
    checkpoint tokenizer (`config.model.checkpoint`, which must still be there; no weights are read)."""
    if not tasks.REGISTRY[self.metadata["task"]].free_text:
      return text.decode
    tok, canvas_ids_W = lm_agent.free_text_canvas(self.metadata["config"]["model"]["checkpoint"])
    return functools.partial(lm_agent.decode, tok, canvas_ids_W)

  def text(self, i: int) -> str:
    """Row i as text: the prompt, each played message under its role, rewards and credit."""
    meta, tokens_T = self.metadata, self.arrays["tokens"][i]
    roles = meta["roles"]
    # The prompt ends where the first turn's header starts (an archive written before headers had
    # more than the marker has no prompt_len: its prompt ends at that marker).
    prompt_len = meta.get("prompt_len", meta["turn_slices"][0][0] - 1)
    lines = [f"prompt: {self.decode(tokens_T[:prompt_len])}"]
    for (start, stop), r in zip(meta["turn_slices"], meta["turn_roles"]):
      if (tokens_T[start:stop] != text.PAD).any():
        lines.append(f"{roles[r]}: {self.decode(tokens_T[start:stop])}")
    per_role = [f"{role} reward {self.arrays['role_reward'][i, r]:.2f}" +
                (f" credit {self.arrays['credit'][i, r]:+.2f}" if "credit" in self.arrays else "")
                for r, role in enumerate(roles)]
    lines.append(f"team reward {self.arrays['team_reward'][i]:.2f}; " + "; ".join(per_role))
    return "\n".join(lines)

  @property
  def texts(self) -> list[str]:
    return [self.text(i) for i in range(len(self))]


def load_transcripts(out_dir: str, name: str) -> Transcripts:
  return Transcripts(*array_records.read(MarlTranscripts, name, out_dir))


def distillation_set(exp: experiment.Experiment) -> sft.Archived | None:
  """`config.sft.transcripts` (DIR/marl_transcripts/NAME) read and weighed by `config.sft.filter` for
  the warm start to distil (`sft.run`), or None without one.  Refuses (ValueError) an archive that is
  not there, was written on another canvas (task, workflow or roles), holds neither 1 seed nor
  `config.num_seeds`, lacks the credit `filter=credit` reads, or leaves a seed nothing to learn from."""
  cfg = exp.config.sft
  sft.check_filter(exp.config)
  if not cfg.transcripts:
    return None
  path = os.path.normpath(cfg.transcripts)
  data_dir, kind, name = (os.path.dirname(os.path.dirname(path)), os.path.basename(os.path.dirname(path)),
                          os.path.basename(path))
  where = f"config.sft.transcripts={cfg.transcripts!r}"
  if kind != MarlTranscripts.name or not array_records.exists(MarlTranscripts, name, data_dir):
    raise ValueError(f"{where} is not a transcript archive; allowed: DIR/{MarlTranscripts.name}/NAME, as "
                     f"`python -m marl_jax.tools.archive` writes it")
  transcripts = load_transcripts(data_dir, name)
  arrays, layout = transcripts.arrays, exp.layout
  if transcripts.metadata["roles"] != list(layout.roles) or transcripts.metadata["author_T"] != layout.author_T.tolist():
    raise ValueError(f"{where} was written by a team of roles {transcripts.metadata['roles']} on another canvas "
                     f"than this run's of roles {list(layout.roles)}: the task, the workflow and their settings "
                     f"must be the archived run's")
  if layout.allowed_TxV is not None:
    tokens_NxT = arrays["tokens"]
    banned_NxT = ((layout.author_T >= 0) & (tokens_NxT != text.PAD)
                  & ~layout.allowed_TxV[np.arange(layout.length), np.minimum(tokens_NxT, text.VOCAB_SIZE - 1)])
    if banned_NxT.any():
      n, t = np.argwhere(banned_NxT)[0]
      raise ValueError(f"{where}: row {n} holds {text.TOKENS[tokens_NxT[n, t]]!r} at position {t}, which this run's "
                       f"turn may not write (its vocabulary is narrower, e.g. config.task.vocab); allowed: an "
                       f"archive written under the same vocabulary")
  S = int(arrays["seed"].max()) + 1
  if S not in (1, exp.config.num_seeds):
    raise ValueError(f"{where} holds {S} seeds; config.num_seeds={exp.config.num_seeds} needs 1 or the same number")
  if cfg.filter == "credit" and "credit" not in arrays:
    raise ValueError(f"{where} holds no credit; config.sft.filter='credit' needs an archive written with it")
  R = len(layout.roles)
  weight_NxR = {"all": lambda: np.ones((len(transcripts), R)),
                "right": lambda: np.repeat((arrays["team_reward"] >= 1)[:, None], R, 1),
                "credit": lambda: np.maximum(arrays["credit"], 0)}[cfg.filter]()
  weight_SxNxR = weight_NxR.reshape(S, -1, R).astype(np.float32)  # rows are seed-major
  empty = np.flatnonzero(weight_SxNxR.sum((1, 2)) == 0)
  if len(empty):
    raise ValueError(f"{where}: seed {int(empty[0])} has no transcript that config.sft.filter={cfg.filter!r} "
                     f"keeps; allowed: another of {list(sft.FILTERS)}")
  seeds = lambda x: np.broadcast_to(x, (exp.config.num_seeds,) + x.shape[1:])
  return sft.Archived(tokens_SxNxT=seeds(arrays["tokens"].reshape(S, -1, arrays["tokens"].shape[-1])),
                      weight_SxNxR=seeds(weight_SxNxR))
