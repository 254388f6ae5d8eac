"""The throughput script: the FLOP count of a step and of its rollout, the per-workflow table, and
one tiny timed row split into rollout and update."""
import jax
import ml_collections
import pytest

from marl_jax import experiment, sampling, state as state_lib, throughput


def test_workflow_table_has_every_workflow_and_the_minimum_is_a_floor(capsys):
  throughput.workflow_flops_table()
  rows = capsys.readouterr().out.splitlines()[1:]
  assert [r[:30].strip() for r in rows] == [name for name, _, _ in throughput.WORKFLOWS]
  ratios = [float(r.split()[-1]) for r in rows]
  assert all(1.0 <= ratio < 2.0 for ratio in ratios)


def test_step_flops_counts_the_rollout_reruns_and_update():
  # The relay job with difference credit: R x K = 2 x 2 re-runs of every episode.
  exp = experiment.build(throughput.relay_config(2, 1, "difference", batch_size=8, steps_per_call=1))
  layout, rl = exp.layout, exp.config.rl
  per_token = exp.model.flops_per_token(layout.length)
  rollout = sampling.token_reads(layout) * per_token
  update = len(layout.view_set_V) * layout.length * 3 * rl.epochs * per_token
  assert throughput.step_flops(exp) == rl.batch_size * ((1 + 2 * 2) * rollout + update)
  assert throughput.rollout_flops(exp) == rl.batch_size * rollout
  # Three voters of one set read alike (the prompt and their own answer): three views, one update pass.
  config = throughput.relay_config(3, 1, "team", batch_size=8, steps_per_call=1)
  config.protocol = ml_collections.ConfigDict(dict(name="vote", voters=3))
  config.roles.sharing = "shared"
  exp = experiment.build(config)
  layout, per_token = exp.layout, exp.model.flops_per_token(exp.layout.length)
  assert len(layout.view_set_V) == 3
  update = 1 * layout.length * 3 * rl.epochs * per_token
  assert throughput.step_flops(exp) == rl.batch_size * (sampling.token_reads(layout) * per_token + update)


@pytest.mark.slow
def test_a_row_times_the_step_and_its_rollout():
  config = throughput.relay_config(2, 2, "team", batch_size=8, steps_per_call=2)
  config.model.update(d_model=16, n_layers=1, n_heads=2, d_ff=32)
  config.num_devices = 1
  # The rollout program samples steps x seeds x batch episodes of two agents writing 1 to 4 tokens.
  exp = experiment.build(config)
  tokens = float(throughput.make_rollout_call(exp)(state_lib.initial_state(exp).params, jax.random.PRNGKey(0)))
  episodes = 2 * 2 * 8
  assert 2 * episodes <= tokens <= 8 * episodes
  row = throughput.measure(config, calls=1)
  assert all(row[k] > 0 for k in ("tokens_per_s", "flops_per_s", "rollout_tokens_per_s", "rollout_flops_per_s",
                                  "update_tokens_per_s", "update_flops_per_s"))
