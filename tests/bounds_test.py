import jax

from marl_jax.tools import bounds


def test_the_reference_matmul_fills_the_machine_it_runs_on(monkeypatch):
  # On a CPU the float32 1024 x 1024; on an accelerator bfloat16 (model.dtype 'auto' there)
  # at 8192, which a float32 1024 x 1024 leaves mostly idle.
  assert bounds.reference_matmul() == (1024, jax.numpy.float32)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert bounds.reference_matmul() == (8192, jax.numpy.bfloat16)


def test_huge_pages_are_read_from_glibc_tunables_and_the_kernel(tmp_path):
  # glibc reads GLIBC_TUNABLES once at start: the header says whether this process got huge pages,
  # which also takes a kernel that grants them when asked.
  madvise, never = tmp_path / "madvise", tmp_path / "never"
  madvise.write_text("always [madvise] never\n")
  never.write_text("always madvise [never]\n")
  on = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
  assert bounds.huge_pages(on, madvise)
  assert bounds.huge_pages({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0:glibc.malloc.hugetlb=1"}, madvise)
  assert not bounds.huge_pages(on, never)
  assert not bounds.huge_pages(on, tmp_path / "missing")
  assert not bounds.huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, madvise)
  assert not bounds.huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=10"}, madvise)
  assert not bounds.huge_pages({}, madvise)
