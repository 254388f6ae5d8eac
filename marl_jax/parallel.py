"""Devices: the `data` mesh axis the batch is sharded over, and multi-host start-up."""
import os

import jax
from jax.sharding import AxisType

DATA = "data"


def make_mesh(num_devices: int = 0) -> jax.sharding.Mesh:
  """A 1-D `data` mesh over the first `num_devices` devices (0: all, across every process)."""
  available = jax.device_count()
  n = available if num_devices in (0, None) else num_devices
  if n > available:
    raise ValueError(f"config.num_devices={num_devices} but only {available} devices are visible; "
                     f"allowed: 0 (all of them) to {available}")
  return auto_mesh({DATA: n}, jax.devices()[:n])


def auto_mesh(axis_sizes: dict[str, int], devices) -> jax.sharding.Mesh:
  """A mesh whose axes are all Auto: XLA propagates shardings from the inputs' (new jax's
  `make_mesh` defaults to Explicit axes, which would demand a sharding rule for every operation)."""
  return jax.make_mesh(tuple(axis_sizes.values()), tuple(axis_sizes),
                       axis_types=(AxisType.Auto,) * len(axis_sizes), devices=devices)


def initialize_distributed() -> None:
  """Joins the hosts of a TPU pod / GPU cluster (coordinates from the environment, or from
  JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID for local multi-process runs)."""
  if "JAX_COORDINATOR_ADDRESS" in os.environ:
    jax.distributed.initialize(
        coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]))
  else:
    jax.distributed.initialize()


def mean_over_devices(x):
  """The mean of a per-device value over the `data` axis (inside the sharded step)."""
  return jax.lax.pmean(x, DATA)


def gather_rows(tree):
  """This device's rows -> the global batch (every device's rows, in row order)."""
  return jax.tree.map(lambda x: jax.lax.all_gather(x, DATA, tiled=True), tree)


def own_rows(x_xB, rows: int):
  """This device's `rows` of a global batch (on the last axis): the inverse of `gather_rows`."""
  first_row = jax.lax.axis_index(DATA) * rows
  return jax.lax.dynamic_slice_in_dim(x_xB, first_row, rows, axis=-1)
