"""Metric writers: DIR/metrics.jsonl (one object per logged step), TensorBoard events, progress bar."""
import json
import os

import numpy as np
import tqdm
from tensorboardX import SummaryWriter


def per_seed(name: str, values_S) -> dict:
  """`name` is the mean over seeds; with several seeds `name/seed{i}` holds each seed's value."""
  values_S = np.asarray(values_S, dtype=np.float64).reshape(-1)
  out = {name: float(values_S.mean())}
  if len(values_S) > 1:
    out.update({f"{name}/seed{i}": float(v) for i, v in enumerate(values_S)})
  return out


class Writer:
  """Appends to metrics.jsonl (a resumed run continues the file; never truncates it)."""

  def __init__(self, workdir: str, total_steps: int, initial_step: int, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    self.jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
    self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
    self.bar = tqdm.tqdm(total=total_steps, initial=initial_step, dynamic_ncols=True, desc="train")

  def write(self, step: int, scalars: dict):
    if not self.enabled:
      return
    row = {"step": int(step), **{k: float(v) for k, v in scalars.items()}}
    self.jsonl.write(json.dumps(row) + "\n")
    self.jsonl.flush()
    for k, v in scalars.items():
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
  """Rows of metrics.jsonl; when a resumed run logged a step again, its later row wins."""
  rows = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      rows[row["step"]] = {**rows.get(row["step"], {}), **row}
  return [rows[s] for s in sorted(rows)]
