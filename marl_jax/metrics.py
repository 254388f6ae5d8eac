"""Metric writers: DIR/metrics.jsonl (one object per logged step), TensorBoard events, progress bar."""
import json
import math
import os

import numpy as np
import tqdm
from tensorboardX import SummaryWriter

from marl_jax import files


def per_seed(name: str, values_S) -> dict:
  """`name` is the mean over seeds; with several seeds `name/seed{i}` holds each seed's value."""
  values_S = np.asarray(values_S, dtype=np.float64).reshape(-1)
  out = {name: float(values_S.mean())}
  if len(values_S) > 1:
    out.update({f"{name}/seed{i}": float(v) for i, v in enumerate(values_S)})
  return out


class Writer:
  """Writes metrics.jsonl and TensorBoard events.  A run resumed from checkpoint `resume_step` (None:
  a run from scratch) first drops the rows past it, which a killed run logged after its last
  checkpoint and this run logs again, so the file holds each step once; TensorBoard hides those
  events (`purge_step`)."""

  def __init__(self, workdir: str, total_steps: int, resume_step: int | None, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    path = os.path.join(workdir, "metrics.jsonl")
    kept = [r for r in (read(workdir) if os.path.exists(path) else [])
            if resume_step is not None and r["step"] <= resume_step]
    files.write_atomically(path, "".join(json.dumps(r) + "\n" for r in kept))
    self.jsonl = open(path, "a")
    first = 0 if resume_step is None else resume_step + 1
    self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=first)
    self.bar = tqdm.tqdm(total=total_steps, initial=resume_step or 0, dynamic_ncols=True, desc="train")

  def write(self, step: int, scalars: dict):
    if not self.enabled:
      return
    row = {"step": int(step), **{k: float(v) for k, v in scalars.items()}}
    self.jsonl.write(json.dumps(row) + "\n")
    self.jsonl.flush()
    for k, v in scalars.items():
      if math.isfinite(v):  # NaN (a diagnostic undefined at this step, or a diverged seed) stays in the jsonl
        self.tb.add_scalar(k, float(v), step)
    shown = {k: f"{row[k]:.3f}" for k in ("eval_accuracy", "accuracy", "reward") if k in row}
    self.bar.set_postfix(shown, refresh=False)

  def advance(self, step: int):
    if self.enabled:
      self.bar.update(step - self.bar.n)

  def close(self):
    if self.enabled:
      self.bar.close()
      self.tb.close()
      self.jsonl.close()


def read(workdir: str) -> list[dict]:
  """Rows of metrics.jsonl by step.  A line cut short by a killed process is skipped, and where a
  file written before resumed runs dropped their repeated rows (see `Writer`) holds a step twice,
  the later row wins, and a blank line is skipped; any other line that is not a row (a JSON object
  with an integer "step") is refused with a ValueError naming the file and the line, as is a workdir
  without the file."""
  rows = {}
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):  # a run not yet past its warm start, or a mistyped workdir
    raise ValueError(f"{path} is not there: no step logged yet; allowed: the workdir of a run")
  with open(path, "rb") as f:  # bytes: a line that is not UTF-8 is refused by its number as well
    for number, line in enumerate(f, 1):
      if not line.endswith(b"\n") or not line.strip():  # cut short, or blank
        continue
      try:
        row = json.loads(line)
      except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        detail = f"{e.msg} at column {e.pos + 1}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise ValueError(f"{path} line {number} is not JSON ({detail}); allowed: one JSON object per "
                         f"line, a logged step's metrics") from None
      if not (isinstance(row, dict) and type(row.get("step")) is int):
        shown = line.decode(errors="replace").strip()[:60]
        raise ValueError(f"{path} line {number} is not a metrics row ({shown}); allowed: a JSON object "
                         f"with an integer \"step\"")
      rows[row["step"]] = {**rows.get(row["step"], {}), **row}
  return [rows[s] for s in sorted(rows)]
