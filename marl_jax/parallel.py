"""Devices: the `data` mesh axis the batch is sharded over, the `model` axis parameters may be split
over, and multi-host start-up; and seeds, vmapped in groups (`over_seeds`)."""
import os

import jax
import jax.numpy as jnp
from jax.sharding import AxisType

DATA = "data"
MODEL = "model"


def over_seeds(fn, seeds_at_once: int):
  """`jax.vmap(fn)` over the leading (seed) axis of every argument, computed `seeds_at_once` seeds at a
  time with the groups in sequence (`jax.lax.map`'s batch_size; `config.seeds_at_once`), or every seed
  at once (0)."""
  if not seeds_at_once:
    return jax.vmap(fn)
  return lambda *args_S: jax.lax.map(lambda args: fn(*args), args_S, batch_size=seeds_at_once)


def rows_per_pass(size: int, rows: int) -> int:
  """Rows per pass through the model when a setting (`config.rl.rollout_batch_size`,
  `config.rl.microbatch_size`, `config.eval.batch_size`) caps a pass of `rows` rows at `size`: 0 or a size of at least `rows` is
  one pass, so the same config runs on any device count that leaves whole passes."""
  return min(size or rows, rows)


def row_chunks(size: int, args_B):
  """`args_B` (leading axis B) split into chunks of `rows_per_pass(size, B)` rows on a new leading
  chunk axis, or None where that is one pass of all B rows."""
  B = jax.tree.leaves(args_B)[0].shape[0]
  rows = rows_per_pass(size, B)
  if rows == B:
    return None
  return jax.tree.map(lambda x: x.reshape(B // rows, rows, *x.shape[1:]), args_B)


def in_row_chunks(fn, size: int, *args_B):
  """`fn(*args_B)` over at most `size` rows of the arguments (leading axis B) at a time, the chunks in
  sequence (`jax.lax.map`), so that one chunk's work is in memory at once: its outputs stacked on a
  leading chunk axis (a single chunk, with no loop, where `rows_per_pass` is B).  `fn` must treat
  rows independently."""
  chunks = row_chunks(size, args_B)
  if chunks is None:
    return jax.tree.map(lambda x: x[None], fn(*args_B))
  return jax.lax.map(lambda chunk: fn(*chunk), chunks)


def summed_over_row_chunks(fn, size: int, *args_B):
  """The sum of `fn` (a pytree of arrays) over at most `size` rows of the arguments (leading axis B) at a
  time, the chunks in sequence (`jax.lax.scan`), so that one chunk's work (its backward pass, for a
  gradient) is in memory at once; `fn(*args_B)` itself where `rows_per_pass` is B."""
  chunks = row_chunks(size, args_B)
  if chunks is None:
    return fn(*args_B)
  add = lambda total, chunk: (jax.tree.map(jnp.add, total, fn(*chunk)), None)
  zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(fn, *jax.tree.map(lambda x: x[0], chunks)))
  return jax.lax.scan(add, zeros, chunks)[0]


def make_mesh(num_devices: int = 0, model_shards: int = 1) -> jax.sharding.Mesh:
  """A `data` mesh over the first `num_devices` devices (0: all, across every process); with
  `model_shards` > 1 a (data, model) mesh whose `model` axis splits each parameter set
  (`config.model_shards`; the batch is split over the remaining `data` axis)."""
  available = jax.device_count()
  n = available if num_devices in (0, None) else num_devices
  if n > available:
    raise ValueError(f"config.num_devices={num_devices} but only {available} devices are visible; "
                     f"allowed: 0 (all of them) to {available}")
  # Every process runs the step on its own devices: one left without any could not take part.
  if len({d.process_index for d in jax.devices()[:n]}) < jax.process_count():
    whole = sorted({i for i in range(1, available + 1)
                    if len({d.process_index for d in jax.devices()[:i]}) == jax.process_count()})
    raise ValueError(f"config.num_devices={num_devices} leaves out every device of some of the "
                     f"{jax.process_count()} processes; allowed: 0 (all of them) or {whole[0]} to {available}")
  if model_shards < 1 or n % model_shards:
    raise ValueError(f"config.model_shards={model_shards} does not divide the {n} devices "
                     f"(config.num_devices={num_devices}); allowed: a divisor of {n}")
  if model_shards == 1:
    return auto_mesh({DATA: n}, jax.devices()[:n])
  return auto_mesh({DATA: n // model_shards, MODEL: model_shards}, jax.devices()[:n])


def shard_map(f, mesh: jax.sharding.Mesh, in_specs, out_specs):
  """`jax.shard_map` manual over `data` only: each device runs `f` on its rows, and on a mesh with a
  `model` axis XLA places the split parameters' communication inside `f` (that axis stays Auto)."""
  return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, axis_names={DATA},
                       check_vma=False)


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


# Collectives over the `data` axis, inside the sharded step.  Each is the identity on a one-device
# `data` axis (model_shards = the device count): there XLA's SPMD partitioner refuses a collective
# over the manual `data` axis of a value split over the Auto `model` axis.

def _over_data(collective):
  return lambda tree: tree if jax.lax.axis_size(DATA) == 1 else collective(tree, DATA)


mean_over_devices = _over_data(jax.lax.pmean)  # the mean of a per-device value over the devices
sum_over_devices = _over_data(jax.lax.psum)
max_over_devices = _over_data(jax.lax.pmax)


def gather_rows(tree):
  """This device's rows -> the global batch (every device's rows, in row order)."""
  gather = _over_data(lambda x, axis: jax.lax.all_gather(x, axis, tiled=True))
  return jax.tree.map(gather, tree)


def own_rows(x_xB, rows: int):
  """This device's `rows` of a global batch (on the last axis): the inverse of `gather_rows`."""
  first_row = jax.lax.axis_index(DATA) * rows
  return jax.lax.dynamic_slice_in_dim(x_xB, first_row, rows, axis=-1)
