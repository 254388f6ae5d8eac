"""The credit benchmark: its grading statistics and costs by hand, bad names refused before compiling,
and the tiny grid end to end through the CLI, resumed without re-running a finished cell."""
import csv
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from marl_jax import configs, credit, experiment
from marl_jax.tools import credit_benchmark as benchmark

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCH = REPO / "experiments" / "credit_benchmark.py"


def _config(size="tiny", grid="toys"):
  return configs.sibling(str(BENCH), "credit_benchmark").get_config(f"size={size},grid={grid}")


def test_spearman_uses_average_ranks_for_ties():
  # x ranks: 0.5, 0.5, 2, 3 (a tie at the bottom); y ranks 0..3.  Pearson of the ranks by hand:
  # rank deviations x: -1, -1, 0.5, 1.5; y: -1.5, -0.5, 0.5, 1.5; cov 1.5 + 0.5 + 0.25 + 2.25 = 4.5;
  # norms sqrt(1 + 1 + 0.25 + 2.25) = sqrt(4.5) and sqrt(5): rho = 4.5 / sqrt(22.5).
  assert benchmark.spearman([0, 0, 1, 2], [0, 1, 2, 3]) == pytest.approx(4.5 / math.sqrt(22.5))
  assert benchmark.spearman([3, 2, 1], [1, 2, 3]) == pytest.approx(-1.0)
  assert math.isnan(benchmark.spearman([1, 1, 1], [1, 2, 3]))  # no ranking to correlate


def test_grade_by_hand():
  credit_SxBxR = np.array([[[1.0, 0.0], [0.5, 0.5]]])
  exact_SxBxR = np.array([[[0.5, 0.0], [0.5, 0.0]]])
  graded = benchmark.grade(credit_SxBxR, exact_SxBxR)
  # errors 0.5, 0, 0, 0.5: mean 0.25, population sd 0.25.
  assert graded["bias"] == pytest.approx([0.25])
  assert graded["error_sd"] == pytest.approx([0.25])
  # Spearman: ranks (ties averaged) of credit [1, 0, .5, .5] are [3, 0, 1.5, 1.5], of exact [.5, 0, .5, 0]
  # [2.5, .5, 2.5, .5]; deviations [1.5, -1.5, 0, 0] and [1, -1, 1, -1]: 3 / sqrt(4.5 * 4) = 1 / sqrt(2).
  assert graded["spearman"] == pytest.approx([1 / math.sqrt(2)])


def test_mean_over_games_by_hand():
  """Each seed's mean over games, then the mean and 95% interval (Student t) over seeds."""
  cell = lambda game, roles, name, sd_S, rho_S: {
      "game": game, "roles": roles, "estimator": name, "reruns": 3, "turns": 2, "shapley_error_sd_S": sd_S,
      "shapley_spearman_S": rho_S, "difference_error_sd_S": [2 * x for x in sd_S],
      "difference_spearman_S": [math.nan] * len(sd_S)}
  rows = benchmark.by_estimator([cell("synergy", 4, "team", [0.1, 0.3], [0.2, math.nan]),
                                 cell("synergy", 2, "team", [0.5, 0.5], [0.5, 0.5]),
                                 cell("additive", 4, "team", [0.3, 0.5], [0.6, 0.4])])
  assert [(r["roles"], r["games"]) for r in rows] == [(2, 1), (4, 2)]  # sorted by roles
  # R = 4: seeds' means over games 0.2 and 0.4 -> mean 0.3, half-width t(0.975, 1) * sd / sqrt(2)
  # = 12.706 * 0.1414 / 1.414 = 1.2706; Spearman: seed 0 (0.2 + 0.6) / 2 = 0.4, seed 1 only 0.4.
  assert rows[1]["shapley_error_sd"] == pytest.approx(0.3)
  assert rows[1]["shapley_error_sd_ci"] == pytest.approx(1.2706, abs=1e-3)
  assert rows[1]["shapley_spearman"] == pytest.approx(0.4) and rows[1]["shapley_spearman_ci"] == pytest.approx(0)
  assert rows[1]["difference_error_sd"] == pytest.approx(0.6)
  assert math.isnan(rows[1]["difference_spearman"])  # no game ranks anything: nan, not 0


@pytest.mark.parametrize("estimator,reruns,turns", [
    ("team", 0, 2),
    ("difference", 4, 6),  # K = 2 re-draws of each of the 2 parallel turns: 2 + 2 * 2 * 1 turns
    ("shapley", 3, 2),  # 2^2 - 1 coalitions; absent roles write nothing, the others keep their turns
    ("critic", 4, 6),  # replace mode: K = 2 re-draws of each role's own turn
])
def test_cost_per_episode(estimator, reruns, turns):
  exp = experiment.build(benchmark.fidelity_config(_config(), 2, estimator))
  assert benchmark.cost(exp) == {"reruns": reruns, "turns": turns}


def test_fidelity_credit_is_the_credit_term_alone():
  config = benchmark.fidelity_config(_config(), 3, "difference")
  assert config.credit.outcome_weight == 0.0 and config.credit.credit_weight == 1.0
  assert benchmark.fidelity_config(_config(), 8, "team").model.max_len >= 33  # 8 roles fit


@pytest.mark.parametrize("key,value,allowed", [
    ("estimators", "team,oracle", "'difference'"),
    ("fidelity.games", "synergy,chaos", "'saboteur'"),
    ("learning.scenarios", "free_rider,nope", "'penalty'"),
    ("fidelity.roles", "2.5", "integers 2..8"),
    # The contribution task's range: 1 or 9 roles named config.task.num_roles, of no config given.
    ("fidelity.roles", "2,9", "integers 2..8"),
    ("fidelity.roles", "1", "integers 2..8"),
    ("fidelity.demo_error_rate", 2.0, "a probability in [0, 1]"),
    ("fidelity.adapt_steps", -1, "an integer >= 0"),
    ("fidelity.adapt_curve", "0,-5", "integers >= 0 (counts of adaptation batches)"),
    ("learning.target", 90.0, "a training accuracy in (0, 1]"),
    ("learning.target", math.nan, "a training accuracy in (0, 1]"),
    # The learning cells' run configs are built too (once only after the whole fidelity grid).
    ("learning.num_seeds", 0, ("the learning cell free_rider/team (config.runs.free_rider and "
                               "config.learning): config.num_seeds=0")),
    ("learning.eval_every", 0, ("the learning cell free_rider/team (config.runs.free_rider and "
                                "config.learning): config.eval_every=0")),
])
def test_unknown_names_are_refused_before_compiling(key, value, allowed, tmp_path):
  config = _config()
  group, _, field = key.rpartition(".")
  (config[group] if group else config)[field] = value
  with pytest.raises(ValueError) as error:
    benchmark.run(config, str(tmp_path / "bench"))
  assert allowed in str(error.value)
  assert f"config.{key}" in str(error.value) or key.startswith("learning.")
  assert not (tmp_path / "bench").exists()


def test_an_estimator_entry_may_carry_settings():
  config = benchmark.learning_config(_config(), "free_rider", "shapley:centre=dr_grpo:credit_weight=0.5")
  assert (config.credit.name, config.credit.centre, config.credit.credit_weight) == ("shapley", "dr_grpo", 0.5)
  fidelity = benchmark.fidelity_config(_config(), 2, "shapley:centre=rloo").credit
  assert (fidelity.centre, fidelity.outcome_weight) == ("rloo", 0.0)
  for entry, says in (("shapley:centre", "'centre' is not KEY=VALUE of a setting of 'shapley'"),
                      ("team:centre=rloo", "allowed keys: ['baseline']"),
                      ("shapley:centre=3", "config.estimators has 'shapley:centre=3'")):
    with pytest.raises(ValueError, match=re.escape(says)):
      benchmark.estimator_group(entry)


def test_keys_the_benchmark_sets_are_not_settable_per_scenario():
  # --config.runs.penalty.credit.baseline=grpo was accepted and ignored: each cell's credit group is its
  # estimator's, its seeds and steps config.learning's.
  for run in _config().runs.values():
    assert not set(configs.BENCHMARK_SETS) & set(run)
  config = benchmark.learning_config(_config(), "free_rider", "shapley")
  assert (config.credit.name, config.num_seeds, config.total_steps, config.init_from) == ("shapley", 2, 2, "")


def _fidelity_file(folder, game, roles, settings, estimators):
  folder.mkdir(parents=True, exist_ok=True)
  r = {"reruns": 0, "turns": 2, **{f"{ref}_{stat}": [0.1, 0.2] for ref in ("shapley", "difference")
                                   for stat in ("bias", "error_sd", "spearman")}}
  (folder / f"{game}-r{roles}.json").write_text(json.dumps(
      {"game": game, "roles": roles, "seeds": 2, "settings": settings, "estimators": {e: r for e in estimators}}))


def test_a_fidelity_cell_of_other_settings_is_refused(tmp_path):
  # It was counted as finished whatever was asked: another seed count reused it, silently.
  config = _config()
  config.learning.scenarios = ""
  settings = benchmark.fidelity_settings(config)
  _fidelity_file(tmp_path / "fidelity", "synergy", 2, {**settings, "num_seeds": 3}, ["team", "shapley"])
  with pytest.raises(experiment.ConfigError, match=r"synergy-r2.json was computed with other settings .* "
                                                   r"give a new --workdir, or move that file aside"):
    benchmark.run(config, str(tmp_path))


def test_a_fidelity_cell_without_settings_is_refused_as_such(tmp_path):
  config = _config()
  config.learning.scenarios = ""
  _fidelity_file(tmp_path / "fidelity", "synergy", 2, None, ["team", "shapley"])
  cell = json.loads((tmp_path / "fidelity" / "synergy-r2.json").read_text())
  del cell["settings"]  # as older code wrote it
  (tmp_path / "fidelity" / "synergy-r2.json").write_text(json.dumps(cell))
  with pytest.raises(experiment.ConfigError, match=r"synergy-r2.json records no settings"):
    benchmark.run(config, str(tmp_path))


def test_a_cell_past_the_steps_asked_is_not_called_signalled(tmp_path, monkeypatch):
  config = _config()
  config.fidelity.roles = ""
  monkeypatch.setattr(benchmark.loop, "train_and_evaluate", lambda config, workdir: None)
  monkeypatch.setattr(benchmark.checkpoint, "latest_step", lambda workdir: 5)
  with pytest.raises(SystemExit, match=r"free_rider/base holds a checkpoint at step 5, past "
                                       r"config.learning.total_steps=0"):
    benchmark.run(config, str(tmp_path))


def test_the_report_reads_the_configured_cells_and_estimators_only(tmp_path):
  config = _config()
  config.estimators, config.fidelity.games = "team", "synergy"
  settings = benchmark.fidelity_settings(config)
  _fidelity_file(tmp_path / "fidelity", "synergy", 2, settings, ["team", "shapley"])
  _fidelity_file(tmp_path / "fidelity", "additive", 2, settings, ["team"])
  (tmp_path / "fidelity" / "saboteur-r2.json.tmp").write_text('{"game": "sab')  # a killed write
  rows = benchmark.fidelity_rows(config, str(tmp_path))
  assert [(r["game"], r["estimator"]) for r in rows] == [("synergy", "team")]


def test_a_cell_stopped_by_a_signal_stops_the_benchmark(tmp_path, monkeypatch):
  # train_and_evaluate returns normally after a SIGTERM (it saved a checkpoint to resume from): the
  # benchmark went on to the next cell and reported without this one, exit status 0.
  config = _config()
  config.fidelity.roles = ""
  monkeypatch.setattr(benchmark.loop, "train_and_evaluate", lambda config, workdir: None)
  with pytest.raises(SystemExit, match=r"stopped by a signal in .*free_rider/base; run the same command "
                                       r"again to resume"):
    benchmark.run(config, str(tmp_path))


def test_a_finished_cell_without_its_wall_time_reads_nan(tmp_path, monkeypatch):
  # A kill between a cell's last checkpoint and its wall_seconds.json once broke every later report.
  config = _config()
  config.estimators, config.learning.scenarios = "team", "penalty"
  monkeypatch.setattr(benchmark.runs, "finished", lambda run, steps: True)
  _write_cell(tmp_path / "learning" / "penalty" / "team", [[.5, .5], [.9, .9]], [1.0, 1.0])
  (tmp_path / "learning" / "penalty" / "team" / "wall_seconds.json").unlink()
  (row,) = benchmark.learning_rows(config, str(tmp_path))
  assert math.isnan(row["wall_seconds"])


def _write_cell(folder, accuracy_NxS, eval_accuracy_S, members=None):
  """A finished learning cell's metrics.jsonl: training accuracy every step, eval at the first and last
  (with `members`, {ROLE: member accuracy per seed}, logged at both)."""
  folder.mkdir(parents=True)
  rows = []
  for step, acc_S in enumerate(accuracy_NxS):
    row = {"step": step, "accuracy": float(np.mean(acc_S)), **{f"accuracy/seed{i}": a for i, a in enumerate(acc_S)}}
    if step in (0, len(accuracy_NxS) - 1):
      evals = [0.0] * len(acc_S) if step == 0 else eval_accuracy_S
      row.update({"eval_accuracy": float(np.mean(evals)), **{f"eval_accuracy/seed{i}": a for i, a in enumerate(evals)}})
      for role, member_S in (members or {}).items():
        row.update({f"eval_{role}/member_accuracy/seed{i}": a for i, a in enumerate(member_S)})
    rows.append(row)
  (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (folder / "wall_seconds.json").write_text('{"seconds": 1.0}')


def test_learning_rows_pair_each_estimator_with_team_seed_by_seed(tmp_path, monkeypatch):
  config = _config()
  config.estimators, config.learning.scenarios, config.learning.target = "team,shapley", "penalty", 0.9
  monkeypatch.setattr(benchmark.runs, "finished", lambda run, steps: True)
  # Steps to 0.9 per seed: team [1, 2, never], shapley [3, 1, 0]; final eval team [1, .5, 0],
  # shapley [.5, .5, 1].
  _write_cell(tmp_path / "learning" / "penalty" / "team",
              [[.5, .5, .5], [.9, .5, .5], [.9, .95, .5], [.9, .9, .5]], [1.0, 0.5, 0.0])
  _write_cell(tmp_path / "learning" / "penalty" / "shapley",
              [[.5, .5, .95], [.5, .9, .9], [.5, .9, .9], [.9, .9, .9]], [0.5, 0.5, 1.0])
  team, shapley = benchmark.learning_rows(config, str(tmp_path))
  assert team["steps_vs_team"] == 0.0 and team["final_vs_team"] == 0.0
  # Paired over the seeds where both reach 0.9 (seeds 0 and 1): (3 - 1) and (1 - 2).
  assert shapley["steps_vs_team"] == pytest.approx(0.5)
  assert shapley["steps_vs_team_ci"] == pytest.approx(12.706 * math.sqrt(4.5) / math.sqrt(2), rel=1e-4)
  assert shapley["final_vs_team"] == pytest.approx((-0.5 + 0.0 + 1.0) / 3)
  assert shapley["reached_target"] == 1.0 and team["reached_target"] == pytest.approx(2 / 3)


def test_each_team_and_its_members_are_compared_with_the_single_agent_on_its_task(tmp_path, monkeypatch):
  config = _config("tiny", "workflows")
  config.estimators, config.learning.scenarios = "team,difference", "single_subset_sum,vote,delegate"
  monkeypatch.setattr(benchmark.runs, "finished", lambda run, steps: os.path.exists(os.path.join(run, "metrics.jsonl")))
  steps = [[.5, .5, .5], [.9, .9, .9]]
  _write_cell(tmp_path / "learning" / "single_subset_sum" / "team", steps, [.2, .3, .4])
  _write_cell(tmp_path / "learning" / "vote" / "team", steps, [.3, .3, .3],
              {"voter0": [.1, .2, .3], "voter1": [.1, .0, .1], "voter2": [.1, .1, .2]})
  _write_cell(tmp_path / "learning" / "vote" / "difference", steps, [.4, .5, .6],
              {"voter0": [.3, .3, .3], "voter1": [.3, .3, .3], "voter2": [.3, .3, .3]})
  _write_cell(tmp_path / "learning" / "delegate" / "team", steps, [.5, .5, .5])
  rows = {(r["scenario"], r["estimator"]): r for r in benchmark.learning_rows(config, str(tmp_path))}
  assert set(rows) == {("single_subset_sum", "team"), ("vote", "team"), ("vote", "difference"),
                       ("delegate", "team")}
  # Members per seed: the mean of the three voters, [.1, .1, .2]; the single agent's final [.2, .3, .4].
  assert rows["vote", "team"]["member"] == pytest.approx(0.4 / 3)
  assert rows["vote", "team"]["member_vs_reference"] == pytest.approx(0.4 / 3 - 0.3)
  assert rows["vote", "team"]["final_vs_reference"] == pytest.approx(0.0)
  # Both against the single agent's `team` cell: Welch, unequal spreads.
  diff, half, _ = benchmark.intervals.welch_diff([.2, .3, .4], [.4, .5, .6])
  assert (rows["vote", "difference"]["final_vs_reference"], rows["vote", "difference"]["final_vs_reference_ci"]) \
      == pytest.approx((diff, half))
  assert rows["vote", "difference"]["member_vs_reference"] == pytest.approx(0.0)
  # The single agent is no reference for itself, and delegate's (multi_chain) has not finished.
  for key in (("single_subset_sum", "team"), ("delegate", "team")):
    assert "final_vs_reference" not in rows[key]
  assert "member" not in rows["delegate", "team"]
  # Cost per episode: difference credit re-draws each of the 3 voters twice (each re-run redraws one turn).
  assert (rows["vote", "team"]["reruns"], rows["vote", "difference"]["reruns"]) == (0, 6)
  assert rows["vote", "difference"]["turns"] == rows["vote", "team"]["turns"] + 6


def test_the_member_curve_is_the_mean_of_the_members_defined_per_seed(tmp_path):
  _write_cell(tmp_path / "vote", [[.5, .5], [.9, .9]], [.3, .3], {"voter0": [.2, .4], "voter1": [.4, math.nan]})
  steps_N, member_NxS = benchmark.learning_curve(str(tmp_path / "vote"), member=True)
  np.testing.assert_array_equal(steps_N, [0, 1])
  np.testing.assert_allclose(member_NxS[-1], [.3, .4])
  _write_cell(tmp_path / "single", [[.5, .5], [.9, .9]], [.3, .3])
  assert benchmark.learning_curve(str(tmp_path / "single"), member=True)[1] is None


def test_an_unknown_reference_is_refused():
  config = _config("tiny", "workflows")
  config.learning.reference = "single_subset_sum,lone_wolf"
  with pytest.raises(ValueError, match=r"config.learning.reference has 'lone_wolf'; allowed: scenarios of"):
    benchmark.check(config)


def test_every_estimator_is_in_the_cpu_grid():
  assert sorted(benchmark.names(_config("cpu").estimators)) == sorted(credit.REGISTRY)


@pytest.mark.slow
def test_tiny_benchmark_end_to_end_and_resume(tmp_path):
  workdir = tmp_path / "bench"
  # One estimator keeps it short: every estimator's cost and config are checked above.
  cmd = [sys.executable, "-m", "marl_jax.tools.credit_benchmark", f"--config={BENCH}:size=tiny", f"--workdir={workdir}",
         "--config.estimators=shapley"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  first = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert first.returncode == 0, first.stderr[-3000:]
  report = workdir / "report"
  for name in ("fidelity.csv", "learning.csv", "report.md", "fidelity_vs_cost.png",
               "learning_free_rider.png"):
    assert (report / name).exists(), name
  with open(report / "fidelity.csv") as f:
    fidelity = {row["estimator"]: row for row in csv.DictReader(f)}
  assert set(fidelity) == {"shapley"}
  # The shapley estimator (exact below max_exact_roles) is the exact Shapley value.
  assert abs(float(fidelity["shapley"]["shapley_bias"])) < 1e-6
  assert float(fidelity["shapley"]["shapley_error_sd"]) < 1e-6
  md = (report / "report.md").read_text()
  assert "| free_rider | shapley | 2 |" in md
  cells = sorted(p for p in workdir.rglob("*") if p.is_file() and "report" not in p.parts)
  stamps = {p: p.stat().st_mtime_ns for p in cells}
  second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "warm start" not in second.stdout  # nothing trained again
  assert {p: p.stat().st_mtime_ns for p in cells} == stamps


@pytest.mark.slow
def test_tiny_workflow_grid_end_to_end(tmp_path):
  # The workflow grid's tiny variant through the benchmark command: both references, a team compared
  # with each and a team without one; the team reward alone keeps it short (every workflow runs with
  # every estimator in end_to_end_test).
  config = _config("tiny", "workflows")
  config.learning.scenarios = "single_subset_sum,vote,exchange,single_multi_chain,delegate"
  cmd = [sys.executable, "-m", "marl_jax.tools.credit_benchmark", f"--config={BENCH}:size=tiny,grid=workflows",
         f"--workdir={tmp_path}", "--config.estimators=team", f"--config.learning.scenarios={config.learning.scenarios}"]
  done = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                        text=True, timeout=1500)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(tmp_path / "report" / "learning.csv") as f:
    rows = {row["scenario"]: row for row in csv.DictReader(f)}
  assert set(rows) == set(benchmark.names(config.learning.scenarios))
  for scenario in ("vote", "delegate"):
    assert rows[scenario]["member"] != "", scenario
  for scenario, reference in (("vote", "single_subset_sum"), ("delegate", "single_multi_chain")):
    assert float(rows[scenario]["final_vs_reference"]) == pytest.approx(
        float(rows[scenario]["final"]) - float(rows[reference]["final"]))
  assert rows["exchange"]["final_vs_reference"] == ""  # hidden_sum has no single agent
  for scenario in rows:
    assert (tmp_path / "report" / f"learning_{scenario}.png").exists(), scenario


@pytest.mark.slow
def test_the_fidelity_curve_grades_after_each_count_of_adaptation_batches(tmp_path):
  config = _config()
  config.estimators, config.learning.scenarios, config.fidelity.adapt_curve = "team,critic", "", "0,2"
  assert benchmark.checkpoints(config.fidelity) == (0, 1, 2)  # adapt_steps=1 among them
  benchmark.run(config, str(tmp_path))
  cell = json.loads((tmp_path / "fidelity" / "synergy-r2.json").read_text())
  assert cell["settings"]["adapt_curve"] == "0,2"
  for name in ("team", "critic"):
    graded, curve = cell["estimators"][name], cell["estimators"][name]["curve"]
    assert curve["adapt_batches"] == [0, 1, 2]
    # The grid's numbers are the curve's at adapt_steps: the same last batch, credited after 1 batch.
    for stat in ("difference_spearman", "difference_error_sd", "shapley_bias"):
      assert curve[stat][1] == graded[stat]
  team, critic = cell["estimators"]["team"]["curve"], cell["estimators"]["critic"]["curve"]
  assert team["difference_error_sd"][0] == team["difference_error_sd"][2]  # nothing to adapt
  assert critic["difference_error_sd"][0] != critic["difference_error_sd"][2]
  assert np.shape(critic["critic_loss"]) == (3, 2) and "critic_loss" not in team  # [N][S]
  md = (tmp_path / "report" / "report.md").read_text()
  assert "### Against adaptation batches" in md and "| 2 | critic | 2 |" in md
  with open(tmp_path / "report" / "fidelity_curve.csv") as f:
    assert len(list(csv.DictReader(f))) == 2 * 3  # estimators x counts, one game
  # An empty curve changes no number, so cells written before it existed keep their settings.
  config.fidelity.adapt_curve = ""
  assert "adapt_curve" not in benchmark.fidelity_settings(config)


def test_an_unknown_benchmark_key_is_refused_on_one_line(tmp_path):
  # It was an AttributeError traceback: the benchmark parses its flags as main does.
  cmd = [sys.executable, "-m", "marl_jax.tools.credit_benchmark", f"--config={BENCH}:size=tiny",
         f"--workdir={tmp_path / 'bench'}", "--config.fidelity.rolez=2"]
  result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      "FATAL Flags parsing error: flag --config.fidelity.rolez=2: config.fidelity.rolez is not a key; "
      "allowed: ['adapt_curve', 'adapt_steps', 'batch_size', 'demo_error_rate', 'games', 'num_seeds', 'roles', 'sft_steps']")
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "bench").exists()
