"""The throughput script: the FLOP count of a step and of its rollout, the per-workflow table, the
profile's thunk kinds, and one tiny timed and profiled row split into rollout and update."""
import os
import subprocess
import sys
import textwrap

import jax
import ml_collections
import numpy as np
import pytest

from marl_jax import configs, credit, experiment, sampling, state as state_lib
from marl_jax.tools import throughput


def test_workflow_table_has_every_workflow_and_the_minimum_is_a_floor(capsys):
  throughput.workflow_flops_table()
  rows = capsys.readouterr().out.splitlines()[1:]
  assert [r[:30].strip() for r in rows] == [name for name, _, _ in throughput.WORKFLOWS]
  ratios = [float(r.split()[-1]) for r in rows]
  assert all(1.0 <= ratio < 2.0 for ratio in ratios)


def _three_voters_of_one_set(steps_per_call: int):
  config = throughput.relay_config(3, 1, "team", batch_size=8, steps_per_call=steps_per_call)
  config.protocol = ml_collections.ConfigDict({"name": "vote", "voters": 3})
  config.roles.sharing = "shared"
  return config


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
  exp = experiment.build(_three_voters_of_one_set(steps_per_call=1))
  layout, per_token = exp.layout, exp.model.flops_per_token(exp.layout.length)
  assert len(layout.view_set_V) == 3
  # Shared sets: the per-role gradient norms of the call's last step, a forward and three backward
  # passes (2x each) over the minibatch: 7 more passes, here in a call of one step.
  update = 1 * layout.length * (3 * rl.epochs + 1 + 2 * 3) * per_token
  assert throughput.step_flops(exp) == rl.batch_size * (sampling.token_reads(layout) * per_token + update)
  # Two epochs of a forward and backward (3 passes each), a forward under the base model for the KL
  # term, and the 7 gradient-norm passes over one of 2 minibatches on one of a call's 2 steps.
  config = _three_voters_of_one_set(steps_per_call=2)
  config.rl.update(epochs=2, kl_coef=0.1, minibatches=2)
  exp = experiment.build(config)
  update = layout.length * (3 * 2 + 1 + 7 / (2 * 2)) * per_token
  assert throughput.step_flops(exp) == pytest.approx(8 * (sampling.token_reads(layout) * per_token + update))


def test_a_wider_relay_job_keeps_its_shape_and_counts_its_own_flops():
  # --d_model widens the agents (d_ff 4x, 4 heads) and nothing else: the same canvas and reads, each
  # token's FLOPs those of the wider model (dense products 4x at twice the width).
  narrow, wide = (experiment.build(throughput.relay_config(2, 1, "team", batch_size=8, steps_per_call=1,
                                                           d_model=d)) for d in (128, 256))
  assert (wide.model.d_model, wide.model.d_ff, wide.model.n_heads) == (256, 1024, 4)
  assert wide.layout == narrow.layout
  ratio = wide.model.flops_per_token(wide.layout.length) / narrow.model.flops_per_token(narrow.layout.length)
  assert throughput.step_flops(wide) == pytest.approx(ratio * throughput.step_flops(narrow))
  assert 3.5 < ratio < 4


def _refusal(*flags: str) -> str:
  """The last stderr line of the throughput CLI given `flags`, which it must refuse: exit status 1, no
  traceback, nothing printed to stdout (no row began: its header line comes before any timing)."""
  done = subprocess.run([sys.executable, "-m", "marl_jax.tools.throughput", *flags], capture_output=True, text=True,
                        check=False, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert done.returncode == 1, done.stderr[-2000:]
  assert "Traceback" not in done.stderr and done.stdout == ""
  return done.stderr.strip().splitlines()[-1]


def test_the_cli_refuses_a_width_for_checkpoint_agents():
  # A checkpoint's shapes are its own: --d_model beside --checkpoint would be silently ignored.
  assert _refusal("--checkpoint=tests/fixtures/lm/qwen3", "--d_model=256") == (
      "FATAL Flags parsing error: flags checkpoint=tests/fixtures/lm/qwen3, d_model=256: --d_model=256 sets the "
      "built-in agents' width; with --checkpoint the checkpoint's config.json does: leave --d_model at its "
      "default (128)")


@pytest.mark.parametrize("flags, line", [
    # Each flag when parsed (absl's validators and bounds: the flag, its value and what is allowed) ...
    (["--grid=2"], ("FATAL Flags parsing error: flag --grid=2: allowed: ROLES/SEEDS, comma-separated "
                    "integers >= 1 each, e.g. '1,2,4/1,4'")),
    (["--credits=team,nope"], ("FATAL Flags parsing error: flag --credits=team,nope: allowed: one or more of "
                               f"{', '.join(sorted(credit.REGISTRY))}, comma-separated")),
    (["--workflows", "--grid=2/1", "--calls=1"], ("FATAL Flags parsing error: flag --workflows=True: it "
                                                  "times no rows, so it would ignore --calls, --grid; "
                                                  "allowed: --workflows alone")),
    # ... then every row's config built before the first is timed, its error naming the flag ...
    (["--grid=1/1", "--d_model=6"], ("FATAL ConfigError: the row roles=1, seeds=1, sharing=isolated, "
                                     "credit=team: config.model.d_model=6 does not divide by "
                                     "config.model.n_heads=4; allowed: multiples of it (from --d_model=6)")),
    (["--random_weights"], ("FATAL Flags parsing error: flags random_weights=True, checkpoint=: "
                            "--random_weights initialises a checkpoint's shapes at random; allowed: with "
                            "--checkpoint=DIR")),  # it timed the built-in agents, ignoring the flag
    # ... and the JSON file's directory checked (the old script wrote it after the first row, minutes in).
    (["--json={tmp}/missing/rows.json"], ("FATAL Flags error: --json={tmp}/missing/rows.json: No such file "
                                          "or directory; allowed: a file that can be written, in a "
                                          "directory that exists")),
    (["--json={tmp}"], ("FATAL Flags error: --json={tmp}: Is a directory; allowed: a file that can be "
                        "written, in a directory that exists")),
], ids=["grid", "credits", "workflows", "d_model", "random_weights", "json", "json_directory"])
def test_the_cli_refuses_a_bad_flag_in_one_line_before_timing(flags, line, tmp_path):
  assert _refusal(*(f.format(tmp=tmp_path) for f in flags)) == line.format(tmp=tmp_path)


@pytest.mark.slow
def test_a_row_that_does_not_fit_the_device_is_refused_before_its_state_is_made():
  # The 0.6B-parameter row was killed on this 2-core CPU without a message; a row is now compiled from
  # its state's shapes and refused when it needs more than the device allows (here: 1 MiB).
  code = ("import runpy; from marl_jax import memory; memory.device_limit = lambda: 1 << 20; "
          "runpy.run_module('marl_jax.tools.throughput', run_name='__main__')")
  done = subprocess.run([sys.executable, "-c", code, "--grid=1/1", "--credits=team", "--batch_size=8",
                         "--calls=1"], capture_output=True, text=True, check=False, timeout=600,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
  line = done.stderr.strip().splitlines()[-1]
  assert line.startswith("FATAL ConfigError: the row roles=1, seeds=1, sharing=isolated, credit=team: the "
                         "train call needs "), line
  assert line.endswith("more than the 1 MiB a program may use on this cpu device; lower "
                       "config.rl.microbatch_size=0 (the update passes 8 rows at a time through the model), "
                       "config.rl.rollout_batch_size=0 (the rollout samples 8 rows at a time), "
                       "config.rl.batch_size=8, or set config.model.remat=True (the update recomputes "
                       "activations) (from --batch_size=8, --microbatch_size=0)"), line
  assert "completions/s" in done.stdout and done.stdout.strip().splitlines()[-1].startswith("roles")  # no row


def test_an_earlier_json_file_stays_until_a_row_replaces_it(tmp_path):
  # A run stopped before its first row is measured (a crash, ^C) leaves the earlier rows where they
  # were; the old script emptied the file to `[]` before timing anything.
  rows = tmp_path / "rows.json"
  rows.write_text('[{"completions_per_s": 1.0}]')
  with subprocess.Popen([sys.executable, "-m", "marl_jax.tools.throughput", "--grid=1/1", "--credits=team",
                         "--batch_size=8", f"--json={rows}"], stdout=subprocess.PIPE, text=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"}) as run:
    try:
      for line in run.stdout:
        if "completions/s" in line:  # the table's header: the flags and --json checked, timing begins
          break
      assert rows.read_text() == '[{"completions_per_s": 1.0}]'
      assert not os.path.exists(f"{rows}.tmp")
    finally:
      run.kill()


@pytest.mark.slow
@pytest.mark.parametrize("sharing", ["isolated", "shared"])
def test_a_row_times_the_step_and_its_rollout(sharing):
  config = throughput.relay_config(2, 2, "team", batch_size=8, steps_per_call=2, sharing=sharing)
  config.model.update(d_model=16, n_layers=1, n_heads=2, d_ff=32)
  config.num_devices = 1
  # The rollout program samples steps x seeds x batch episodes of two agents writing 1 to 4 tokens.
  exp = experiment.build(config)
  tokens = float(throughput.make_rollout_call(exp)(state_lib.initial_state(exp).params, jax.random.PRNGKey(0)))
  episodes = 2 * 2 * 8
  assert 2 * episodes <= tokens <= 8 * episodes
  row = throughput.measure(config, calls=1, profile=True)
  assert set(row["thunk_s"]) == set(throughput.THUNK_KINDS) == {"matmul", "data movement", "compute"}
  assert row["thunk_s"]["matmul"] > 0 and row["thunk_s"]["compute"] > 0
  # The traced call's dots are the model FLOPs the analytic count gives, and little else (the group
  # baseline's and the loss's small products); with shared sets, the per-role gradient norms too.
  traced_flops = sum(flops for _, flops in row["matmul_thunks"])
  assert traced_flops == pytest.approx(row["flops_per_s"] * row["call_s"], rel=0.01)
  assert sum(s for s, _ in row["matmul_thunks"]) == pytest.approx(row["thunk_s"]["matmul"])
  assert all(row[k] > 0 for k in ("tokens_per_s", "flops_per_s", "rollout_tokens_per_s", "rollout_flops_per_s",
                                  "update_tokens_per_s", "update_flops_per_s"))


@pytest.mark.slow
def test_the_rollout_alone_is_split_over_devices_as_the_step_is():
  # Two CPU devices in a fresh process: the rollout program samples the same episodes (keys per row)
  # over one device or split over two, and its compiled program runs on both.
  code = textwrap.dedent("""
      import jax
      jax.config.update("jax_num_cpu_devices", 2)
      from marl_jax import experiment, state as state_lib
      from marl_jax.tools import throughput
      config = throughput.relay_config(2, 2, "team", batch_size=8, steps_per_call=2)
      config.model.update(d_model=16, n_layers=1, n_heads=2, d_ff=32)
      config.rl.group_size = 4
      tokens = []
      for devices in (1, 2):
        config.num_devices = devices
        exp = experiment.build(config)
        call = throughput.make_rollout_call(exp)
        params_S = state_lib.initial_state(exp).params
        tokens.append(float(call(params_S, jax.random.PRNGKey(0))))
      shardings = call.lower(params_S, jax.random.PRNGKey(0)).compile().input_shardings
      print(*tokens, len(jax.tree.leaves(shardings)[0].device_set))
      """)
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  one_device, two_devices, devices_used = map(float, result.stdout.split()[-3:])
  assert one_device == two_devices and devices_used == 2


# A compiled module's text as XLA:CPU prints it: a dot fused for the matmul library, a transpose
# fusion, an elementwise fusion around a reduction, a bare dot, and a loop (its body's thunks are
# traced themselves).
HLO = """HloModule jit_f, entry_computation_layout={(f32[4,4]{1,0})->f32[4,4]{1,0}}

%fused_dot (param_0: f32[3,5], param_1: f32[5,7]) -> f32[3,7] {
  %param_0 = f32[3,5]{1,0} parameter(0)
  %param_1 = f32[5,7]{1,0} parameter(1)
  ROOT %dot.0 = f32[3,7]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_transpose (param_0.1: f32[4,4]) -> f32[4,4] {
  %param_0.1 = f32[4,4]{1,0} parameter(0)
  %transpose.0 = f32[4,4]{0,1} transpose(%param_0.1), dimensions={1,0}
  ROOT %copy.0 = f32[4,4]{1,0} copy(%transpose.0)
}

%fused_tanh (param_0.2: f32[4,4]) -> f32[4] {
  %param_0.2 = f32[4,4]{1,0} parameter(0)
  %tanh.0 = f32[4,4]{1,0} tanh(%param_0.2)
  %constant.0 = f32[] constant(0)
  ROOT %reduce.0 = f32[4]{0} reduce(%tanh.0, %constant.0), dimensions={1}, to_apply=%add
}

ENTRY %main.9 (a.1: f32[4,4]) -> f32[4,4] {
  %a.1 = f32[4,4]{1,0} parameter(0)
  %ynn_fusion = f32[4,4]{1,0} fusion(%a.1, %a.1), kind=kCustom, calls=%fused_dot
  %copy_fusion = f32[4,4]{1,0} fusion(%ynn_fusion), kind=kLoop, calls=%fused_transpose, backend_config={"outer_dimension_partitions":["2","3"]}
  %tanh_reduce_fusion = f32[4]{0} fusion(%copy_fusion), kind=kLoop, calls=%fused_tanh
  %dot.1 = f32[4,4]{1,0} dot(%copy_fusion, %a.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %tuple.1 = (f32[4,4]{1,0}, s32[]) tuple(%dot.1, %c)
  %while.1 = (f32[4,4]{1,0}, s32[]) while(%tuple.1), condition=%cond, body=%body
  ROOT %get-tuple-element.1 = f32[4,4]{1,0} get-tuple-element(%while.1), index=0
}
"""


def test_thunk_kinds_sort_the_instructions_that_run_as_thunks():
  kinds = throughput.thunk_kinds(HLO)
  assert kinds["ynn_fusion"] == kinds["dot.1"] == "matmul"
  assert kinds["copy_fusion"] == "data movement"
  assert kinds["tanh_reduce_fusion"] == "compute"
  assert "while.1" not in kinds


def test_thunk_parts_read_the_split_of_each_loop():
  assert throughput.thunk_parts(HLO) == {"copy_fusion": 2 * 3}


def test_dot_flops_count_each_dot_from_its_shapes():
  # The fused dot is [3, 5] x [5, 7]: 2 x 21 outputs x 5 contracted, counted for the fusion (its
  # thunk); the bare one [4, 4] x [4, 4] for itself.  (The fixture's shapes are chosen for the count:
  # the fusion's declared output does not match its computation's.)
  flops = throughput.dot_flops(HLO)
  assert flops["ynn_fusion"] == 2 * 21 * 5 and flops["dot.1"] == 2 * 16 * 4
  assert "copy_fusion" not in flops and "tanh_reduce_fusion" not in flops


def test_ceiling_packs_the_other_thunks_onto_the_cores():
  # 100 FLOPs of dots at a bound of 10 FLOP/s take 10 s.  Of the other thunks, 2 s split in two keep
  # both cores busy (2 s), 4 s of single tasks pack onto 2 cores (2 s), and 4 s split in eight still
  # use only the 2 cores (4 s): 10 / 18 of the bound.  With the slow dot (5 FLOPs in 10 s, under a
  # tenth of the bound) kept at its time, packed as a single task: 9.5 s + 8 s + 10 / 2 s.
  row = {"thunk_s": {"matmul": 15.0, "data movement": 2.0, "compute": 8.0},
         "matmul_thunks": [[5.0, 95.0], [10.0, 5.0]], "other_thunks": [[2.0, 2], [4.0, 1], [4.0, 8]]}
  every_dot, slow_kept = throughput.ceiling(row, bound=10.0, cores=2)
  assert every_dot == pytest.approx(10 / 18)
  assert slow_kept == pytest.approx(10 / (9.5 + 8 + 5))


def test_profile_call_times_a_compiled_matmul():
  a = jax.numpy.ones((256, 256))
  compiled = jax.jit(lambda x: jax.numpy.tanh(x @ x).T @ x).lower(a).compile()
  summary = throughput.profile_summary(throughput.profile_call(compiled, (a,)), compiled.as_text())
  assert summary["thunk_s"]["matmul"] > 0
  assert sum(flops for _, flops in summary["matmul_thunks"]) == 2 * 2 * 256 ** 3


def test_the_reference_matmul_fills_the_machine_it_runs_on(monkeypatch):
  # On a CPU the float32 1024 x 1024; on an accelerator bfloat16 (model.dtype 'auto' there)
  # at 8192, which a float32 1024 x 1024 leaves mostly idle.
  assert throughput.reference_matmul() == (1024, jax.numpy.float32)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert throughput.reference_matmul() == (8192, jax.numpy.bfloat16)


def test_huge_pages_are_read_from_glibc_tunables_and_the_kernel(tmp_path):
  # glibc reads GLIBC_TUNABLES once at start: the header says whether this process got huge pages,
  # which also takes a kernel that grants them when asked.
  madvise, never = tmp_path / "madvise", tmp_path / "never"
  madvise.write_text("always [madvise] never\n")
  never.write_text("always madvise [never]\n")
  on = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
  assert throughput.huge_pages(on, madvise)
  assert throughput.huge_pages({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0:glibc.malloc.hugetlb=1"}, madvise)
  assert not throughput.huge_pages(on, never)
  assert not throughput.huge_pages(on, tmp_path / "missing")
  assert not throughput.huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, madvise)
  assert not throughput.huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=10"}, madvise)
  assert not throughput.huge_pages({}, madvise)


def test_each_view_counts_the_flops_of_its_own_model():
  # A mixed team (experiments/solver_verifier.py team=mixed): solver and verifier on models of two
  # widths, each view's reads at its own model's FLOPs per token.
  experiments = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "x.py")
  config = configs.sibling(experiments, "solver_verifier").get_config("size=tiny,team=mixed,credit=team")
  config.num_devices = 1
  exp = experiment.build(config)
  layout, rl = exp.layout, exp.config.rl
  solver, verifier = (exp.model.set_model(s) for s in exp.role_set_R)
  assert solver.d_model != verifier.d_model
  per_token_V = [(solver if layout.view_set_V[v] == exp.role_set_R[0] else verifier).flops_per_token(layout.length)
                 for v in range(len(layout.view_set_V))]
  reads_V = sampling.token_reads_V(layout) + layout.length * 3 * rl.epochs  # each view its own update pass
  assert throughput.step_flops(exp) == rl.batch_size * float(np.dot(reads_V, per_token_V))
