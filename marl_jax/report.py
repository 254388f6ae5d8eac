"""Results table from finished runs: mean +- std over seeds of final and peak eval accuracy.

  python -m marl_jax.report DIR [DIR ...]          (each DIR a workdir; its seeds are vmapped runs)
"""
import sys

import numpy as np

from marl_jax import metrics


def seed_values(row: dict, name: str) -> np.ndarray:
  per_seed = sorted((k for k in row if k.startswith(f"{name}/seed")), key=lambda k: int(k.split("seed")[1]))
  return np.array([row[k] for k in per_seed] or [row[name]])


def summarize(workdir: str) -> dict:
  rows = [r for r in metrics.read(workdir) if "eval_accuracy" in r]
  acc_NxS = np.stack([seed_values(r, "eval_accuracy") for r in rows])
  out = {"workdir": workdir, "seeds": acc_NxS.shape[1], "steps": rows[-1]["step"],
         "base": acc_NxS[0], "final": acc_NxS[-1], "peak": acc_NxS[1:].max(0)}
  if "eval_false_accept" in rows[-1]:
    out["false_accept"] = seed_values(rows[-1], "eval_false_accept")
    out["false_reject"] = seed_values(rows[-1], "eval_false_reject")
  return out


def fmt(values) -> str:
  return f"{100 * np.mean(values):.1f} ± {100 * np.std(values):.1f}"


def main(workdirs):
  cols = ("base", "final", "peak", "false_accept", "false_reject")
  print("| run | seeds | steps | " + " | ".join(f"{c} (%)" for c in cols) + " |")
  print("|---" * (3 + len(cols)) + "|")
  for workdir in workdirs:
    s = summarize(workdir)
    cells = [fmt(s[c]) if c in s else "–" for c in cols]
    print(f"| {workdir} | {s['seeds']} | {s['steps']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  main(sys.argv[1:])
