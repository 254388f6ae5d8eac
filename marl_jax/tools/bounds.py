"""What this machine can deliver, measured in the same run as what is compared with it: the rate of a
jitted matmul (`matmul_flops_per_s`, the bound of compute-heavy work) and of a copy through memory
(`copy_bytes_per_s`, the bound of a decode step), and what a row ran on."""
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from marl_jax import model as model_lib


HUGE_PAGES = "glibc.malloc.hugetlb=1"  # the setting docs/throughput.md recommends on a Linux CPU


def device_name() -> str:
  """What a row ran on: the accelerator's kind (`device_kind`), or on CPU the cores this process may use."""
  if jax.default_backend() == "cpu":
    return f"{len(os.sched_getaffinity(0))} cores"
  return jax.devices()[0].device_kind


def huge_pages(environ=os.environ, kernel_setting="/sys/kernel/mm/transparent_hugepage/enabled") -> bool:
  """Whether glibc's malloc puts this process's large blocks on transparent huge pages: GLIBC_TUNABLES
  (read by glibc when the process starts) holds `HUGE_PAGES` and the kernel's setting is not `never`.
  XLA:CPU allocates each call's buffers afresh, and on 4 kB pages the kernel faults every page in on
  every call."""
  if HUGE_PAGES not in environ.get("GLIBC_TUNABLES", "").split(":"):
    return False
  try:
    with open(kernel_setting) as f:
      return "[never]" not in f.read()
  except OSError:  # no such setting (not Linux): glibc's request goes nowhere
    return False


def reference_matmul() -> tuple[int, jnp.dtype]:
  """The matmul every row is a fraction of: float32 1024 x 1024 on a CPU, and on an accelerator one
  that fills it, 8192 x 8192 in the compute dtype of `model.dtype='auto'` there (bfloat16).  A float32
  1024 x 1024 matmul leaves an H200 mostly idle (43 TFLOP/s, against 806 for bfloat16 at 8192, one
  call), so the job's rows would read above 1 of it."""
  if jax.default_backend() == "cpu":
    return 1024, jnp.float32
  return 8192, model_lib.compute_dtype("auto")


def matmul_flops_per_s(reps: int = 20) -> float:
  """FLOP/s of the jitted `reference_matmul` on this machine (the best of three timings)."""
  n, dtype = reference_matmul()
  # Scaled so that repeated products keep unit-sized entries (unscaled, they overflow to inf).
  a = (jax.random.normal(jax.random.PRNGKey(0), (n, n)) / math.sqrt(n)).astype(dtype)
  return 2 * n ** 3 / best_seconds_per_call(jax.jit(lambda x: x @ a), a, reps)


def best_seconds_per_call(step, x, reps: int) -> float:
  """Seconds per call of `step` chained `reps` times (x = step(x)), the best of three timings after
  one untimed call (its compile)."""
  x = step(x).block_until_ready()
  best = np.inf
  for _ in range(3):
    start = time.perf_counter()
    for _ in range(reps):
      x = step(x)
    x.block_until_ready()
    best = min(best, (time.perf_counter() - start) / reps)
  return best


def copy_bytes_per_s(mib: int = 512, reps: int = 5) -> float:
  """Bytes read and written per second by a jitted elementwise pass over a float32 array of `mib`
  MiB (far larger than any cache), the best of three timings: the memory bound of the decode row."""
  x = jnp.ones(mib * 2 ** 18, jnp.float32)
  # Donated, so each pass writes over its input: a fresh output would time the kernel's page faults.
  step = jax.jit(lambda y: y * 1.0001, donate_argnums=0)
  return 2 * mib * 2 ** 20 / best_seconds_per_call(step, x, reps)
