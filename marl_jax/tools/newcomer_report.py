"""How a finished newcomer run (`marl_jax.newcomers`) recovered the accuracy of the team it joined:

  python -m marl_jax.tools.newcomer_report --workdir=NEWCOMER_RUN [--out=FILE.json]

prints per seed the team's final evaluation accuracy, the run's at step 0 and at its end, the evaluated
steps it took to reach the team's accuracy, and each role's code agreement with the team
(`generations.recovery`).  A module of its own because it reads runs through the training loop, which
imports `marl_jax.newcomers`.
"""
import argparse
import json

from marl_jax import cli, workdir
from marl_jax.tools import generations


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="python -m marl_jax.tools.newcomer_report",
                                   description="How a newcomer run recovered the accuracy of the team it joined.")
  parser.add_argument("--workdir", required=True, help="a finished run with config.newcomers.roles")
  parser.add_argument("--out", default="", help="write the report here (JSON)")
  args = parser.parse_args(argv)
  with cli.refusing_bad_input(parser):
    out = generations.recovery(args.workdir)
  agreement = {k: v for k, v in out.items() if k.endswith("_agreement")}
  print(f"newcomers {out['newcomers']['roles']!r} joining {out['team']}")
  print("seed  team  start  final  steps to the team's accuracy  " + "  ".join(agreement))
  for s, (target, start, final, steps) in enumerate(zip(out["target"], out["start_accuracy"], out["final_accuracy"],
                                                         out["steps_to_recover"])):
    print(f"{s:>4}  {target:.3f}  {start:.3f}  {final:.3f}  {steps:>6.0f}  "
          + "  ".join(f"{v[s]:.3f}" for v in agreement.values()))
  if args.out:
    workdir.write_atomically(args.out, json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
