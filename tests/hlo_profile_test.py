import jax
import pytest

from marl_jax.tools import hlo_profile


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
  kinds = hlo_profile.thunk_kinds(HLO)
  assert kinds["ynn_fusion"] == kinds["dot.1"] == "matmul"
  assert kinds["copy_fusion"] == "data movement"
  assert kinds["tanh_reduce_fusion"] == "compute"
  assert "while.1" not in kinds


def test_thunk_parts_read_the_split_of_each_loop():
  assert hlo_profile.thunk_parts(HLO) == {"copy_fusion": 2 * 3}


def test_dot_flops_count_each_dot_from_its_shapes():
  # The fused dot is [3, 5] x [5, 7]: 2 x 21 outputs x 5 contracted, counted for the fusion (its
  # thunk); the bare one [4, 4] x [4, 4] for itself.  (The fixture's shapes are chosen for the count:
  # the fusion's declared output does not match its computation's.)
  flops = hlo_profile.dot_flops(HLO)
  assert flops["ynn_fusion"] == 2 * 21 * 5 and flops["dot.1"] == 2 * 16 * 4
  assert "copy_fusion" not in flops and "tanh_reduce_fusion" not in flops


def test_ceiling_packs_the_other_thunks_onto_the_cores():
  # 100 FLOPs of dots at a bound of 10 FLOP/s take 10 s.  Of the other thunks, 2 s split in two keep
  # both cores busy (2 s), 4 s of single tasks pack onto 2 cores (2 s), and 4 s split in eight still
  # use only the 2 cores (4 s): 10 / 18 of the bound.  With the slow dot (5 FLOPs in 10 s, under a
  # tenth of the bound) kept at its time, packed as a single task: 9.5 s + 8 s + 10 / 2 s.
  row = {"thunk_s": {"matmul": 15.0, "data movement": 2.0, "compute": 8.0},
         "matmul_thunks": [[5.0, 95.0], [10.0, 5.0]], "other_thunks": [[2.0, 2], [4.0, 1], [4.0, 8]]}
  every_dot, slow_kept = hlo_profile.ceiling(row, bound=10.0, cores=2)
  assert every_dot == pytest.approx(10 / 18)
  assert slow_kept == pytest.approx(10 / (9.5 + 8 + 5))


def test_profile_call_times_a_compiled_matmul():
  a = jax.numpy.ones((256, 256))
  compiled = jax.jit(lambda x: jax.numpy.tanh(x @ x).T @ x).lower(a).compile()
  summary = hlo_profile.profile_summary(hlo_profile.profile_call(compiled, (a,)), compiled.as_text())
  assert summary["thunk_s"]["matmul"] > 0
  assert sum(flops for _, flops in summary["matmul_thunks"]) == 2 * 2 * 256 ** 3
