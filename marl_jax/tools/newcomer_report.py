"""How a finished newcomer run (`marl_jax.newcomers`) recovered the accuracy of the team it joined:

  python -m marl_jax.tools.newcomer_report --workdir=NEWCOMER_RUN [--out=FILE.json]

prints per seed the team's final evaluation accuracy, the run's at step 0 and at its end, the evaluated
steps it took to reach the team's accuracy, and each role's code agreement with the team
(`recovery`).
"""
import argparse
import json

from marl_jax import cli, configs, files, metrics
from marl_jax.tools import generations, runs


def recovery(workdir: str) -> dict:
  """How a newcomer run (`config.newcomers`) recovered the accuracy of the team it joined, per seed:
  the team's final evaluation accuracy (`target`), the run's accuracy at step 0 (the joined team, after
  any distillation) and at its end, the steps it took to reach the target (inf: never), and per role
  the share of evaluation problems on which its final team writes the team's greedy messages."""
  config = configs.read_run_config(workdir)
  if not str(config.newcomers.roles).strip():
    raise ValueError(f"{workdir} is not a newcomer run (its config.newcomers.roles is empty)")
  team = config.init_from
  target_S = runs.seed_values(runs.final_eval(team.removesuffix(":best")), "eval_accuracy")
  rows = [r for r in metrics.read(workdir) if "eval_accuracy" in r]
  return {"team": team, "newcomers": config.newcomers.to_dict(), "target": target_S.tolist(),
          "start_accuracy": runs.seed_values(rows[0], "eval_accuracy").tolist(),
          "final_accuracy": runs.seed_values(rows[-1], "eval_accuracy").tolist(),
          "steps_to_recover": runs.steps_to(workdir, target_S).tolist(), **generations.code_agreement(workdir, team)}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="python -m marl_jax.tools.newcomer_report",
                                   description="How a newcomer run recovered the accuracy of the team it joined.")
  parser.add_argument("--workdir", required=True, help="a finished run with config.newcomers.roles")
  parser.add_argument("--out", default="", help="write the report here (JSON)")
  args = parser.parse_args(argv)
  with cli.refusing_bad_input(parser):
    out = recovery(args.workdir)
  agreement = {k: v for k, v in out.items() if k.endswith("_agreement")}
  print(f"newcomers {out['newcomers']['roles']!r} joining {out['team']}")
  print("seed  team  start  final  steps to the team's accuracy  " + "  ".join(agreement))
  for s, (target, start, final, steps) in enumerate(zip(out["target"], out["start_accuracy"], out["final_accuracy"],
                                                         out["steps_to_recover"])):
    print(f"{s:>4}  {target:.3f}  {start:.3f}  {final:.3f}  {steps:>6.0f}  "
          + "  ".join(f"{v[s]:.3f}" for v in agreement.values()))
  if args.out:
    files.write_atomically(args.out, json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
