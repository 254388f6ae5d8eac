"""report: the tables from finished runs, the split, the CLI."""
import json
import math
import os
import warnings

import numpy as np
import pytest

from marl_jax import metrics
from marl_jax.tools import report


def write_run(workdir, evals: dict, extra: dict | None = None):
  """metrics.jsonl of a fake run: eval rows at the given steps (per-seed keys with several seeds),
  with training rows between them, as the trainer logs."""
  os.makedirs(workdir)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step, acc_S in evals.items():
      names = {"eval_accuracy": acc_S, **(extra or {})}
      row = {"step": step, "accuracy": 0.1}
      for name, values in names.items():
        row[name] = float(np.mean(values))
        if len(values) > 1:
          row.update({f"{name}/seed{i}": v for i, v in enumerate(values)})
      f.write(json.dumps(row) + "\n" + json.dumps({"step": step + 1, "accuracy": 0.2}) + "\n")


@pytest.fixture
def runs(tmp_path):
  a, b, one = (str(tmp_path / name) for name in ("a", "b", "one"))
  # Peaks a: [45, 42, 50], b: [60, 53, 56]; drops a: [5, 0, 6], b: [10, 0, 0].
  write_run(a, {0: [0.30, 0.30, 0.30], 50: [0.45, 0.30, 0.50], 100: [0.40, 0.42, 0.44]})
  write_run(b, {0: [0.30, 0.30, 0.30], 50: [0.60, 0.45, 0.55], 100: [0.50, 0.53, 0.56]},
            extra={"eval_false_accept": [0.10, 0.20, 0.15], "eval_false_reject": [0.05, 0.02, 0.03]})
  write_run(one, {0: [0.30], 50: [0.40], 100: [0.35]})
  return a, b, one


def test_summarize(runs):
  s = report.summarize(runs[0])
  assert (s["seeds"], s["steps"]) == (3, 100)
  np.testing.assert_allclose(s["peak"], [0.45, 0.42, 0.50])
  np.testing.assert_allclose(s["drop"], [0.05, 0.0, 0.06], atol=1e-12)
  assert "false_accept" not in s
  np.testing.assert_allclose(report.summarize(runs[1])["false_reject"], [0.05, 0.02, 0.03])
  assert report.summarize(runs[2])["final"].tolist() == [0.35]


def test_cli_table(runs, capsys):
  report.main(list(runs))
  out = capsys.readouterr().out
  assert "Student t" in out
  # final of a: [40, 42, 44]: mean 42, s = 2, half = t_{0.975, 2} * 2 / sqrt(3) = 4.3027 * 1.1547 = 4.97.
  assert f"| {runs[0]} | 3 | 100 | 30.0 ± 0.0 | 42.0 ± 5.0 |" in out
  assert f"| {runs[1]} | 3 | 100 | 30.0 ± 0.0 | 53.0 ± 7.5 | 56.3 ± 8.7 | 3.3 ± 14.3 | 15.0 ± 12.4 |" in out
  assert f"| {runs[2]} | 1 | 100 | 30.0 ± n/a | 35.0 ± n/a | 40.0 ± n/a | 5.0 ± n/a | – | – |" in out
  assert f"| {runs[0]} | 3 | 100 | 0.0 | 2.0 | 4.0 |" in out  # the standard deviations


def test_cli_table_prints_workflow_diagnostics(tmp_path, capsys):
  run = str(tmp_path / "delegate")
  # Rates in %, counts per episode as they are (workers_used: mean 1.5, s = 0.5, half 4.3027 * 0.2887).
  write_run(run, {0: [0.3, 0.3, 0.3], 50: [0.4, 0.5, 0.6]},
            extra={"eval_workers_used": [1.0, 1.5, 2.0], "eval_serial_collapse": [0.2, 0.4, 0.6]})
  report.main([run])
  out = capsys.readouterr().out
  assert "| run | seeds | steps | base | final | peak | drop | workers_used | serial_collapse |" in out
  assert f"| {run} | 3 | 50 | 30.0 ± 0.0 | 50.0 ± 24.8 | 50.0 ± 24.8 | 0.0 ± 0.0 | 1.50 ± 1.24 | 40.0 ± 49.7 |" in out
  assert f"| {run} | 3 | 50 | 0.0 | 10.0 | 10.0 | 0.0 | 0.50 | 20.0 |" in out
  # Compared with a run that logs them too: accuracy, then each diagnostic both log.
  other = str(tmp_path / "other")
  write_run(other, {0: [0.3, 0.3, 0.3], 50: [0.4, 0.5, 0.6]},
            extra={"eval_workers_used": [0.0, 0.5, 1.0], "eval_serial_collapse": [0.2, 0.4, 0.6]})
  report.main(["--compare", other, run])
  out = capsys.readouterr().out
  # workers_used: +1.00, se = sqrt(2 * 0.25 / 3) = 0.408, dof 4, t 2.776: half 1.13.
  assert "| workers_used | 0.50 | 1.50 | +1.00 ± 1.13 | [-0.13, +2.13] | 4.0 | not established |" in out
  assert "| serial_collapse | 40.0 | 40.0 | +0.0 ± " in out


def test_cli_table_prints_what_peers_reported_against_the_checker(tmp_path, capsys):
  # A run rewarded by its judges: the checker's accuracy, the judges' reported accuracy, the distortion
  # (points) and the ground-truth labels per episode, from the last training step that logs them.
  run = str(tmp_path / "peer")
  write_run(run, {0: [0.3, 0.3, 0.3], 50: [0.4, 0.5, 0.6]},
            extra={"true_accuracy": [0.4, 0.5, 0.6], "reported_accuracy": [0.6, 0.7, 0.8],
                   "distortion": [0.2, 0.2, 0.2], "labels_per_episode": [0.1, 0.1, 0.1]})
  report.main([run])
  out = capsys.readouterr().out
  assert "| drop | true_accuracy | reported_accuracy | distortion | labels_per_episode |" in out
  assert "| 0.0 ± 0.0 | 50.0 ± 24.8 | 70.0 ± 24.8 | 20.0 ± 0.0 | 0.10 ± 0.00 |" in out
  # With each judge's false accepts, the time to collusion: seed 0 from the first row (step 0), not the others.
  run = str(tmp_path / "colluding")
  write_run(run, {0: [0.3, 0.3, 0.3], 50: [0.4, 0.5, 0.6]},
            extra={"true_accuracy": [0.4, 0.5, 0.6], "reported_accuracy": [0.6, 0.7, 0.8],
                   "distortion": [0.2, 0.2, 0.2], "labels_per_episode": [0, 0, 0],
                   "judge0/false_accept": [0.9, 0.1, 0.5], "eval_judge0/auroc": [0.5, 0.6, 0.7]})
  report.main([run])
  out = capsys.readouterr().out
  # And each judge's rates at the last evaluation, after it.
  assert "| labels_per_episode | time_to_collusion | judge0/auroc |" in out
  assert "| 0.00 ± n/a (1 of 3 seeds) | 60.0 ± 24.8 |" in out


def test_a_protocols_counterfactual_is_not_a_member():
  row = {"eval_solver/member_accuracy": 0.5, "eval_ablated_solver/member_accuracy": 0.5, "eval_accuracy": 0.5}
  assert report.member_names(row) == ["solver/member_accuracy"]


def test_time_to_collusion_is_the_first_step_the_judges_mean_false_accept_passes_one_half():
  # Three seeds, two judges, training rows at steps 10, 20, 30.  Seed 0's judges average 0.2, 0.6,
  # 0.9: step 20.  Seed 1's 0.45 (one judge alone above 1/2 does not count), 0.5 (not above), 0.8:
  # step 30.  Seed 2's never pass: undefined.  An evaluation's false accepts do not count.
  judge0 = {10: [0.2, 0.9, 0.1], 20: [0.6, 0.5, 0.1], 30: [0.9, 0.8, 0.1]}
  judge1 = {10: [0.2, 0.0, 0.1], 20: [0.6, 0.5, 0.1], 30: [0.9, 0.8, 0.1]}
  rows = [{"step": step, "eval_judge0/false_accept": 1.0,
           **{f"judge0/false_accept/seed{s}": judge0[step][s] for s in range(3)},
           **{f"judge1/false_accept/seed{s}": judge1[step][s] for s in range(3)}} for step in (10, 20, 30)]
  np.testing.assert_array_equal(report.time_to_collusion(rows), [20, 30, np.nan])


def test_a_diagnostic_undefined_on_some_seeds_averages_the_others(tmp_path, capsys):
  """judge_precision of a seed whose judge never had a right candidate is NaN (an empty subset): the
  table and the comparison use the seeds that define it and say how many."""
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  write_run(a, {0: [0.3, 0.3, 0.3], 50: [0.4, 0.5, 0.6]}, extra={"eval_judge_precision": [0.5, float("nan"), 0.7]})
  write_run(b, {0: [0.3, 0.3, 0.3], 50: [0.4, 0.5, 0.6]}, extra={"eval_judge_precision": [0.6, 0.8, 1.0]})
  report.main([a, b])
  out = capsys.readouterr().out
  # a: mean of 50 and 70 = 60, s = 14.14, half = t_{0.975, 1} 12.706 * 14.14 / sqrt(2) = 127.1.
  assert f"| {a} | 3 | 50 | 30.0 ± 0.0 | 50.0 ± 24.8 | 50.0 ± 24.8 | 0.0 ± 0.0 | 60.0 ± 127.1 (2 of 3 seeds) |" in out
  assert f"| {a} | 3 | 50 | 0.0 | 10.0 | 10.0 | 0.0 | 14.1 (2 of 3 seeds) |" in out
  report.main(["--compare", a, b, "--paired"])
  out = capsys.readouterr().out
  # Paired over seeds 0 and 2 (A 50, 70; B 60, 100): differences 10 and 30, mean 20, s = 14.14, half 127.1.
  assert "| judge_precision (2 of 3 seeds) | 60.0 | 80.0 | +20.0 ± 127.1 | [-107.1, +147.1] | 1.0 |" in out
  report.main(["--compare", a, b])  # Welch: each side's defined seeds (A 50, 70; B 60, 80, 100)
  assert "| judge_precision, A (2 of 3 seeds) | 60.0 | 80.0 | +20.0 ± " in capsys.readouterr().out
  # No seed defines it: n/a, without numpy's empty-mean warnings.
  none = str(tmp_path / "none")
  write_run(none, {0: [0.3, 0.3, 0.3], 50: [0.4, 0.5, 0.6]}, extra={"eval_judge_precision": [float("nan")] * 3})
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    report.main(["--compare", none, b])
  assert "| judge_precision, A (0 of 3 seeds) | n/a | 80.0 | n/a ± n/a | n/a | n/a | n/a |" in capsys.readouterr().out


def test_members_beside_the_team_and_against_a_single_agent(tmp_path, capsys):
  """Each member's own accuracy (`ROLE/member_accuracy`) and the average member's stand beside the
  team's; --compare puts the average member against a single agent, itself its only member."""
  single, team = str(tmp_path / "single"), str(tmp_path / "team")
  write_run(single, {0: [0.3, 0.3, 0.3], 50: [0.4, 0.5, 0.6]}, extra={"eval_agent/member_accuracy": [0.4, 0.5, 0.6]})
  # The average member per seed: (0.3 + 0.5) / 2, (0.4 + 0.4) / 2, (0.5 + 0.3) / 2 = 0.4 each.
  write_run(team, {0: [0.3, 0.3, 0.3], 50: [0.5, 0.6, 0.7]},
            extra={"eval_solver0/member_accuracy": [0.3, 0.4, 0.5], "eval_solver1/member_accuracy": [0.5, 0.4, 0.3]})
  np.testing.assert_allclose(report.summarize(team)["member_accuracy"], [0.4, 0.4, 0.4])
  report.main([single, team])
  out = capsys.readouterr().out
  assert ("| run | seeds | steps | base | final | member_accuracy | agent/member_accuracy | solver0/member_accuracy "
          "| solver1/member_accuracy | peak | drop |") in out
  assert f"| {team} | 3 | 50 | 30.0 ± 0.0 | 60.0 ± 24.8 | 40.0 ± 0.0 | – | 40.0 ± 24.8 | 40.0 ± 24.8 |" in out
  report.main(["--compare", single, team])
  out = capsys.readouterr().out
  # B − A = 40 − 50; only A varies (s = 10): half t_{0.975, 2} 4.3027 * 10 / sqrt(3) = 24.8, dof 2.
  assert "| member_accuracy | 50.0 | 40.0 | -10.0 ± 24.8 | [-34.8, +14.8] | 2.0 | not established |" in out
  assert "solver0/member_accuracy |" not in out  # a member only one run has
  # A member undefined on a seed (a delegate worker given no sub-problem) leaves the average to the others.
  nan = str(tmp_path / "nan")
  write_run(nan, {0: [0.3, 0.3], 50: [0.4, 0.5]},
            extra={"eval_worker0/member_accuracy": [0.2, float("nan")], "eval_worker1/member_accuracy": [0.4, 0.6]})
  np.testing.assert_allclose(report.summarize(nan)["member_accuracy"], [0.3, 0.6])


def test_the_writer_keeps_nan_in_the_jsonl_and_out_of_tensorboard(tmp_path):
  writer = metrics.Writer(str(tmp_path), total_steps=2, resume_step=None)
  logged = []
  writer.tb.add_scalar = lambda name, value, step: logged.append(name)
  writer.write(1, {"eval_judge_precision": float("nan"), "eval_accuracy": 0.5})
  writer.close()
  assert logged == ["eval_accuracy"]  # tensorboardX would warn on every NaN
  assert math.isnan(metrics.read(str(tmp_path))[0]["eval_judge_precision"])


def test_cli_compare(runs, capsys):
  report.main(["--compare", runs[0], runs[1]])
  out = capsys.readouterr().out
  # final: b − a = 53 − 42 = +11; se^2 = (4/3 + 9/3) = 13/3, se = 2.0817; dof = 13^2 / ((4^2 + 9^2) / 2)
  # = 3.4845; t_{0.975, 3.4845} = 2.946, half 6.13: [+4.9, +17.1] excludes 0.
  assert "| final | 42.0 | 53.0 | +11.0 ± 6.1 | [+4.9, +17.1] | 3.5 | established |" in out
  assert "| peak | 45.7 | 56.3 | +10.7 ± 8.6 | [+2.0, +19.3] | 3.9 | established |" in out
  # drop: 10/3 − 11/3 = −0.3 with a half-width of 11.9: the interval holds 0.
  assert "| drop | 3.7 | 3.3 | -0.3 ± 11.9 | [-12.2, +11.5] | 3.1 | not established |" in out
  report.main(["--compare", runs[2], runs[1]])  # one seed: no interval, no verdict, no crash
  assert "| final | 35.0 | 53.0 | +18.0 ± n/a | n/a | n/a | n/a |" in capsys.readouterr().out


def write_config(workdir, protocol: str, eval_size: int = 512, **task):
  """config.json of a fake run: its workflow, task (arithmetic, these settings) and evaluation set."""
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"seed": 0, "protocol": {"name": protocol}, "task": {"name": "arithmetic", **task},
               "eval": {"size": eval_size, "seed": 1234, "data_dir": ""}}, f)


def test_cli_split(runs, capsys):
  write_config(runs[0], "single")
  write_config(runs[1], "solver_verifier")
  report.main(["--split", runs[0], runs[1]])
  out = capsys.readouterr().out
  # Gains over the shared base of 30: single-agent run a +12, multi-agent run b +23; 12 / 23 = 52%.
  # The share's bootstrap interval over gains [10, 12, 14] / [20, 23, 26] (test_bootstrap_share's
  # runs): [0.427, 0.635]; the multi-agent share's is its complement, [1 - 0.635, 1 - 0.427].
  assert "| single-agent RL (A final − A base) | +12.0 ± 5.0 | 52% [43%, 63%] |" in out
  assert "| multi-agent RL (total − single-agent) | +11.0 ± 6.1 | 48% [37%, 57%] |" in out
  assert "| total (B final − B base) | +23.0 ± 7.5 | 100% |" in out
  assert "single / multi: 52 / 48 here; reference 70 / 30 at 0.6B (Zeng et al. 2026)" in out
  assert "bootstrap" in out and "rng seed 0" in out and "not established" not in out


def test_cli_needs_a_run():
  with pytest.raises(SystemExit):
    report.main([])


def test_cli_seeds(tmp_path, capsys):
  # Three seeds from config.seed = 1000: the second logs a NaN reward once and skips an update, the
  # third skips one without a NaN (a non-finite gradient, say) and ends below its base: both diverged.
  run = str(tmp_path / "sweep")
  write_run(run, {0: [0.30, 0.30, 0.30], 50: [0.45, 0.35, 0.25], 100: [0.40, 0.42, 0.20]},
            extra={"skipped_updates": [0, 1, 1]})
  with open(os.path.join(run, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"step": 101, "reward": 0.1, "reward/seed0": 0.1, "reward/seed1": float("nan"),
                        "reward/seed2": 0.1}) + "\n")
  with open(os.path.join(run, "config.json"), "w") as f:
    json.dump({"seed": 1000}, f)
  report.main(["--seeds", run])
  out = capsys.readouterr().out
  assert "| 1000 | 30.0 | 40.0 | 45.0 | 5.0 | 0 | no |" in out
  assert "| 1001 | 30.0 | 42.0 | 42.0 | 0.0 | 1 | yes |" in out
  assert "| 1002 | 30.0 | 20.0 | 25.0 | 5.0 | 1 | no |" in out
  # Final [40, 42, 20]: median 40, sd 12.2; mean 34.0 ± 4.3027 * 12.166 / sqrt(3) = 30.2.
  assert ("Diverged: 2 of 3 seeds (1 logged a non-finite accuracy, reward or loss; 2 skipped an update). "
          "Ended below their base: 1. Final accuracy: min 20.0, median 40.0, max 42.0, sd 12.2, "
          "mean 34.0 ± 30.2 (95% CI).") in out


def test_cli_compare_paired(runs, capsys):
  # Final per seed a [40, 42, 44], b [50, 53, 56]: B − A = [10, 11, 12], mean 11, s = 1,
  # half = t_{0.975, 2} * 1 / sqrt(3) = 4.3027 * 0.5774 = 2.48 (Welch's was 6.1).
  report.main(["--compare", runs[0], runs[1], "--paired"])
  out = capsys.readouterr().out
  assert "paired by seed" in out
  assert "| final | 42.0 | 53.0 | +11.0 ± 2.5 | [+8.5, +13.5] | 2.0 | established |" in out
  # Peaks [45, 42, 50] and [60, 53, 56]: B − A = [15, 11, 6], mean 10.7, s = 4.51, half 11.2.
  assert "| peak | 45.7 | 56.3 | +10.7 ± 11.2 | [-0.5, +21.9] | 2.0 | not established |" in out
  # Runs of other seeds cannot be paired.
  with open(os.path.join(runs[1], "config.json"), "w") as f:
    json.dump({"seed": 1000}, f)
  with pytest.raises(SystemExit) as exit_info:
    report.main(["--compare", runs[0], runs[1], "--paired"])
  assert exit_info.value.code == 1
  assert ("--paired needs runs of the same seeds: A has config.seed=0 and 3 seeds, B config.seed=1000 "
          "and 3") in capsys.readouterr().err


def test_cli_leaves_out_a_run_without_evaluations(runs, tmp_path, capsys):
  # A run still in its warm start has an empty metrics.jsonl.
  warming = tmp_path / "warming"
  warming.mkdir()
  (warming / "metrics.jsonl").write_text("")
  report.main([runs[0], str(warming)])
  out = capsys.readouterr().out
  assert f"| {runs[0]} | 3 | 100 | 30.0 ± 0.0 | 42.0 ± 5.0 |" in out
  assert f"left out: {warming} has no evaluation yet" in out
  with pytest.raises(SystemExit):
    report.main(["--seeds", str(warming)])
  assert f"{warming} has no evaluation yet" in capsys.readouterr().err


def test_a_corrupt_metrics_line_or_config_is_named(runs, tmp_path, capsys):
  """A garbage line in metrics.jsonl, or a config.json that is not JSON, is named by its file (and
  line): the table leaves the run out saying so, --compare refuses it in one line."""
  bad_metrics, bad_config = str(tmp_path / "bad_metrics"), str(tmp_path / "bad_config")
  write_run(bad_metrics, {0: [0.3], 50: [0.4]})
  with open(os.path.join(bad_metrics, "metrics.jsonl"), "r+") as f:
    lines = f.readlines()
    f.seek(0)
    f.writelines([lines[0], "garbage\n", *lines[1:]])
  write_run(bad_config, {0: [0.3], 50: [0.4]})
  with open(os.path.join(bad_config, "config.json"), "w") as f:
    f.write("{seed: 1}")
  report.main([runs[0], bad_metrics, bad_config])
  out = capsys.readouterr().out
  assert f"| {runs[0]} | 3 | 100 | 30.0 ± 0.0 | 42.0 ± 5.0 |" in out
  assert (f"left out: {bad_metrics}/metrics.jsonl line 2 is not JSON (Expecting value at column 1); "
          f"allowed: one JSON object per line, a logged step's metrics\n") in out
  assert (f"left out: {bad_config}/config.json is not JSON (Expecting property name enclosed in double "
          f"quotes at line 1 column 2); allowed: the config a run wrote there\n") in out
  for corrupt, message in ((bad_metrics, f"{bad_metrics}/metrics.jsonl line 2 is not JSON"),
                           (bad_config, f"{bad_config}/config.json is not JSON")):
    with pytest.raises(SystemExit) as exit_info:
      report.main(["--compare", runs[0], corrupt])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.startswith(f"python -m marl_jax.tools.report: {message} (")


def test_a_run_that_has_logged_nothing_yet_is_left_out(runs, tmp_path, capsys):
  # A run still in its warm start has config.json and no metrics.jsonl: it ended the whole table
  # with an OSError ([Errno 2]) instead of being left out like a run not evaluated yet.
  starting = tmp_path / "starting"
  starting.mkdir()
  (starting / "config.json").write_text(json.dumps({"seed": 0}))
  report.main([runs[0], str(starting)])
  out = capsys.readouterr().out
  assert f"| {runs[0]} | 3 | 100 | 30.0 ± 0.0 | 42.0 ± 5.0 |" in out
  assert (f"left out: {starting}/metrics.jsonl is not there: no step logged yet; allowed: the workdir "
          "of a run\n") in out


def test_metrics_read_names_the_file_and_line(tmp_path):
  """The reader the report and a resumed run share: rows that are not JSON objects with an integer
  step, or not UTF-8, are refused by line; a blank line, or a last line cut short by a kill, is not."""
  path = tmp_path / "metrics.jsonl"
  good = json.dumps({"step": 1, "accuracy": 0.5}) + "\n"
  path.write_text(good + "\n" + json.dumps({"step": 2, "accuracy": 0.6}) + "\n" + '{"step": 3, "acc')
  assert [r["step"] for r in metrics.read(str(tmp_path))] == [1, 2]
  for line, message in (
      (b'{"step": 2, "accuracy": 0.6\n', "line 2 is not JSON (Expecting ',' delimiter at column 29)"),
      (b'[2, 0.6]\n', 'line 2 is not a metrics row ([2, 0.6]); allowed: a JSON object with an integer "step"'),
      (b'{"step": "2"}\n', 'line 2 is not a metrics row ({"step": "2"}); allowed'),
      (b'{"accuracy": 0.6}\n', "line 2 is not a metrics row"),
      (b'{"step": 2, "accuracy": "\xff"}\n', "line 2 is not JSON ('utf-8' codec can't decode byte 0xff")):
    path.write_bytes(good.encode() + line)
    with pytest.raises(ValueError) as error:
      metrics.read(str(tmp_path))
    assert str(error.value).startswith(f"{path} {message}")


def test_cli_split_refuses_runs_it_cannot_split(runs, tmp_path, capsys):
  """SINGLE must be a single-agent run (one role) and MULTI a multi-agent one, on the same task and
  evaluation set; settings an experiment file leaves at their defaults, and where the evaluation set is
  stored, do not count."""
  single, multi = runs[0], runs[1]

  def refusal(*args):
    with pytest.raises(SystemExit) as exit_info:
      report.main(["--split", *args])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err.removeprefix("python -m marl_jax.tools.report: ").removesuffix("\n")

  assert refusal(single, multi) == (f"--split SINGLE={single} has no config.json, so its workflow and task "
                                    f"are unknown; allowed: a run's workdir, which holds the config.json its "
                                    f"run wrote")
  write_config(single, "solver_verifier")
  write_config(multi, "solver_verifier")
  assert refusal(single, multi) == (f"--split SINGLE={single} is a multi-agent run (config.protocol.name="
                                    f"'solver_verifier', roles solver, verifier); allowed: a single-agent run, "
                                    f"one role (e.g. config.protocol.name='single')")
  write_config(single, "single")
  write_config(multi, "single")
  assert refusal(single, multi) == (f"--split MULTI={multi} is a single-agent run (config.protocol.name="
                                    f"'single', role agent); allowed: a multi-agent run, two roles or more")
  write_config(multi, "solver_verifier", eval_size=256, num_ops=3)
  assert refusal(single, multi) == (f"--split needs runs on the same task and evaluation set; {single} and "
                                    f"{multi} differ in config.eval.size: 512 in SINGLE, 256 in MULTI; "
                                    f"config.task.num_ops: 2 in SINGLE, 3 in MULTI")
  with open(os.path.join(multi, "config.json"), "w") as f:
    json.dump({"seed": 0, "protocol": {"name": "orchestrator"}, "task": {"name": "multi_chain"},
               "eval": {"size": 512, "seed": 1234}}, f)
  assert refusal(single, multi) == (f"--split needs runs on the same task and evaluation set; {single} and "
                                    f"{multi} differ in config.task.name: 'arithmetic' in SINGLE, "
                                    f"'multi_chain' in MULTI")
  # A one-agent relay is a single-agent run; a workflow that does not build is named.
  with open(os.path.join(single, "config.json"), "w") as f:
    json.dump({"seed": 0, "protocol": {"name": "relay", "agents": 1}, "task": {"name": "multi_chain"},
               "eval": {"size": 512, "seed": 1234, "data_dir": "/elsewhere"}}, f)
  report.main(["--split", single, multi])
  assert "| total (B final − B base) | +23.0 ± 7.5 | 100% |" in capsys.readouterr().out
  write_config(multi, "no_such_workflow")
  assert refusal(single, multi).startswith(
      f"--split MULTI={multi}: the roles of its workflow do not follow from its config.json "
      f"(config.protocol.name='no_such_workflow' is unknown; allowed: [")
  # The same task with a setting left at its default (`ops`) on one side only, stored elsewhere.
  write_config(single, "single", ops="+-*")
  write_config(multi, "vote")
  report.main(["--split", single, multi])
  assert "single / multi: 52 / 48 here" in capsys.readouterr().out


def test_plot_draws_a_run_rewarded_by_its_judges_and_refuses_another(tmp_path, capsys):
  run, out = str(tmp_path / "peer"), str(tmp_path / "peer.png")
  write_run(run, {0: [0.3, 0.3], 50: [0.4, 0.5]},
            extra={"true_accuracy": [0.4, 0.5], "reported_accuracy": [0.9, 0.7], "distortion": [0.5, 0.2],
                   "labels_per_episode": [0, 0], "judge0/false_accept": [0.9, 0.1], "judge0/false_reject": [0, 0.2],
                   "eval_judge0/auroc": [0.5, 0.7], "eval_judge0/channel_information": [0.0, 0.1],
                   "eval_ablated_false_accept": [0.9, 0.2]})
  report.main(["--plot", run, out])
  assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  plain = str(tmp_path / "plain")
  write_run(plain, {0: [0.3], 50: [0.4]})
  with pytest.raises(SystemExit):
    report.main(["--plot", plain, out])
  assert "holds no judges' metrics; allowed: a run with config.reward.source='peer'" in capsys.readouterr().err


def test_rates_plots_runs_rewarded_by_their_judges_against_their_audit_rate(tmp_path, capsys):
  def run(name, reward, **config):
    workdir = str(tmp_path / name)
    write_run(workdir, {0: [0.1, 0.1], 100: [0.2, 0.3]},
              extra={"true_accuracy": [0.2, 0.3], "reported_accuracy": [0.9, 0.8], "distortion": [0.7, 0.5],
                     "labels_per_episode": [0.1, 0.1]} if reward.get("source") == "peer" else None)
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump({"seed": 0, "reward": reward, **config}, f)
    return workdir
  runs = [run("team_0", {"source": "peer", "pay": "team", "audit_rate": 0.0}),
          run("team_0.1", {"source": "peer", "pay": "team", "audit_rate": 0.1}),
          run("channel", {"source": "peer", "pay": "team", "audit_rate": 0.0}, protocol={"channel": 2}),
          run("checker", {"source": "checker", "pay": "team"})]
  out = str(tmp_path / "rates.png")
  report.main(["--rates", out, *runs])
  assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  assert report.setting_label(report.read_config(runs[2])) == "team, channel 2"
  assert report.setting_label({"reward": {"pay": "audited"}, "roles": {"sharing": "shared"}}) == "audited, shared parameters"
  with pytest.raises(SystemExit):
    report.main(["--rates", out, runs[-1]])
  assert "no run among the workdirs is rewarded by its judges" in capsys.readouterr().err


def test_the_judges_auroc_at_chosen_steps(tmp_path, capsys):
  # Two judges, three seeds; training rows log the written (sampled) and expected statements' AUROC,
  # evaluation rows also the drawn one.  Per seed the mean over the judges: expected (0.6 + 0.8) / 2 = 0.7,
  # (0.7 + 0.7) / 2, (0.8 + 0.6) / 2: 70.0 ± 0.0; written 0.5 everywhere.
  run = str(tmp_path / "run")
  os.makedirs(run)
  seeds = lambda values: {f"/seed{i}": v for i, v in enumerate(values)}
  with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    for prefix in ("", "eval_"):
      row = {"step": 5}
      for judge, expected in (("judge0", [0.6, 0.7, 0.8]), ("judge1", [0.8, 0.7, 0.6])):
        for score, values in (("auroc", [0.5] * 3), ("auroc_expected", expected)):
          row.update({f"{prefix}{judge}/{score}{k}": v for k, v in seeds(values).items()})
      f.write(json.dumps({**row, **({"eval_accuracy": 0.1} if prefix else {})}) + "\n")
  report.main(["--judges-at", "0,5", run])
  out = capsys.readouterr().out
  assert "| training batch (sampled) | 5 | 50.0 ± 0.0 |  | 70.0 ± 0.0 |  |" in out
  assert "| evaluation (greedy) | 5 | 50.0 ± 0.0 |  | 70.0 ± 0.0 |  |" in out
  assert "| 0 |" not in out  # nothing logged at step 0


def test_steps_to_a_target_are_each_seeds_first_evaluation_that_reaches_it(runs, capsys):
  # a evaluates [30, 30, 30], [45, 30, 50], [40, 42, 44] at steps 0, 50, 100; b [.., 60, 45, 55], [50, 53, 56].
  np.testing.assert_array_equal(report.summarize(runs[0], target=0.44)["steps_to_target"], [50, np.nan, 50])
  np.testing.assert_array_equal(report.summarize(runs[1], target=0.5)["steps_to_target"], [50, 100, 50])
  assert report.summarize(runs[0], target=0.3)["steps_to_target"].tolist() == [0, 0, 0]
  assert "steps_to_target" not in report.summarize(runs[0])
  report.main(["--target=50", *runs[:2]])
  out = capsys.readouterr().out
  # a reaches 50 % on seed 2 alone (at step 50); b: [50, 100, 50], mean 66.67, s = 28.87, half = 4.3027 *
  # 28.87 / sqrt(3) = 71.71.
  assert "| 50.00 ± n/a (1 of 3 seeds) |" in out and "| 66.67 ± 71.71 |" in out
  report.main(["--target=50", "--compare", *runs[:2]])
  assert "| steps_to_target, A (1 of 3 seeds) | 50.00 | 66.67 | +16.67 ± n/a |" in capsys.readouterr().out
  for argv in (["--target=0", runs[0]], ["--target=101", runs[0]], ["--target=50", "--seeds", runs[0]]):
    with pytest.raises(SystemExit):
      report.main(argv)
