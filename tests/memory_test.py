"""What a compiled program needs on a device, and the refusal of one that needs more (`marl_jax.memory`);
the run-level refusal is in reliability_test.py."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marl_jax import memory

X = jax.ShapeDtypeStruct((128, 128), jnp.float32)  # 64 KiB


def test_need_counts_held_buffers_temporaries_and_new_outputs():
  # x -> tanh(x @ x) + 1 takes and returns 64 KiB; XLA fuses it into one product and one pass.
  program = jax.jit(lambda x: jnp.tanh(x @ x) + 1)
  assert memory.need(program.lower(X).compile(), 0) == memory.Need(resident=65536, temporary=0, output=65536)
  # Buffers held beside the program (the run's whole state) count in place of its arguments...
  assert memory.need(program.lower(X).compile(), 1 << 20).resident == 1 << 20
  # ...and an output written over a donated argument is no new memory (the product then needs a
  # temporary: its input is read while it is written).
  donated = memory.need(jax.jit(lambda x: jnp.tanh(x @ x) + 1, donate_argnums=0).lower(X).compile(), 0)
  assert donated == memory.Need(resident=65536, temporary=65536, output=0)
  assert donated.total == 131072


def test_per_device_bytes_counts_each_devices_share():
  tree = {"a": X, "b": np.zeros(10, np.int8)}
  assert memory.per_device_bytes(tree) == 65536 + 10
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  split = jax.ShapeDtypeStruct((128, 128), jnp.float32,
                               sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
  assert memory.per_device_bytes(split) == 65536 // len(mesh.devices.flat)


def test_check_refuses_the_first_program_over_the_limit_naming_what_shrinks_it():
  fits = memory.Need(resident=1 << 29, temporary=1 << 28, output=0)  # 0.75 GiB
  too_big = memory.Need(resident=1 << 30, temporary=3 << 30, output=1 << 29)  # 4.5 GiB
  programs = {"evaluation": (fits, "config.eval.size=512"), "train call": (too_big, "config.rl.batch_size=4")}
  memory.check(programs, limit=5 << 30)
  memory.check(programs, limit=None)  # a backend that reports no limit
  memory.check({"train call": (None, "config.rl.batch_size=4")}, limit=1)  # nor a memory analysis
  with pytest.raises(ValueError) as error:
    memory.check(programs, limit=4 << 30)
  assert str(error.value) == (
      f"the train call needs 4.5 GiB on each device (1 GiB of state and inputs held, 3 GiB of "
      f"temporaries, 512 MiB of new outputs), more than the 4 GiB a program may use on this "
      f"{jax.default_backend()} device; lower config.rl.batch_size=4")
  with pytest.raises(ValueError, match="the evaluation needs 768 MiB .* lower config.eval.size=512"):
    memory.check(programs, limit=1 << 29)


def test_the_device_limit_is_the_machines_memory_on_a_cpu():
  assert jax.default_backend() == "cpu"  # conftest.py
  meminfo = pathlib.Path("/proc/meminfo").read_text().splitlines()
  mem_total_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
  assert memory.device_limit() == mem_total_kib * 1024


class _Device:
  def __init__(self, stats):
    self.stats = stats

  def memory_stats(self):
    return self.stats


def test_the_peak_memory_is_logged_where_the_allocator_reports_it(monkeypatch):
  assert memory.peak_scalars() == {}  # the CPU's allocator reports none
  monkeypatch.setattr(jax, "local_devices", lambda: [_Device({"peak_bytes_in_use": 3 * 2 ** 29,
                                                                "bytes_in_use": 2 ** 20})])
  assert memory.peak_scalars() == {"device_peak_gib": 1.5}
  monkeypatch.setattr(jax, "local_devices", lambda: [_Device(None)])
  assert memory.peak_scalars() == {}
