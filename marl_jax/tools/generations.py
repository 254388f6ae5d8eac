r"""Generations (issue 50): a team's experience handed on.  Generation 0 trains as any run does; its
team then plays `config.archive.size` training problems per seed (`archive.training_problems`, never
the evaluation set) and the transcripts are archived; generation g + 1 starts from fresh parameters,
is distilled from generation g's archive (each role its own role's messages, the transcripts that
`config.distil.filter` keeps: `right`, `all` or `credit`; `marl_jax.sft`) and then trains with RL as
usual.  Seed s of every generation distils seed s of the one before, so the seeds are lineages.

  python -m marl_jax.tools.generations --config=experiments/generations.py:task=signalling --workdir=DIR

DIR/genG is generation G's run directory (config.json, metrics.jsonl, checkpoints) and DIR/genG/transcripts
its archive.  Rerunning the command resumes: a generation trained and archived is kept as it is, an
unfinished one resumes as any run does (a signal stops the command after saving).  At the end it
writes DIR/generations.json and prints, per generation, its final evaluation accuracy, its code
(`eval_topsim`, `eval_mutual_information`, where the task logs them), the steps it took to reach the
previous generation's final accuracy, beside the steps generation 0 (from scratch, on the same seeds)
took to reach that accuracy, and the share of evaluation problems on which each role writes the
previous generation's messages (greedy).
"""
import json
import os
import re
import sys

import jax
import ml_collections
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from marl_jax import array_records, checks, cli, codes, configs, evaluate, experiment, files, loop, metrics, sft, state
from marl_jax.tools import archive, intervals, report, runs
from marl_jax.transcripts import MarlTranscripts


def generation_dir(workdir: str, g: int) -> str:
  return os.path.join(workdir, f"gen{g}")


def archive_dir(workdir: str, g: int) -> str:
  return os.path.join(generation_dir(workdir, g), "transcripts")


INHERIT = ("distil", "team")  # config.inherit: what generation g + 1 starts from


def stages(config) -> list[str]:
  """Each generation's overrides of `config.run` (`config.stages`: ';'-separated, one a generation,
  each 'KEY=VALUE,...' of the run's settings; the last one also serves every later generation)."""
  return str(config.stages).split(";") if config.stages else [""]


def stage_run(config, g: int) -> ml_collections.ConfigDict:
  """`config.run` with generation g's overrides (`stages`); refuses (ValueError) a key the run lacks."""
  c = ml_collections.ConfigDict(config.run.to_dict())
  flat = _flattened(c)
  for item in filter(None, stages(config)[min(g, len(stages(config)) - 1)].split(",")):
    key, _, value = item.partition("=")
    if key not in flat:
      raise ValueError(f"config.stages sets {key!r} for generation {g}; allowed: settings of config.run "
                       f"(e.g. task.ops, total_steps)")
    try:
      c.update_from_flattened_dict({key: configs.parse_arg(f"v={value}", v=flat[key]).v})
    except ValueError:
      raise ValueError(f"config.stages sets {key}={value!r} for generation {g}; allowed: a value of the type of "
                       f"config.run.{key} ({type(flat[key]).__name__})") from None
  return c


def _flattened(c: ml_collections.ConfigDict, prefix: str = "") -> dict:
  out = {}
  for key, value in c.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(_flattened(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def archive_name(config, g: int) -> str:
  return archive.archive_name(stage_run(config, g).total_steps, config.archive.greedy, config.archive.size)


def transcripts_path(config, workdir: str, g: int) -> str:
  """Where generation g's archive is (`config.sft.transcripts` of generation g + 1)."""
  return os.path.join(archive_dir(workdir, g), MarlTranscripts.name, archive_name(config, g))


def generation_config(config, workdir: str, g: int) -> ml_collections.ConfigDict:
  """Generation g's run: `config.run` with its stage's overrides, and after generation 0, by
  `config.inherit`:

  - `distil`: fresh parameters, with a warm start that distils the previous generation's archive
    instead of the workflow's demonstrations;
  - `team`: the previous generation's team carries on (`init_from`), through its run's warm start if
    it has one (the team joins as every role's newcomer from itself, so that the warm start trains
    it), in which `config.replay` of each batch replays the previous generation's archive."""
  c = stage_run(config, g)
  if g and config.inherit == "distil":
    c.sft.update(steps=config.distil.steps, transcripts=transcripts_path(config, workdir, g - 1),
                 filter=config.distil.filter)
  elif g:
    previous = generation_dir(workdir, g - 1)
    c.init_from = previous
    if c.sft.steps:
      roles = experiment.build(c).layout.roles
      c.newcomers.update(roles=",".join(roles), source=previous, distil=True)
      if config.replay:
        c.sft.update(transcripts=transcripts_path(config, workdir, g - 1), filter=config.distil.filter,
                     archive_share=config.replay)
  return c


def check(config, workdir: str) -> None:
  """Every setting, and the runs of generations 0 and 1, before anything compiles (the archive a
  generation distils is read when it starts)."""
  checks.integer("generations", config.generations, 1)
  checks.integer("archive.size", config.archive.size, 1)
  checks.integer("distil.steps", config.distil.steps, 1)
  if config.distil.filter not in sft.FILTERS:
    raise ValueError(f"config.distil.filter={config.distil.filter!r} is unknown; allowed: {list(sft.FILTERS)}")
  if config.inherit not in INHERIT:
    raise ValueError(f"config.inherit={config.inherit!r} is unknown; allowed: {list(INHERIT)}")
  checks.probability("replay", config.replay)
  if config.replay and config.inherit != "team":
    raise ValueError(f"config.replay={config.replay} replays an archive while the team carries on; allowed: 0 "
                     f"with config.inherit='distil'")
  for g in range(config.generations):
    try:
      experiment.build(generation_config(config, workdir, g))
    except ValueError as e:
      raise ValueError(f"generation {g}'s run (config.run, config.stages): {e}") from e


def code_agreement(workdir: str, reference: str) -> dict[str, list[float]]:
  """`ROLE_agreement` per seed: the share of evaluation problems on which the final team of run
  `workdir` writes, greedily, the same messages for ROLE as the team of `reference` (a run directory,
  or `DIR:best`) does (`codes.agreement` over the role's message slots)."""
  exp = experiment.build(configs.read_run_config(workdir))
  problems = evaluate.eval_problems(exp, exp.config.eval.data_dir)
  S, N = exp.config.num_seeds, problems["prompt"].shape[0]
  now, before = (archive.sample_transcripts(exp, loop.load_params(exp, w), problems, jax.random.PRNGKey(0),
                                            greedy=True, with_credit=False)["tokens"].reshape(S, N, -1)
                 for w in (workdir, reference))
  out = {}
  for r, role in enumerate(exp.layout.roles):
    slots = np.concatenate([np.arange(*exp.layout.turn_slices[i]) for i in exp.layout.role_turns(r)])
    out[f"{role}_agreement"] = [float(codes.agreement(now[s][:, slots], before[s][:, slots])) for s in range(S)]
  return out


def summary(config, workdir: str) -> list[dict]:
  """Per generation: final evaluation values per seed, and from generation 1 on the steps it took to
  reach the previous generation's final accuracy (per seed), those generation 0 took, and how much of
  the previous generation's code each role writes (`code_agreement`)."""
  out = []
  for g in range(config.generations):
    d = generation_dir(workdir, g)
    last = runs.final_eval(d)
    row = {"generation": g, **{key: runs.seed_values(last, f"eval_{key}").tolist()
                               for key in ("accuracy", "topsim", "mutual_information") if f"eval_{key}" in last}}
    if g and config.inherit == "distil" and not config.stages:
      target_S = out[-1]["accuracy"]
      row["target"] = target_S
      row["steps_to_target"] = runs.steps_to(d, target_S).tolist()
      row["from_scratch_steps_to_target"] = runs.steps_to(generation_dir(workdir, 0), target_S).tolist()
    if g:
      row.update(code_agreement(d, generation_dir(workdir, g - 1)))
    if g and config.stages:
      row["first_task_accuracy"] = first_task_accuracy(workdir, g)
    out.append(row)
  return out


def first_task_accuracy(workdir: str, g: int) -> list[float]:
  """Retention: per seed, the greedy evaluation accuracy of generation g's final team on generation 0's
  task (its run's evaluation set)."""
  exp = experiment.build(configs.read_run_config(generation_dir(workdir, 0)))
  params_S = loop.load_params(exp, generation_dir(workdir, g))
  return np.asarray(state.to_host(evaluate.make_evaluate(exp)(params_S))["accuracy"]).tolist()


def markdown(rows: list[dict]) -> str:
  def mean(values):
    return f"{np.mean(values):.3f}" if values else ""

  def steps(values):
    reached = [v for v in values if np.isfinite(v)]
    return f"{np.mean(reached):.0f} ({len(reached)}/{len(values)} seeds)" if reached else f"never (0/{len(values)})"

  def agreement(row):
    return ", ".join(f"{k.removesuffix('_agreement')} {np.mean(v):.3f}" for k, v in row.items() if k.endswith("_agreement"))

  lines = ["| generation | final eval accuracy | eval topsim | eval MI (bits) | steps to the previous final | "
           "generation 0's steps to it | same messages as the previous | accuracy on generation 0's task |",
           "|---|---|---|---|---|---|---|---|"]
  for row in rows:
    lines.append(f"| {row['generation']} | {mean(row['accuracy'])} | {mean(row.get('topsim', []))} | "
                 f"{mean(row.get('mutual_information', []))} | "
                 f"{steps(row['steps_to_target']) if 'target' in row else ''} | "
                 f"{steps(row['from_scratch_steps_to_target']) if 'target' in row else ''} | {agreement(row)} | "
                 f"{mean(row.get('first_task_accuracy', []))} |")
  return "\n".join(lines)


def _censored(steps_S, budget: float) -> np.ndarray:
  """Steps with a seed that never reached its target counted at `budget` (a lower bound)."""
  return np.where(np.isfinite(steps_S), steps_S, budget)


def _row(*cells) -> str:
  return report.row(*cells).rstrip("\n")


def _ci(values, count: bool = True) -> str:
  return report.pm(*intervals.mean_ci(values), count=count)


def _steps(values_S) -> str:
  mean, half = intervals.mean_ci(values_S)
  return f"{mean:.0f} ± {half:.0f}"


def _paired(a_S, b_S, count: bool = True, steps: bool = False) -> str:
  """b − a per seed: its mean ± the half-width of the paired Student t interval, and the verdict."""
  diff, half = intervals.mean_ci(np.asarray(b_S, np.float64) - np.asarray(a_S, np.float64))
  shown = f"{diff:+.0f} ± {half:.0f}" if steps else report.pm(diff, half, sign=True, count=count)
  return f"{shown} ({intervals.verdict(diff, half)})"


NEWCOMER_RUN = re.compile(r"newcomer_(fresh|distilled)(?:_gen(\d+))?$")


def newcomer_runs(seed_set_dir: str) -> dict[tuple[int, str], str]:
  """The finished newcomer runs of a seed set's study directory, by (the generation whose team the
  newcomer joined, fresh or distilled), each generation's fresh one first: newcomer_NAME joined
  generation 0's, newcomer_NAME_genG generation G's."""
  runs = {}
  for entry in sorted(os.listdir(seed_set_dir)):
    match = NEWCOMER_RUN.match(entry)
    if match and os.path.isfile(os.path.join(seed_set_dir, entry, "recovery.json")):
      runs[int(match.group(2) or 0), match.group(1)] = os.path.join(seed_set_dir, entry)
  return dict(sorted(runs.items(), key=lambda item: (item[0][0], item[0][1] != "fresh")))


def update_steps(run_dir: str) -> int:
  """A run's update steps: its warm start's (a generation's distillation) and its RL steps."""
  config = configs.read_run_config(run_dir)
  return config.sft.steps + config.total_steps


def control_table(out: str, generations_rows: dict) -> list[str]:
  """The compute-matched control's lines: each generation against the run from scratch (`OUT/seedS/
  control`, generation 0's run for longer) at as many update steps as the generation's lineage had,
  distillations included, paired by seed; [] before the control has run."""
  lines = []
  for d, rows in generations_rows.items():
    control = generation_dir(os.path.join(out, d, "control"), 0)
    if not os.path.isfile(os.path.join(out, d, "control", "generations.json")):
      continue
    lineage = np.cumsum([update_steps(generation_dir(os.path.join(out, d), row["generation"])) for row in rows])
    start = configs.read_run_config(control).sft.steps
    for row, steps in zip(rows, lineage):
      at = runs.eval_at(control, int(steps) - start)
      if at is not None:
        scratch_S = runs.seed_values(at, "eval_accuracy")
        lines.append(_row(d, str(row["generation"]), str(steps), _ci(row["accuracy"], count=False),
                          _ci(scratch_S, count=False), _paired(scratch_S, row["accuracy"], count=False)))
  if not lines:
    return []
  return ["## Compute-matched control (each generation against a run from scratch for as many update steps)", "",
          "| seeds | generation | the lineage's update steps (RL and distillation) | generation's final (%) | from "
          "scratch at as many steps (%) | generation − from scratch (points, paired) |", "|---|---|---|---|---|---|",
          *lines, ""]


def study_tables(out: str) -> str:
  """The tables of docs/results/generations.md from what `scripts/generations_results.sh OUT` has
  finished (each seed set OUT/seedN: generations, newcomers, cross-play, retention), as markdown; a
  cell not finished yet is left out.  Means carry their 95% interval over seeds; steps of a seed that
  never reached its target count as the run's budget (a lower bound, marked with the seeds reached)."""
  sets = sorted((d for d in os.listdir(out) if d.startswith("seed")), key=lambda d: int(d[4:]))
  lines = []
  generations_rows = {d: files.read_json(os.path.join(out, d, "generations.json")) for d in sets
                      if os.path.isfile(os.path.join(out, d, "generations.json"))}
  if generations_rows:
    lines += ["## Generations", "", "| seeds | generation | final eval accuracy (%) | eval topsim | eval MI (bits) | "
              "steps to the previous final (reached) | generation 0's steps to it (reached) | paired difference "
              "(steps) | accuracy vs generation 0 (points, paired) | sender / receiver same messages as the previous |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for d, rows in generations_rows.items():
      budget = configs.read_run_config(generation_dir(os.path.join(out, d), 0)).total_steps
      for row in rows:
        cells = [d, str(row["generation"]), _ci(row["accuracy"], count=False), _ci(row.get("topsim", [])),
                 _ci(row.get("mutual_information", []))]
        if "target" in row:
          own, scratch = (np.asarray(row[k], np.float64) for k in ("steps_to_target", "from_scratch_steps_to_target"))
          cells += [f"{_steps(_censored(own, budget))} ({np.isfinite(own).sum()}/{len(own)})",
                    f"{_steps(_censored(scratch, budget))} ({np.isfinite(scratch).sum()}/{len(scratch)})",
                    _paired(_censored(scratch, budget), _censored(own, budget), steps=True),
                    _paired(rows[0]["accuracy"], row["accuracy"], count=False),
                    f"{np.mean(row['sender_agreement']):.2f} / {np.mean(row['receiver_agreement']):.2f}"]
        else:
          cells += [""] * 5
        lines.append(_row(*cells))
    lines.append("")
  lines += control_table(out, generations_rows)
  crossplay = {d: files.read_json(os.path.join(out, d, "crossplay.json")) for d in sets
               if os.path.isfile(os.path.join(out, d, "crossplay.json"))}
  if crossplay:
    lines += ["## Cross-play of generation 0's teams", "",
              "| seeds | self-play accuracy (%) | cross-play accuracy (%) | cross / self |", "|---|---|---|---|"]
    for d, c in crossplay.items():
      value_NxN = np.asarray(c["matrices"]["accuracy"])
      off_N = [np.delete(row, i).mean() for i, row in enumerate(value_NxN)]  # each sender with the others' receivers
      lines.append(_row(d, _ci(np.diag(value_NxN), count=False), _ci(off_N, count=False), f"{c['ratio']:.2f}"))
    lines.append("")
  newcomers_rows = {d: newcomer_runs(os.path.join(out, d)) for d in sets}
  if any(newcomers_rows.values()):
    lines += ["## Newcomers (a fresh receiver joins a generation's team, the sender frozen)", "",
              "| seeds | team | newcomer | team's accuracy (%) | at step 0 (%) | final (%) | steps to the team's accuracy "
              "(reached) | receiver's same messages as the team's |", "|---|---|---|---|---|---|---|---|"]
    for d, by_cell in newcomers_rows.items():
      steps = {}  # (generation, name) -> steps to recover per seed, censored at the budget
      for (g, name), run_dir in by_cell.items():
        r = files.read_json(os.path.join(run_dir, "recovery.json"))
        budget = configs.read_run_config(run_dir).total_steps
        reached = np.asarray(r["steps_to_recover"], np.float64)
        steps[g, name] = _censored(reached, budget)
        lines.append(_row(d, f"generation {g}", name, _ci(r["target"], count=False), _ci(r["start_accuracy"], count=False),
                          _ci(r["final_accuracy"], count=False),
                          f"{_steps(steps[g, name])} ({np.isfinite(reached).sum()}/{len(reached)})",
                          _ci(r["receiver_agreement"])))
      for g in sorted({g for g, _ in steps}):
        if {(g, "fresh"), (g, "distilled")} <= set(steps):
          lines.append(_row(d, f"generation {g}", "distilled − fresh (paired)", "", "", "",
                            _paired(steps[g, "fresh"], steps[g, "distilled"], steps=True), ""))
        if g and {(0, "fresh"), (g, "fresh")} <= set(steps):
          lines.append(_row(d, f"generation {g} − generation 0", "fresh (paired)", "", "", "",
                            _paired(steps[0, "fresh"], steps[g, "fresh"], steps=True), ""))
    lines.append("")
  # Retention: each order of the two arithmetic tasks (its directories' prefix, A's and B's names).
  for prefix, first, second in (("retention", "additions", "multiplications"),
                                ("retention_mul", "multiplications", "additions")):
    retention_rows = {d: {replay: files.read_json(os.path.join(out, d, f"{prefix}_replay{replay}", "generations.json"))
                          for replay in ("0", "0.5")
                          if os.path.isfile(os.path.join(out, d, f"{prefix}_replay{replay}", "generations.json"))}
                      for d in sets}
    if not any(retention_rows.values()):
      continue
    lines += [f"## Retention (arithmetic: A = {first}, then B = {second}, then A again)", "",
              "| seeds | B's warm start replaying A's archive | A before B (%) | B after B (%) | A after B (%) | "
              "A after B − before (points, paired) |", "|---|---|---|---|---|---|"]
    for d, by_replay in retention_rows.items():
      for replay, rows in by_replay.items():
        lines.append(_row(d, f"{float(replay):.0%}", _ci(rows[0]["accuracy"], count=False),
                          _ci(rows[1]["accuracy"], count=False), _ci(rows[1]["first_task_accuracy"], count=False),
                          _paired(rows[0]["accuracy"], rows[1]["first_task_accuracy"], count=False)))
      if len(by_replay) == 2:
        lines.append(_row(d, "replay − none (paired)", "", "", "", _paired(
            by_replay["0"][1]["first_task_accuracy"], by_replay["0.5"][1]["first_task_accuracy"], count=False)))
    lines.append("")
  return "\n".join(lines)


def plot_study(out: str, path: str) -> None:
  """Evaluation accuracy against the lineage's update steps (distillations included) for each generation
  and, once it has run, the compute-matched control from scratch (mean over seeds, its 95% band), one
  panel per seed set, as a PNG at `path`."""
  from matplotlib.figure import Figure  # the plot alone needs it
  sets = sorted((d for d in os.listdir(out) if os.path.isdir(generation_dir(os.path.join(out, d), 0))),
                key=lambda d: int(d[4:]))
  fig = Figure(figsize=(5 * len(sets), 3.6))
  for i, d in enumerate(sets):
    ax = fig.add_subplot(1, len(sets), i + 1)

    def curve(run_dir, before, label, **style):  # its evaluations at the lineage's update steps
      rows = [r for r in metrics.read(run_dir) if "eval_accuracy" in r]
      steps = before + configs.read_run_config(run_dir).sft.steps + np.array([r["step"] for r in rows])
      mean_N, half_N = (np.array(x) for x in zip(*[intervals.mean_ci(runs.seed_values(r, "eval_accuracy"))
                                                   for r in rows]))
      ax.plot(steps, mean_N, label=label, **style)
      ax.fill_between(steps, mean_N - half_N, mean_N + half_N, alpha=0.2)

    g, before = 0, 0
    while os.path.isfile(os.path.join(generation_dir(os.path.join(out, d), g), "metrics.jsonl")):
      curve(generation_dir(os.path.join(out, d), g), before,
            "generation 0" if g == 0 else f"generation {g} (distilled from {g - 1})")
      before += update_steps(generation_dir(os.path.join(out, d), g))
      g += 1
    control = generation_dir(os.path.join(out, d, "control"), 0)
    if os.path.isfile(os.path.join(control, "metrics.jsonl")):
      curve(control, 0, "from scratch (the control)", color="black", linestyle="--")
    ax.set(title=f"seeds {d[4:]}.. (10 vmapped)", xlabel="update steps of the lineage (RL and distillation)",
           ylabel="eval accuracy")
    ax.axhline(0.25, color="grey", linestyle=":", linewidth=1)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def run(config, workdir: str) -> str:
  """Trains and archives the generations not yet done, then writes the summary (returns its table)."""
  try:
    check(config, workdir)
  except ValueError as e:
    raise experiment.ConfigError(str(e)) from e
  for g in range(config.generations):
    d, total = generation_dir(workdir, g), stage_run(config, g).total_steps
    if not runs.finished(d, total):
      loop.train_and_evaluate(generation_config(config, workdir, g), d)
      if not runs.finished(d, total):
        raise SystemExit(f"stopped by a signal in {d}; run the same command again to resume")
    if not array_records.exists(MarlTranscripts, archive_name(config, g), archive_dir(workdir, g)):
      archive.archive_workdir(d, archive_dir(workdir, g), config.archive.greedy, train=config.archive.size)
  rows = summary(config, workdir)
  files.write_atomically(os.path.join(workdir, "generations.json"), json.dumps(rows, indent=1))
  return markdown(rows)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  try:
    print(run(flags.FLAGS.config, flags.FLAGS.workdir))
  except experiment.ConfigError as e:  # one line, no traceback, exit status 1
    sys.exit(f"FATAL ConfigError: {e}")


if __name__ == "__main__":
  # Defined here, not on import: the docs and the tests import this module beside others that define
  # the same flags (`benchmark`).
  config_flags.DEFINE_config_file("config", None, "Generations config (experiments/generations.py).")
  flags.DEFINE_string("workdir", None, "Directory of the generations; finished ones are kept.")
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main, flags_parser=cli.parse_flags)
