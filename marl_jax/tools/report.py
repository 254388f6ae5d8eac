"""Results tables from finished runs, with 95% confidence intervals over seeds.

  python -m marl_jax.tools.report DIR [DIR ...]           one row per run: mean ± CI half-width, then std
  python -m marl_jax.tools.report --compare A B           B − A with a Welch interval: established or not
  python -m marl_jax.tools.report --compare A B --paired  B − A per seed (same config.seed and num_seeds)
  python -m marl_jax.tools.report --split SINGLE MULTI    gain split: base → single-agent RL → multi-agent RL
  python -m marl_jax.tools.report --seeds DIR             one row per seed, diverged seeds and the spread
  python -m marl_jax.tools.report --plot DIR FILE         a run rewarded by its judges, plotted (PNG)
  python -m marl_jax.tools.report --rates FILE DIR [DIR ...]  runs rewarded by their judges against audit rate (PNG)
  python -m marl_jax.tools.report --judges-at 0,5,100 DIR [DIR ...]  the judges' AUROC of each statement at those steps
  python -m marl_jax.tools.report --target=30 DIR [DIR ...]   with a column: the steps each seed took to 30 %

The team's accuracy (base, final, peak, drop) stands beside each member's own (`ROLE/member_accuracy`,
where the workflow's members answer) and the average member's (`member_accuracy`), so --compare puts a
team's average member against a single agent (its own only member).  Each DIR is a workdir; its seeds are the vmapped runs (`NAME/seedI` in metrics.jsonl), labelled
config.seed + I: seed I's key is split(PRNGKey(config.seed), num_seeds)[I], so a seed is rerun with its
whole set, not with --config.seed=config.seed + I.  Intervals of a mean are Student t with n − 1 dof; of
a difference of two runs' means, Welch (unequal variances, Welch–Satterthwaite dof), or with --paired
Student t over the per-seed differences (runs from one warm start per seed, say); of the split's
shares, a percentile bootstrap over seeds (of a single-agent run, one role, and a multi-agent run on the
same task and evaluation set: others are refused).  With one seed an
interval is undefined and prints as n/a.  Accuracies print in %, drops and gains in points.
"""
import argparse
import math
import os
import warnings

import numpy as np

from marl_jax import cli, configs, metrics, protocols, tasks
from marl_jax import workdir as workdir_lib
from marl_jax.tools import intervals, runs

REFERENCE_SPLIT = "70 / 30 at 0.6B (Zeng et al. 2026)"  # single-agent / multi-agent share of the gain


# Each workflow's own diagnostics at the last evaluation, where a run logs them (README, Workflows):
# the solver-verifier's verdicts, role collapse among parallel agents, the judge, the debate's
# revisions, delegation, the judges of a run rewarded by them (their agreement, effective number and
# false accepts with the covert channel replaced by noise).  Rates print in %, counts (`COUNTS`) as
# they are.
DIAGNOSTICS = ("false_accept", "false_reject", "same_message_rate", "agreement", "oracle", "judge_precision",
               "readable_pick", "fix_rate", "break_rate", "workers_used", "serial_collapse", "spurious_parallelism",
               "critical_steps", "judge_agreement", "effective_judges", "ablated_false_accept")
# Rewards from peers (`config.reward.source=peer`, docs/peer_review.md): the checker's accuracy, what the
# judges' verdict reported of it, the distortion between them and the ground-truth labels the loss
# consumed per episode, at the last training step that logs them (evaluation always uses the checker).
PEER = ("true_accuracy", "reported_accuracy", "distortion", "labels_per_episode")
# And the time to collusion: the first training step whose judges' mean false accept (`JUDGE/false_accept`)
# exceeds 1/2, per seed (undefined for a seed whose judges never get there).
COLLUSION = "time_to_collusion"
# With --target: per seed, the first evaluated step whose accuracy reaches the target (undefined for a
# seed that never does): how fast a run learns, at the resolution of its evaluations (`eval_every`).
TO_TARGET = "steps_to_target"
PER_EPISODE = ("workers_used", "critical_steps", "labels_per_episode")
COUNTS = PER_EPISODE + ("effective_judges", COLLUSION, TO_TARGET)  # printed as they are, not in %
COLUMNS = DIAGNOSTICS + PEER + (COLLUSION, TO_TARGET)  # beside the accuracies, where a run logs them
# Each judge's own at the last evaluation (`JUDGE/NAME`), after them.
JUDGE_RATES = ("balanced_accuracy", "auroc", "auroc_expected")
# Each member's own accuracy (`ROLE/member_accuracy`, `protocols.engine.member_accuracy`: a candidate's,
# a voter's, a debater's, a worker's answer, or a single agent's, its only member's), and the average
# member (`member_accuracy`: the mean over a run's members per seed), beside the team's accuracy.
MEMBER = "member_accuracy"


def read_config(workdir: str) -> dict | None:
  """A run's config.json as a dict; None for a run without one.  ValueError naming the file when it is
  not a JSON object."""
  if not os.path.exists(os.path.join(workdir, "config.json")):
    return None
  return configs.read_saved(workdir)


def member_names(row: dict) -> list[str]:
  """`ROLE/member_accuracy` of each member an evaluation row (of metrics.jsonl) scores, in logged order
  (not those of a protocol's counterfactual, `eval_ablated_*`)."""
  return [k[len("eval_"):] for k in dict.fromkeys(k.rsplit("/seed", 1)[0] for k in row)
          if k.startswith("eval_") and not k.startswith("eval_ablated_") and k.endswith(f"/{MEMBER}")]


def summarize(workdir: str, target: float | None = None) -> dict:
  """Per-seed arrays (fractions) of a run's evals: base (step 0), final, peak (after step 0), drop, and
  with `target` (a fraction) the steps to it (`TO_TARGET`); with the run's first seed (`config.seed`).
  ValueError for a run with no evaluation yet."""
  logged = metrics.read(workdir)
  rows = [r for r in logged if "eval_accuracy" in r]
  if not rows:
    raise ValueError(f"{workdir} has no evaluation yet (no eval_accuracy in its metrics.jsonl: a run "
                     f"still in its warm start, or one that stopped before step 0)")
  acc_NxS = np.stack([runs.seed_values(r, "eval_accuracy") for r in rows])
  after_base = acc_NxS[1:] if len(acc_NxS) > 1 else acc_NxS  # a run with only its step-0 eval
  first_seed = (read_config(workdir) or {}).get("seed", 0)
  out = {"workdir": workdir, "seeds": acc_NxS.shape[1], "first_seed": first_seed, "steps": rows[-1]["step"],
         "base": acc_NxS[0], "final": acc_NxS[-1], "peak": after_base.max(0)}
  out["drop"] = out["peak"] - out["final"]
  if target is not None:
    reached_NxS = acc_NxS >= target
    steps_N = np.array([r["step"] for r in rows], np.float64)
    out[TO_TARGET] = np.where(reached_NxS.any(0), steps_N[reached_NxS.argmax(0)], np.nan)
  members = member_names(rows[-1])
  for name in members:
    out[name] = runs.seed_values(rows[-1], f"eval_{name}")
  if members:
    with warnings.catch_warnings():  # a seed where no member's accuracy is defined: NaN
      warnings.simplefilter("ignore", RuntimeWarning)
      out[MEMBER] = np.nanmean(np.stack([out[name] for name in members]), 0)
  for name in DIAGNOSTICS:
    if f"eval_{name}" in rows[-1]:
      out[name] = runs.seed_values(rows[-1], f"eval_{name}")
  peer_rows = [r for r in logged if PEER[-1] in r or f"{PEER[-1]}/seed0" in r]
  for name in PEER if peer_rows else ():
    out[name] = runs.seed_values(peer_rows[-1], name)
  if peer_rows and judge_names(peer_rows[-1]):
    out[COLLUSION] = time_to_collusion(peer_rows)
    for name in judge_columns([{k[len("eval_"):]: v for k, v in rows[-1].items() if k.startswith("eval_")}]):
      out[name] = runs.seed_values(rows[-1], f"eval_{name}")
  return out


def judge_columns(summaries: list[dict]) -> list[str]:
  """Each judge's `JUDGE_RATES` (`JUDGE/NAME`) that the runs (summaries, or rows without `eval_`) hold."""
  names = dict.fromkeys(k.rsplit("/seed", 1)[0] for s in summaries for k in s)
  return [n for n in names if n.count("/") == 1 and n.split("/")[1] in JUDGE_RATES]


def judge_names(row: dict) -> list[str]:
  """The judges whose false accepts a training row logs (`JUDGE/false_accept`)."""
  return sorted({k.split("/")[0] for k in row if not k.startswith("eval_") and k.split("/")[1:2] == ["false_accept"]})


def time_to_collusion(rows: list[dict]) -> np.ndarray:
  """Per seed, the first step of training `rows` at which the judges' mean false accept exceeds 1/2;
  NaN for a seed where it never does."""
  judges = judge_names(rows[-1])
  false_accept_NxS = np.stack([np.mean([runs.seed_values(r, f"{j}/false_accept") for j in judges], 0) for r in rows])
  colluded_NxS = false_accept_NxS > 0.5
  steps_N = np.array([r["step"] for r in rows], np.float64)
  return np.where(colluded_NxS.any(0), steps_N[colluded_NxS.argmax(0)], np.nan)


# A seed diverged when one of these (or a role's loss, `ROLE/loss`) was logged non-finite, or when it
# skipped an update for a non-finite value (`skipped_updates`).
WATCHED = ("accuracy", "reward", "eval_accuracy")


def seed_health(rows: list[dict], num_seeds: int) -> dict:
  """Per seed, from a run's metrics rows: `skipped` (updates skipped for a non-finite value, as of the
  last row that counts them) and `nonfinite` (a watched value was ever logged non-finite)."""
  names = {key.rsplit("/seed", 1)[0] for r in rows for key in r}
  watched = [n for n in names if n in WATCHED or n.endswith("/loss")]
  nonfinite_S = np.zeros(num_seeds, bool)
  for r in rows:
    for name in watched:
      if name in r or f"{name}/seed0" in r:
        nonfinite_S |= ~np.isfinite(runs.seed_values(r, name))
  counted = [r for r in rows if "skipped_updates" in r]
  skipped_S = runs.seed_values(counted[-1], "skipped_updates") if counted else np.zeros(num_seeds)
  return {"skipped": np.broadcast_to(skipped_S, (num_seeds,)), "nonfinite": nonfinite_S}


# Printing (values ×100: % for accuracies and rates, points for differences; a count, one of `COUNTS`,
# as it is).

def num(x: float, sign: bool = False, count: bool = False) -> str:
  if not math.isfinite(x):
    return "n/a"
  return f"{x:{'+' if sign else ''}.2f}" if count else f"{100 * x:{'+' if sign else ''}.1f}"


def pm(mean: float, half: float, sign: bool = False, count: bool = False) -> str:
  return f"{num(mean, sign, count)} ± {num(half, count=count)}"


def interval(mean: float, half: float, count: bool = False) -> str:
  if not math.isfinite(half):
    return "n/a"
  return f"[{num(mean - half, True, count)}, {num(mean + half, True, count)}]"


def share_pct(share: float, lo: float, hi: float) -> str:
  return f"{100 * share:.0f}% " + (f"[{100 * lo:.0f}%, {100 * hi:.0f}%]" if math.isfinite(lo) else "[n/a]")


def seed_count(k: int, n: int) -> str:
  """The suffix ` (K of N seeds)` when only K of N seeds count, else an empty string."""
  return f" ({k} of {n} seeds)" if k < n else ""


def of_seeds(values_S) -> str:
  """`seed_count` of a diagnostic's defined seed values."""
  return seed_count(len(intervals.defined(values_S)), len(values_S))


def row(*cells) -> str:
  return "| " + " | ".join(map(str, cells)) + " |\n"


def member_columns(summaries: list[dict]) -> list[str]:
  """The average member, then each member of the runs (`ROLE/member_accuracy`), in the order logged."""
  names = dict.fromkeys(k for s in summaries for k in s if k.endswith(f"/{MEMBER}"))
  return ([MEMBER] if names else []) + list(names)


def table(summaries: list[dict]) -> str:
  cols = ["base", "final", *member_columns(summaries), "peak", "drop"]
  cols += [c for c in COLUMNS if any(c in s for s in summaries)] + judge_columns(summaries)
  head = row("run", "seeds", "steps", *cols) + "|---" * (3 + len(cols)) + "|\n"

  def mean_cell(c, x):
    return pm(*intervals.mean_ci(intervals.defined(x)), count=c in COUNTS) + of_seeds(x)

  def std_cell(c, x):
    x_defined = intervals.defined(x)
    return (num(np.std(x_defined, ddof=1), count=c in COUNTS) if len(x_defined) > 1 else "n/a") + of_seeds(x)

  cells = lambda s, fmt: [fmt(c, s[c]) if c in s else "–" for c in cols]
  means = [row(s["workdir"], s["seeds"], s["steps"], *cells(s, mean_cell)) for s in summaries]
  stds = [row(s["workdir"], s["seeds"], s["steps"], *cells(s, std_cell)) for s in summaries]
  return (f"Mean over seeds ± half-width of its {intervals.LEVEL:.0%} confidence interval (Student t, n − 1 dof), "
          f"in % (drop = peak − final per seed, in points; {', '.join(PER_EPISODE)} per episode; effective_judges "
          f"in judges; {COLLUSION} and {TO_TARGET} in steps):\n" + head +
          "".join(means) + "\nStandard deviation over seeds (ddof = 1), in % (counts as they are):\n" + head +
          "".join(stds))


def compare(a: dict, b: dict, paired: bool = False) -> str:
  """B − A of each metric: Welch over the two runs' seeds, or with `paired` Student t over the per-seed
  differences, for runs of the same seeds (ValueError otherwise)."""
  if paired and (a["first_seed"], a["seeds"]) != (b["first_seed"], b["seeds"]):
    raise ValueError(f"--paired needs runs of the same seeds: A has config.seed={a['first_seed']} and "
                     f"{a['seeds']} seeds, B config.seed={b['first_seed']} and {b['seeds']}")
  method = ("paired by seed: Student t interval of the mean of B − A per seed (n − 1 dof)" if paired else
            "Welch interval (unequal variances, Welch–Satterthwaite dof)")
  lines = [f"B − A of the mean over seeds, A = {a['workdir']} (seeds: {a['seeds']}), "
           f"B = {b['workdir']} (seeds: {b['seeds']}); {intervals.LEVEL:.0%} {method}; established when the "
           "interval excludes 0:\n",
           row("metric", "A", "B", "B − A", "interval", "dof", "verdict"), "|---" * 7 + "|\n"]
  # Accuracy, the members' (a team's average member against a single agent, itself its only member)
  # and the diagnostics both runs log (e.g. two delegate runs' serial-collapse rates).
  both = lambda names: [c for c in names if c in a and c in b]
  for c in ("final", *both(member_columns([a, b])), "peak", "drop", *both(COLUMNS + tuple(judge_columns([a, b])))):
    if paired:  # A, B and B − A over the seeds that both define
      both_S = np.isfinite(a[c]) & np.isfinite(b[c])
      a_S, b_S = a[c][both_S], b[c][both_S]
      diff, half = intervals.mean_ci(b_S - a_S)
      dof = len(a_S) - 1 if math.isfinite(half) else math.nan
      label = c + seed_count(len(a_S), len(both_S))
    else:
      a_S, b_S = intervals.defined(a[c]), intervals.defined(b[c])
      diff, half, dof = intervals.welch_diff(a_S, b_S)
      label = c + "".join(f", {side}{of_seeds(x)}" for side, x in (("A", a[c]), ("B", b[c])) if of_seeds(x))
    count = c in COUNTS
    lines.append(row(label, num(intervals.mean_ci(a_S)[0], count=count), num(intervals.mean_ci(b_S)[0], count=count),
                     pm(diff, half, sign=True, count=count), interval(diff, half, count),
                     f"{dof:.1f}" if math.isfinite(dof) else "n/a", intervals.verdict(diff, half)))
  return "".join(lines)


def roles(config: dict) -> tuple[str, ...]:
  """The roles of a run's workflow, from its config.json: the protocol built on its task (no model, no
  compile).  ValueError when config.json lacks them or they do not build."""
  protocol, task = config.get("protocol"), config.get("task")
  if not (isinstance(protocol, dict) and isinstance(task, dict) and "name" in protocol and "name" in task):
    raise ValueError("no config.protocol.name or config.task.name")
  if protocol["name"] == "single":
    return ("agent",)
  knobs = lambda group: {k: v for k, v in group.items() if k != "name"}
  return protocols.make(protocol["name"], tasks.make(task["name"], **knobs(task)), **knobs(protocol)).roles


def task_and_eval(config: dict) -> dict:
  """The settings that make a run's problems: `task.KEY` (each of its task's settings, at its default
  where config.json omits it, as experiment files set different subsets) and `eval.KEY` (but
  `eval.data_dir`, where the set is stored)."""
  # config["task"] is a dict: `roles` checked it.
  task = {**workdir_lib.saved_defaults("task", config["task"].get("name")), **config["task"]}
  evaluation = config.get("eval") if isinstance(config.get("eval"), dict) else {}
  evaluation = {k: v for k, v in evaluation.items() if k != "data_dir"}
  return {**{f"task.{k}": v for k, v in task.items()}, **{f"eval.{k}": v for k, v in evaluation.items()}}


def check_split(single_dir: str, multi_dir: str) -> None:
  """Refuses (ValueError) runs that `split` cannot compare: SINGLE not a single-agent run (one role),
  MULTI not a multi-agent one, or the two on different tasks or evaluation sets."""
  settings = {}
  for flag, workdir in (("SINGLE", single_dir), ("MULTI", multi_dir)):
    config = read_config(workdir)
    if config is None:
      raise ValueError(f"--split {flag}={workdir} has no config.json, so its workflow and task are unknown; "
                       f"allowed: a run's workdir, which holds the config.json its run wrote")
    try:
      names = roles(config)
    except (ValueError, TypeError) as e:
      raise ValueError(f"--split {flag}={workdir}: the roles of its workflow do not follow from its "
                       f"config.json ({e})") from None
    protocol = config["protocol"]["name"]
    if flag == "SINGLE" and len(names) != 1:
      raise ValueError(f"--split SINGLE={workdir} is a multi-agent run (config.protocol.name={protocol!r}, "
                       f"roles {', '.join(names)}); allowed: a single-agent run, one role (e.g. "
                       f"config.protocol.name='single')")
    if flag == "MULTI" and len(names) < 2:
      raise ValueError(f"--split MULTI={workdir} is a single-agent run (config.protocol.name={protocol!r}, "
                       f"role {names[0]}); allowed: a multi-agent run, two roles or more")
    settings[flag] = task_and_eval(config)
  a, b = settings["SINGLE"], settings["MULTI"]
  differing = sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or a[k] != b[k])
  if "task.name" in differing:  # two tasks: their settings are not each other's
    differing = [k for k in differing if not k.startswith("task.") or k == "task.name"]
  if differing:
    value = lambda run, k: repr(run[k]) if k in run else "unset"
    shown = "; ".join(f"config.{k}: {value(a, k)} in SINGLE, {value(b, k)} in MULTI" for k in differing)
    raise ValueError(f"--split needs runs on the same task and evaluation set; {single_dir} and {multi_dir} "
                     f"differ in {shown}")


def split(single: dict, multi: dict) -> str:
  """base → single-agent RL (run `single`) → multi-agent RL (run `multi`), as in the published study."""
  gain_a, gain_b = single["final"] - single["base"], multi["final"] - multi["base"]  # per seed
  total = intervals.mean_ci(gain_b)
  stage_a = intervals.mean_ci(gain_a)
  stage_b = intervals.welch_diff(gain_a, gain_b)[:2]  # the rest of the total gain
  share, lo, hi = intervals.bootstrap_share(gain_a, gain_b)
  text = (f"Split of the gain, base → single-agent RL (A = {single['workdir']}) → multi-agent RL "
          f"(B = {multi['workdir']}). Gains in points, mean over seeds ± {intervals.LEVEL:.0%} half-width (Student t; "
          f"Welch for the multi-agent stage); shares with a {intervals.LEVEL:.0%} percentile bootstrap over seeds "
          f"(each run's seeds resampled independently, {intervals.BOOTSTRAP_DRAWS} draws, "
          f"rng seed {intervals.BOOTSTRAP_SEED}):\n" +
          row("stage", "gain", "share") + "|---" * 3 + "|\n" +
          row("single-agent RL (A final − A base)", pm(*stage_a, sign=True), share_pct(share, lo, hi)) +
          row("multi-agent RL (total − single-agent)", pm(*stage_b, sign=True),
              share_pct(1 - share, 1 - hi, 1 - lo)) +
          row("total (B final − B base)", pm(*total, sign=True), "100%") +
          f"\nsingle / multi: {100 * share:.0f} / {100 * (1 - share):.0f} here; "
          f"reference {REFERENCE_SPLIT}\n")
  if intervals.verdict(*total) != "established":
    text += "The total gain is not established (its interval includes 0, or is n/a): shares mean little.\n"
  return text


# The judges' scores whose AUROC `judges_at` tabulates: the statement written (sampled in training,
# greedy at evaluation), the mode of the judge's distribution over its levels, the probability it puts
# on right, and (evaluation only) a level drawn from that distribution.
JUDGE_SCORES = ("auroc", "auroc_greedy", "auroc_expected", "auroc_sampled")


def judges_at(workdir: str, steps: list[int]) -> str:
  """The judges' AUROC of each of `JUDGE_SCORES` (per seed the mean over the judges; mean ± CI over
  seeds, %) on the training batch and at evaluation, at each of `steps` a row was logged."""
  logged = metrics.read(workdir)
  lines = [f"{workdir}: the judges' AUROC (%), mean over judges, mean ± 95% CI over seeds:\n",
           row("answers", "step", *JUDGE_SCORES), "|---" * (2 + len(JUDGE_SCORES)) + "|\n"]
  for where, prefix in (("training batch (sampled)", ""), ("evaluation (greedy)", "eval_")):
    for step in steps:
      ours = lambda k: k.startswith(prefix) and (prefix or not k.startswith("eval_"))
      judges_of = lambda r: sorted({k[len(prefix):].split("/")[0] for k in r
                                    if ours(k) and k[len(prefix):].split("/")[1:2] == ["auroc"]})
      found = [r for r in logged if r["step"] == step and judges_of(r)]
      if not found:
        continue
      r = found[-1]
      judges = judges_of(r)
      cells = []
      for score in JUDGE_SCORES:
        if not all(f"{prefix}{j}/{score}" in r or f"{prefix}{j}/{score}/seed0" in r for j in judges):
          cells.append("")
          continue
        with warnings.catch_warnings():  # a seed without right or wrong answers: NaN
          warnings.simplefilter("ignore", RuntimeWarning)
          per_seed = np.nanmean([runs.seed_values(r, f"{prefix}{j}/{score}") for j in judges], 0)
        cells.append(pm(*intervals.mean_ci(intervals.defined(per_seed))))
      lines.append(row(where, step, *cells))
  return "".join(lines)


def seeds_table(workdir: str) -> str:
  """One row per seed, then how many diverged and the spread of the final accuracy."""
  s = summarize(workdir)
  health = seed_health(metrics.read(workdir), s["seeds"])
  lines = [f"{workdir}: {s['seeds']} seeds, {s['steps']} steps; accuracies in %, drop in points:\n",
           row("seed", "base", "final", "peak", "drop", "skipped updates", "non-finite"), "|---" * 7 + "|\n"]
  for i in range(s["seeds"]):
    lines.append(row(s["first_seed"] + i, num(s["base"][i]), num(s["final"][i]), num(s["peak"][i]), num(s["drop"][i]),
                     int(health["skipped"][i]), "yes" if health["nonfinite"][i] else "no"))
  diverged = health["nonfinite"] | (health["skipped"] > 0)
  final = s["final"]
  lines.append(
      f"\nDiverged: {int(diverged.sum())} of {s['seeds']} seeds ({int(health['nonfinite'].sum())} logged a "
      f"non-finite accuracy, reward or loss; {int((health['skipped'] > 0).sum())} skipped an update). "
      f"Ended below their base: {int((final < s['base']).sum())}. Final accuracy: min {num(final.min())}, "
      f"median {num(np.median(final))}, max {num(final.max())}, sd "
      f"{num(np.std(final, ddof=1)) if len(final) > 1 else 'n/a'}, mean {pm(*intervals.mean_ci(final))} (95% CI).\n")
  return "".join(lines)


def plot_peer(workdir: str, path: str) -> None:
  """A run rewarded by its judges against steps, means over seeds, written to `path` (PNG): the checker's
  accuracy, what the judges reported and the evaluated accuracy, with each seed's time to collusion
  (dotted); each judge's false accepts and false rejects in training, and at evaluation the false
  accepts with and without the covert channel; each judge's balanced accuracy and AUROC at evaluation;
  with a channel, each judge's information beyond chance (bits)."""
  from matplotlib.figure import Figure  # the plot alone needs it
  rows = metrics.read(workdir)
  trained = [r for r in rows if PEER[-1] in r or f"{PEER[-1]}/seed0" in r]
  if not trained:
    raise ValueError(f"--plot {workdir}: its metrics.jsonl holds no judges' metrics; allowed: a run with "
                     f"config.reward.source='peer'")
  evals = [r for r in rows if "eval_accuracy" in r]
  judges = judge_names(trained[-1])

  def curve(ax, name, from_rows, scale=100.0, **style):
    kept = [r for r in from_rows if name in r or f"{name}/seed0" in r]
    with warnings.catch_warnings():  # a step no seed defines stays NaN, a gap in the line
      warnings.simplefilter("ignore", RuntimeWarning)
      values = [scale * np.nanmean(runs.seed_values(r, name)) for r in kept]
    if kept:
      ax.plot([r["step"] for r in kept], values, label=name, **style)

  channel = any(f"eval_{j}/channel_information" in evals[-1] or f"eval_{j}/channel_information/seed0" in evals[-1]
                for j in judges) if evals else False
  fig = Figure(figsize=(5 * (3 + channel), 4))
  axes = fig.subplots(1, 3 + channel)
  for name in ("true_accuracy", "reported_accuracy"):
    curve(axes[0], name, trained)
  curve(axes[0], "eval_accuracy", evals, marker="o")
  for step in intervals.defined(time_to_collusion(trained)) if judges else ():
    axes[0].axvline(step, color="grey", linestyle=":")
  for j in judges:
    for name in ("false_accept", "false_reject"):
      curve(axes[1], f"{j}/{name}", trained)
  curve(axes[1], "eval_false_accept", evals, marker="o")
  curve(axes[1], "eval_ablated_false_accept", evals, marker="s", linestyle="--")
  for j in judges:
    for name in ("balanced_accuracy", "auroc"):
      curve(axes[2], f"eval_{j}/{name}", evals, marker="o")
  for j in judges if channel else ():
    curve(axes[3], f"eval_{j}/channel_information", evals, scale=1.0, marker="o")
  titles = ("accuracy (%; dotted: time to collusion)", "judges' false accepts and rejects (%)",
            "judges at evaluation (%)", "channel information beyond chance (bits)")
  for ax, title in zip(axes, titles):
    ax.set(title=title, xlabel="step")
    ax.legend(fontsize=7)
  fig.suptitle(workdir, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def setting_label(config: dict) -> str:
  """A run of a peer-reward sweep by what it varies beside the audit rate: its payment rule, and the
  collusion settings it adds (one parameter set for solver and judges, a covert channel)."""
  reward, roles_, protocol = (config.get(k) or {} for k in ("reward", "roles", "protocol"))
  return (reward.get("pay", "team") + (", shared parameters" if roles_.get("sharing") == "shared" else "") +
          (f", channel {protocol['channel']}" if protocol.get("channel") else ""))


def plot_rates(workdirs: list[str], path: str) -> None:
  """Runs rewarded by their judges against their audit rate (`config.reward.audit_rate`), written to
  `path` (PNG): the final evaluated accuracy (the checker's) and the accuracy the judges last reported
  in training, mean over seeds with its 95% interval (bars and band), one line per payment rule and collusion setting
  (`setting_label`) and seed set (solid: the first, dashed: the others); runs not rewarded by judges
  (the checker-rewarded workflow, a single agent) as horizontal bands."""
  from matplotlib.figure import Figure  # the plot alone needs it
  lines, bands = {}, []
  for w in workdirs:
    s, config = summarize(w), read_config(w) or {}
    reward = config.get("reward") or {}
    if reward.get("source") == "peer":
      lines.setdefault((setting_label(config), s["first_seed"]), []).append((reward["audit_rate"], s))
    else:
      bands.append(s)
  if not lines:
    raise ValueError("--rates: no run among the workdirs is rewarded by its judges; allowed: runs with "
                     "config.reward.source='peer' (and baselines beside them)")
  fig = Figure(figsize=(12, 4.5))
  axes = fig.subplots(1, 2, sharey=True)
  labels = sorted({label for label, _ in lines})
  first_seeds = sorted({seed for _, seed in lines})
  colours = {label: f"C{i}" for i, label in enumerate(labels)}
  for ax, name in zip(axes, ("final", "reported_accuracy")):
    for (label, seed), points in sorted(lines.items()):
      points = sorted((rate, intervals.mean_ci(intervals.defined(s[name]))) for rate, s in points if name in s)
      if not points:
        continue
      rate_N = np.array([rate for rate, _ in points])
      mean_N, half_N = (100 * np.array([m[i] for _, m in points]) for i in (0, 1))
      style = dict(color=colours[label], linestyle="-" if seed == first_seeds[0] else "--")
      # The interval as error bars too: a rule measured at one rate has no band to fill.
      ax.errorbar(rate_N, mean_N, yerr=half_N, marker="o", capsize=3, label=f"{label} (seeds {seed}..)", **style)
      ax.fill_between(rate_N, mean_N - half_N, mean_N + half_N, alpha=0.15, color=colours[label])
    for i, s in enumerate(bands):
      mean, half = (100 * x for x in intervals.mean_ci(s["final"]))
      ax.axhspan(mean - half, mean + half, color=f"C{len(labels) + i}", alpha=0.2,
                 label=f"{s['workdir']} (final)")
    ax.set(xlabel="audit rate (config.reward.audit_rate)", ylabel="accuracy (%)")
    ax.legend(fontsize=6)
  axes[0].set_title("true accuracy: final evaluation, the checker's")
  axes[1].set_title("reported accuracy: the judges' verdicts, last training step")
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None):
  parser = argparse.ArgumentParser(prog="python -m marl_jax.tools.report", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("workdirs", nargs="*", help="runs to tabulate")
  parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="print B − A with a Welch interval")
  parser.add_argument("--paired", action="store_true",
                      help="with --compare: pair the runs seed by seed (runs of the same config.seed and "
                           "num_seeds, e.g. from one warm start per seed)")
  parser.add_argument("--split", nargs=2, metavar=("SINGLE", "MULTI"),
                      help="split the gain: base → single-agent RL (SINGLE) → multi-agent RL (MULTI)")
  parser.add_argument("--seeds", metavar="DIR", help="one row per seed of DIR, diverged seeds, spread")
  parser.add_argument("--plot", nargs=2, metavar=("DIR", "FILE"),
                      help="plot DIR, a run rewarded by its judges, to FILE (PNG): accuracies, the judges' "
                           "errors, AUROC, the covert channel (docs/peer_review.md)")
  parser.add_argument("--rates", metavar="FILE",
                      help="with workdirs: plot runs rewarded by their judges against their audit rate to FILE "
                           "(PNG), true and reported accuracy per payment rule and seed set, beside baselines")
  parser.add_argument("--judges-at", metavar="STEPS",
                      help="with workdirs: the judges' AUROC of their sampled, greedy and expected statements at "
                           "these steps (comma-separated), on the training batch and at evaluation")
  parser.add_argument("--target", type=float, metavar="PCT",
                      help="with workdirs or --compare: a column of the steps each seed took to reach this "
                           "evaluated accuracy (%%), at the resolution of its evaluations")
  args = parser.parse_args(argv)
  if not (args.workdirs or args.compare or args.split or args.seeds or args.plot):
    parser.error("give workdirs, --compare A B, --split SINGLE MULTI, --seeds DIR or --plot DIR FILE")
  if (args.rates or args.judges_at) and not args.workdirs:
    parser.error("--rates FILE and --judges-at STEPS go with workdirs")
  if args.paired and not args.compare:
    parser.error("--paired goes with --compare A B")
  if args.target is not None and not (args.workdirs or args.compare):
    parser.error("--target PCT goes with workdirs or --compare A B")
  if args.target is not None and not 0 < args.target <= 100:
    parser.error(f"--target={args.target}: allowed, a percentage in (0, 100]")
  target = None if args.target is None else args.target / 100
  outputs = []
  with cli.refusing_bad_input(parser):
    if args.judges_at:
      outputs += [judges_at(w, [int(s) for s in args.judges_at.split(",")]) for w in args.workdirs]
    elif args.workdirs:
      summaries, waiting = [], []
      for w in args.workdirs:  # a run still warming up does not keep the others from the table
        try:
          summaries.append(summarize(w, target))
        except ValueError as e:
          waiting.append(f"left out: {e}\n")
      outputs.append((table(summaries) if summaries else "") + "".join(waiting))
    if args.compare:
      outputs.append(compare(*(summarize(w, target) for w in args.compare), paired=args.paired))
    if args.split:
      check_split(*args.split)
      outputs.append(split(*map(summarize, args.split)))
    if args.seeds:
      outputs.append(seeds_table(args.seeds))
    if args.plot:
      plot_peer(*args.plot)
    if args.rates:
      plot_rates(args.workdirs, args.rates)
  print("\n".join(outputs), end="")


if __name__ == "__main__":
  main()
