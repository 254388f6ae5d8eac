"""Shared test setup: JAX on CPU with its default (single) device, fast compiles and a shared cache.

Tests that need several CPU devices add the device count to XLA_FLAGS (see parallel_test.py).
`pytest.ini` runs the fast tier by default; `-m slow` runs the slow tier, `-m ""` both.
"""
import importlib.metadata
import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before any test module imports jax
# The suite's time is mostly XLA compiling tiny programs that then run for milliseconds: without
# LLVM's optimisation passes it compiles about a third faster, and without the CPU backend's newer
# fusion emitters another third (the tiny solver-verifier step: 11.3 -> 8.4 s); the results only
# round differently.
# The XLA of jaxlib 0.11 and later no longer knows the emitters' switch, and XLA aborts the process
# on a flag it does not know: the switch goes only to older jaxlibs (version read without importing
# jax, which reads XLA_FLAGS once).
_FAST_COMPILE_FLAGS = ["--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true"]
if tuple(int(part) for part in importlib.metadata.version("jaxlib").split(".")[:2]) < (0, 11):
  _FAST_COMPILE_FLAGS.append("--xla_cpu_use_fusion_emitters=false")
os.environ["XLA_FLAGS"] = " ".join(dict.fromkeys(
    os.environ.get("XLA_FLAGS", "").split() + _FAST_COMPILE_FLAGS))
# Every program goes to the persistent cache below, not only those that took a second to compile.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Many tests (and the CLI runs they start) compile the same tiny programs: a persistent compilation
# cache, shared by the test processes and their subprocesses, compiles each once per machine.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      str(pathlib.Path(__file__).resolve().parents[1] / ".pytest_cache" / "jax"))


def pytest_collection_modifyitems(session, config, items):
  """Spreads the slow tests evenly over the first 80% of the run, fast tests filling the gaps.

  pytest-xdist (`-n 2`) hands each worker runs of consecutive tests; slow tests bunched together (as
  collection order puts them, or a slow-first sort) would land on one worker while the other idles.
  Evenly spread, every run of tests carries its share, and the last tests to start are fast ones.
  """
  slow = [item for item in items if item.get_closest_marker("slow")]
  fast = [item for item in items if not item.get_closest_marker("slow")]
  if not slow:
    return
  stride = 0.8 * len(items) / len(slow)
  ordered, fast_iter = [], iter(fast)
  for j, item in enumerate(slow):
    while len(ordered) < round(j * stride):
      ordered.append(next(fast_iter))
    ordered.append(item)
  ordered.extend(fast_iter)
  items[:] = ordered
