"""The throughput script's analytic parts: the FLOP count of a step and the per-workflow table."""
from marl_jax import experiment, sampling, throughput


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
