"""Device memory of the compiled programs, checked before a run trains: a config whose train call or
evaluation cannot fit on a device is refused with the keys that shrink it, before the warm start.
(On an H200 a language-model run's first train call ran out of memory only after its warm start and
first evaluation; on a CPU such a run is killed without a message.)  The programs are compiled
here from their input shapes; their first calls reuse the compiled executables."""
import dataclasses
import math
import os

import jax

from marl_jax import parallel


class DoesNotFit(ValueError):
  """A program needs more memory than the device allows."""


@dataclasses.dataclass(frozen=True)
class Need:
  """Bytes on one device while a program runs: the buffers held beside it (`resident`, at least its
  arguments), its temporaries, and its outputs that do not reuse a donated argument's buffer."""
  resident: int
  temporary: int
  output: int

  @property
  def total(self) -> int:
    return self.resident + self.temporary + self.output


def need(compiled: jax.stages.Compiled, resident: int) -> Need | None:
  """What `compiled` needs (None where the backend reports no memory analysis)."""
  analysis = compiled.memory_analysis()
  if analysis is None:
    return None
  return Need(resident=max(resident, analysis.argument_size_in_bytes),
              temporary=analysis.temp_size_in_bytes,
              output=max(analysis.output_size_in_bytes - analysis.alias_size_in_bytes, 0))


def per_device_bytes(tree) -> int:
  """Bytes of one device's share of `tree` (arrays or shape structs with shardings; unsharded leaves
  count whole)."""
  total = 0
  for x in jax.tree.leaves(tree):
    sharding = getattr(x, "sharding", None)
    shape = x.shape if sharding is None else sharding.shard_shape(x.shape)
    total += math.prod(shape) * x.dtype.itemsize
  return total


def device_limit() -> int | None:
  """Bytes a program may hold on this process's first device: the allocator's limit on a GPU or TPU,
  the machine's physical memory on a CPU (None if neither is known)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if "bytes_limit" in stats:
    return int(stats["bytes_limit"])
  if jax.default_backend() == "cpu":
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return None


def peak_scalars() -> dict:
  """{"device_peak_gib": the most memory this process's first device has held so far} where its
  allocator says (GPU, TPU), for the metrics; {} where it does not (CPU)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  return {"device_peak_gib": stats["peak_bytes_in_use"] / 2 ** 30} if "peak_bytes_in_use" in stats else {}


def readable(n: int) -> str:
  """Bytes in MiB below a GiB, else in GiB, to three digits."""
  return f"{n / 2 ** 30:.3g} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.3g} MiB"


def check(programs: dict[str, tuple[Need | None, str]], limit: int | None) -> None:
  """Raises DoesNotFit for the first program (name -> (its Need, the config keys that shrink it))
  that needs more than `limit` bytes, naming its parts and those keys."""
  for name, (n, shrink) in programs.items():
    if limit is None or n is None or n.total <= limit:
      continue
    raise DoesNotFit(
        f"the {name} needs {readable(n.total)} on each device ({readable(n.resident)} of state and inputs "
        f"held, {readable(n.temporary)} of temporaries, {readable(n.output)} of new outputs), more than the "
        f"{readable(limit)} a program may use on this {jax.default_backend()} device; lower {shrink}")


def check_run(exp, abstract, train_call, evaluator=None) -> jax.stages.Compiled:
  """Compiles a run's train call (and its `evaluate.Evaluator`, if given) from the state's shapes
  (`abstract`: `state.abstract_state(exp)`) and checks them (`check`) against this device's limit,
  naming the config keys that shrink each; returns the compiled train call (jit reuses both programs at
  their first calls)."""
  config, rl = exp.config, exp.config.rl
  held = per_device_bytes(abstract)  # the state stays on the devices while either runs
  devices = exp.mesh.shape[parallel.DATA]
  local_batch, eval_rows = rl.batch_size // devices, config.eval.size // devices
  seeds = f" or config.seeds_at_once={config.seeds_at_once}" if config.num_seeds > 1 else ""
  remat = "" if config.model.remat else ", or set config.model.remat=True (the update recomputes activations)"
  compiled = train_call.lower(abstract).compile()
  minibatch_rows = local_batch // rl.minibatches
  shrink_train = (f"config.rl.microbatch_size={rl.microbatch_size} (the update passes "
                  f"{parallel.rows_per_pass(rl.microbatch_size, minibatch_rows)} rows at a time through the "
                  f"model), config.rl.rollout_batch_size={rl.rollout_batch_size} (the rollout samples "
                  f"{parallel.rows_per_pass(rl.rollout_batch_size, local_batch)} rows at a time), "
                  f"config.rl.batch_size={rl.batch_size}{seeds}{remat}")
  programs = {"train call": (need(compiled, held), shrink_train)}
  if evaluator is not None:
    shrink_eval = (f"config.eval.batch_size={config.eval.batch_size} (the evaluation runs "
                   f"{parallel.rows_per_pass(config.eval.batch_size, eval_rows)} rows at a time), "
                   f"config.eval.size={config.eval.size}{seeds}")
    programs["evaluation"] = (need(evaluator.lower(abstract.params).compile(), held), shrink_eval)
  check(programs, device_limit())
  return compiled
