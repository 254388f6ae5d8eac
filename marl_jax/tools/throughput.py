"""Throughput of the joint rollout-and-update step (a benchmark script, not a test).

  python -m marl_jax.tools.throughput [--json=PATH] [--batch_size=256] [--calls=3] [--cpu_devices=2]
  python -m marl_jax.tools.throughput --checkpoint=DIR [--random_weights] --grid=2/1 --credits=team
  python -m marl_jax.tools.throughput --workflows  # each workflow's sampling FLOPs against the minimum
  python -m marl_jax.tools.throughput --workers=2,4,8,16,32,64  # the wide job's cost per worker as W grows

The relay job: agent 1 sees `a+b=` (digits 0-9) and writes up to 4 tokens; agent 2 sees the prompt and
agent 1's message and writes the answer (up to 4 tokens); team reward 1 when it is right; isolated
agents of d_model 128, 4 layers, 4 heads (`--d_model` for wider ones, d_ff 4x), or with `--checkpoint`
a Qwen3/Llama checkpoint (each agent a copy of it).  A completion is one agent's message that the
update trains on, so a step makes batch_size x roles completions.  Rows cover R = 1, 2, 4 roles (a
chain of R agents), S = 1, 4 seeds, with team credit and with difference (counterfactual) credit.

Every row also gives the achieved model FLOP/s (`step_flops`: an analytic count of the step's model
FLOPs) and its fraction of a jitted float32 1024x1024 matmul (on an accelerator a bfloat16 8192x8192
one, `bounds.reference_matmul`) timed just before and just after the row (their mean; the row prints both):
how close the step runs to what this machine's matmul unit delivers at that time, since on a shared machine the matmul's own rate moves by half from one minute to the
next; and the same split in two: the rollout alone (timed as its own program in the same process) and the rest of the step (scoring, credit, update:
the step's time less the rollout's), each with its tokens/s and fraction of the matmul.

With `--workers`, instead of the relay grid, the wide job (`wide_config`): delegate on the wide task, an
orchestrator and W trained workers of one shared set with the relay job's agents; a row per W gives
worker-episodes per second (episodes x W), the cost of one against the first row's, the rollout's share
of the step, the train call's memory, the model FLOPs per worker-episode and the per-role gradient
norms' share of them (`role_grad_flops`).

With `--cpu_devices=N` the CPU is split into N JAX devices and each row's batch over them, as training
splits it (the rollout timed alone too).

With `--profile`, one more call per row is traced: its thunk time by kind, its dots' FLOPs read from
the compiled module (a check of `step_flops`), and its `hlo_profile.ceiling`, the fraction of the matmul it would
reach with no core left idle.

Bad flags end the command before anything compiles or is timed, with one `FATAL` line naming the flag
and the values allowed and exit status 1: each flag when parsed, then every row's config is built
(a row's config error names the flags behind it) and `--json`'s directory checked.  An earlier `--json`
file stays as it was until the first row's measurement replaces it.
"""
import json
import math
import os
import sys
import time

from absl import app, flags

import jax
import jax.numpy as jnp
import numpy as np

from jax.sharding import PartitionSpec as P

from marl_jax import (cli, configs, credit, experiment, files, loop, memory, model as model_lib, parallel, rollout,
                      sampling, state as state_lib, train)
from marl_jax.protocols import delegate
from marl_jax.tools import bounds, hlo_profile

_JSON = flags.DEFINE_string("json", "", "Also write the rows here as a JSON list, replaced after each row.")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Episodes per step (per seed).", lower_bound=1)
_MICRO = flags.DEFINE_integer("microbatch_size", 0, "config.rl.microbatch_size: rows per forward/backward "
                              "pass of the update (0: the whole minibatch).", lower_bound=0)
_CALLS = flags.DEFINE_integer("calls", 3, "Timed calls of steps_per_call steps each.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps_per_call", 10, "Steps per compiled call.", lower_bound=1)
_GRID = flags.DEFINE_string("grid", "1,2,4/1,4", "ROLES/SEEDS to run, each comma-separated, e.g. '2/1' for "
                            "the relay job only.")
_CREDITS = flags.DEFINE_string("credits", "team,difference", "Credit estimators to run, comma-separated: "
                               f"{', '.join(sorted(credit.REGISTRY))}.")
_SHARING = flags.DEFINE_string("sharing", "isolated", "Parameter sharing to run, comma-separated: "
                               f"{', '.join(sorted(experiment.NAMED_SHARING))}.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "A local Qwen3/Llama checkpoint directory as the agents "
                                  "(config.model.checkpoint) instead of the built-in model.")
_RANDOM = flags.DEFINE_bool("random_weights", False, "With --checkpoint: its shapes, randomly initialised.")
_PROFILE = flags.DEFINE_bool("profile", False, "Also trace one train call per row and print where its "
                              "thunk time goes: matmuls, data movement, other compute (`profile_call`); "
                              "its dots' FLOPs against the count, and its `ceiling`.")
RELAY_D_MODEL = 128  # the relay job's agents' width; `--d_model` runs the same job with wider ones

_D_MODEL = flags.DEFINE_integer("d_model", RELAY_D_MODEL, "Width of the built-in agents (d_ff 4x, 4 heads): "
                               f"the relay job is {RELAY_D_MODEL}; wider agents do more matrix products per "
                               "elementwise pass.", lower_bound=4)
_CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 0, "On a CPU: split it into this many JAX devices "
                                    "(jax_num_cpu_devices), each row's batch split over them as training "
                                    "splits it over devices; 0: as XLA_FLAGS has it (one by default).",
                                    lower_bound=0)
_WORKERS = flags.DEFINE_string("workers", "", "Instead of the relay grid: a row per W of the wide job "
                               "(`experiments/delegate.py:task=wide,workers=W`: an orchestrator and W "
                               "trained workers of one shared set), comma-separated, each in 2..64, e.g. "
                               "'2,4,8,16,32,64'.")
_WORKFLOWS = flags.DEFINE_bool("workflows", False, "Instead of timing: each workflow's model FLOPs per "
                               "episode of sampling against the minimum (analytic, nothing compiles); "
                               "alone, without the flags above.")
# Every flag above but --workflows sets how the rows are timed, which --workflows does not do.
_ROW_FLAGS = [holder.name for holder in list(globals().values())
              if isinstance(holder, flags.FlagHolder) and holder is not _WORKFLOWS]
# The config keys the flags set (`relay_config`): a row's config error names the flags behind it.
_FLAG_OF_KEY = {"rl.batch_size": _BATCH, "rl.microbatch_size": _MICRO, "steps_per_call": _STEPS,
                "protocol.agents": _GRID, "num_seeds": _GRID, "credit": _CREDITS, "roles.sharing": _SHARING,
                "model.checkpoint": _CHECKPOINT, "model.d_model": _D_MODEL}


def grid(value: str) -> tuple[list[int], list[int]]:
  """`--grid`'s roles and seeds; raises `flags.ValidationError` for a value it cannot read."""
  try:
    roles, seeds = ([int(x) for x in part.split(",")] for part in value.split("/"))
  except ValueError:
    roles = seeds = [0]
  if min(roles + seeds) < 1:
    raise flags.ValidationError("allowed: ROLES/SEEDS, comma-separated integers >= 1 each, e.g. '1,2,4/1,4'")
  return roles, seeds


def worker_counts(value: str) -> list[int]:
  """`--workers`' W values ([] for ''); raises `flags.ValidationError` for a value it cannot read."""
  try:
    counts = [int(x) for x in value.split(",")] if value else []
  except ValueError:
    counts = [0]
  if any(not 2 <= w <= delegate.MAX_WORKERS for w in counts):
    raise flags.ValidationError(f"allowed: comma-separated integers in 2..{delegate.MAX_WORKERS}, e.g. "
                                "'2,4,8,16,32,64'")
  return counts


def _refuse_relay_flags_with_workers(values) -> bool:
  given = [f"--{name}" for name in ("grid", "sharing", "checkpoint", "random_weights") if flags.FLAGS[name].present]
  if values["workers"] and given:
    raise flags.ValidationError(f"--workers times the wide job's rows, which {', '.join(given)} do not set; "
                                "allowed: --workers without them")
  return True


def names(value: str, allowed) -> list[str]:
  """The names of a comma-separated flag, each one of `allowed`; raises `flags.ValidationError`."""
  chosen = value.split(",")
  if not set(chosen) <= set(allowed):
    raise flags.ValidationError(f"allowed: one or more of {', '.join(sorted(allowed))}, comma-separated")
  return chosen


def _refuse_width_of_checkpoint(values) -> bool:
  if values["checkpoint"] and values["d_model"] != RELAY_D_MODEL:
    raise flags.ValidationError(f"--d_model={values['d_model']} sets the built-in agents' width; with "
                                "--checkpoint the checkpoint's config.json does: leave --d_model at its "
                                f"default ({RELAY_D_MODEL})")
  return True


def _refuse_random_weights_alone(values) -> bool:
  if values["random_weights"] and not values["checkpoint"]:
    raise flags.ValidationError("--random_weights initialises a checkpoint's shapes at random; allowed: "
                                "with --checkpoint=DIR")
  return True


def _refuse_row_flags(workflows: bool) -> bool:
  given = [f"--{name}" for name in _ROW_FLAGS if flags.FLAGS[name].present]
  if workflows and given:
    raise flags.ValidationError(f"it times no rows, so it would ignore {', '.join(given)}; allowed: "
                                "--workflows alone")
  return True


# Checked when the flags are parsed: absl's FATAL line names the flag and its value.
flags.register_validator("grid", lambda value: bool(grid(value)))
flags.register_validator("credits", lambda value: bool(names(value, credit.REGISTRY)))
flags.register_validator("sharing", lambda value: bool(names(value, experiment.NAMED_SHARING)))
flags.register_multi_flags_validator(["checkpoint", "d_model"], _refuse_width_of_checkpoint)
flags.register_multi_flags_validator(["random_weights", "checkpoint"], _refuse_random_weights_alone)
flags.register_validator("workflows", _refuse_row_flags)
flags.register_validator("workers", lambda value: worker_counts(value) is not None)
flags.register_multi_flags_validator(["workers", "grid", "sharing", "checkpoint", "random_weights"],
                                     _refuse_relay_flags_with_workers)

# The workflows of the FLOPs-per-episode table: (name, experiment file, its argument).
WORKFLOWS = (
    ("single agent", "single_agent", "size=cpu"),
    ("solver-verifier", "solver_verifier", "size=cpu"),
    ("vote, 3 voters + aggregator", "vote", "size=cpu,aggregator=true"),
    ("best_of_n", "best_of_n", "size=cpu"),
    ("debate", "debate", "size=cpu"),
    ("delegate", "delegate", "size=cpu"),
    ("orchestrator (multi_chain)", "tasks", "task=multi_chain,size=cpu"),
    ("exchange (hidden_sum)", "tasks", "task=hidden_sum,size=cpu"),
    ("contribution, 3 roles", "tasks", "task=contribution,size=cpu"),
)


def relay_config(roles: int, seeds: int, credit: str, batch_size: int, steps_per_call: int,
                 sharing: str = "isolated", checkpoint: str = "", random_weights: bool = False,
                 microbatch_size: int = 0, d_model: int = RELAY_D_MODEL):
  c = configs.base_config()
  c.model.update(d_model=d_model, n_layers=4, n_heads=4, d_ff=4 * d_model, checkpoint=checkpoint,
                 random_weights=random_weights)
  c.task.update(name="arithmetic", num_ops=1, ops="+", max_operand=9, modulus=100)
  c.protocol = configs.ml_collections.ConfigDict(dict(name="relay", agents=roles, message_len=4,
                                                      answer_len=4))
  c.credit = configs.credit_config(credit)
  c.roles.sharing = sharing
  c.rl.update(batch_size=batch_size, group_size=8, minibatches=1, microbatch_size=microbatch_size)
  c.num_seeds, c.steps_per_call, c.sft.steps = seeds, steps_per_call, 0
  c.total_steps = c.log_every = c.eval_every = c.checkpoint_every = steps_per_call
  return c


def wide_config(workers: int, credit: str, batch_size: int, steps_per_call: int, microbatch_size: int = 0,
                d_model: int = RELAY_D_MODEL):
  """The wide job: `experiments/delegate.py:task=wide,workers=W` (one-operation chains, every worker
  slot one shared, trained set) with the relay job's agents, batch and budget."""
  experiments = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "experiments", "x.py")
  c = configs.sibling(experiments, "delegate").get_config(f"size=cpu,task=wide,workers={workers}")
  c.model.update(d_model=d_model, n_layers=4, n_heads=4, d_ff=4 * d_model)
  c.credit = configs.credit_config(credit)
  c.rl.update(batch_size=batch_size, group_size=8, minibatches=1, microbatch_size=microbatch_size)
  c.num_seeds, c.steps_per_call, c.sft.steps = 1, steps_per_call, 0
  c.total_steps = c.log_every = c.eval_every = c.checkpoint_every = steps_per_call
  return c


def step_flops(exp: experiment.Experiment) -> float:
  """Model FLOPs of one step of one seed: the rollout and each counterfactual re-run read
  `sampling.token_reads` tokens per episode (live views only); the update runs each scoring pass
  (`sampling.scoring_flops`: one per group of views that read alike, at its first view's model, over the
  whole canvas or its views' own positions) forward and backward (2x) per epoch, plus a forward under the base model with a KL
  term; with parameter sets shared between roles, the per-role gradient norms of the last step of
  each call (`update.role_grad_norms`: a forward and a backward per role over the first minibatch),
  spread over the call's steps.  Not counted: a learned critic's value network (`credit.critic`,
  under 1 % of the relay job's step)."""
  rl, layout = exp.config.rl, exp.layout
  R = len(layout.roles)
  reruns = exp.credit.reruns(R)
  rerun_rows = 0 if reruns is None else len(reruns.changed_CxR) * reruns.samples
  update_passes = 3 * rl.epochs + (1 if rl.kl_coef > 0 else 0) + role_grad_passes(exp)
  rollouts = (1 + rerun_rows) * np.dot(sampling.token_reads_V(layout), _flops_per_token_V(exp))
  return float(rl.batch_size * (rollouts + update_passes * sampling.scoring_flops(exp.model, layout)))


def role_grad_passes(exp: experiment.Experiment) -> float:
  """Whole-batch passes per step (of each scoring pass) of the per-role gradient norms: with parameter
  sets shared between roles, a forward and a backward per role over the first minibatch on the last
  step of each call; 0 with isolated sets (free)."""
  R, rl = len(exp.layout.roles), exp.config.rl
  if sorted(exp.role_set_R) == list(range(R)):
    return 0.0
  return (1 + 2 * R) / (rl.minibatches * exp.config.steps_per_call)


def role_grad_flops(exp: experiment.Experiment) -> float:
  """Model FLOPs of one step of one seed spent on the per-role gradient norms (`role_grad_passes`),
  part of `step_flops`."""
  return float(exp.config.rl.batch_size * role_grad_passes(exp) * sampling.scoring_flops(exp.model, exp.layout))


def rollout_flops(exp: experiment.Experiment) -> float:
  """Model FLOPs of one step's rollout of one seed (`step_flops`' rollout term)."""
  return float(exp.config.rl.batch_size * np.dot(sampling.token_reads_V(exp.layout), _flops_per_token_V(exp)))


def _flops_per_token_V(exp: experiment.Experiment) -> list[int]:
  """FLOPs of one token read by each view over the whole canvas, at the view's own model."""
  return [model_lib.flops_per_token(model, exp.layout.length)
          for model in sampling.view_models(exp.model, exp.layout)]


def make_rollout_call(exp: experiment.Experiment):
  """`steps_per_call` rollouts of every seed (the step's sampling alone, fresh problems each), as the
  train call scans its steps and split over the `data` devices as it splits its rows: the rollout's
  share of the step, timed on its own."""
  config = exp.config
  rows_spec = P(None, parallel.DATA)

  def local(params_S, problem_key_SxB, sample_key_SxB):  # this device's rows of every seed
    def one(params_R, problem_key_B, sample_key_B):
      problems = exp.task.sample_batch(problem_key_B)
      return rollout.sample(exp, params_R, problems, sample_key_B).sampled_BxT.sum()
    return parallel.sum_over_devices(jax.vmap(one)(params_S, problem_key_SxB, sample_key_SxB).sum())

  sharded = parallel.shard_map(local, exp.mesh, in_specs=(P(), rows_spec, rows_spec), out_specs=P())

  def call(params_S, key):
    shape_NxSxB = (config.steps_per_call, config.num_seeds, config.rl.batch_size)
    keys_2xNxSxB = jax.vmap(lambda k: jax.random.split(k, shape_NxSxB))(jax.random.split(key))
    return jax.lax.map(lambda keys_2xSxB: sharded(params_S, *keys_2xSxB), keys_2xNxSxB.swapaxes(0, 1)).sum()

  return jax.jit(call)


def measure(config, calls: int, profile: bool = False, job: str = "relay") -> dict:
  """One row: the whole step (rollout, scoring, credit and update) timed over `calls` compiled calls,
  then the rollout alone in the same process; the update's rate is the step's time less the
  rollout's (so it also holds scoring and credit, with its counterfactual re-runs).  With `profile`,
  then one more train call traced (`hlo_profile.profile_call`, `hlo_profile.profile_summary`): `thunk_s`, its seconds per kind
  of thunk, and `matmul_thunks`, the seconds and FLOPs of each thunk that computes dots."""
  exp = experiment.build(config)
  train_call = train.make_train_call(exp)
  start = time.perf_counter()
  # Compiled from the state's shapes and refused (memory.DoesNotFit) before the state is made if it
  # cannot fit on the device; the calls below reuse the program.
  abstract = state_lib.abstract_state(exp)
  compiled = memory.check_run(exp, abstract, train_call)
  compile_s = time.perf_counter() - start
  need = memory.need(compiled, memory.per_device_bytes(abstract))
  state = loop.initial_state(exp)
  state, metrics = train_call(state)  # warm-up call
  jax.block_until_ready(state)
  start, tokens = time.perf_counter(), 0.0
  for _ in range(calls):
    state, metrics = train_call(state)
    tokens += float(np.asarray(state_lib.to_host(metrics)["tokens"]).sum())
  seconds = time.perf_counter() - start
  rollout_call = make_rollout_call(exp)
  params_S, key = state.params, jax.random.PRNGKey(0)
  rollout_call(params_S, key).block_until_ready()  # compile and warm up
  keys = jax.block_until_ready([jax.random.fold_in(key, i) for i in range(calls)])  # outside the timing
  start, rollout_tokens = time.perf_counter(), 0.0
  for rollout_key in keys:
    rollout_tokens += float(rollout_call(params_S, rollout_key))
  rollout_s = time.perf_counter() - start
  steps = calls * config.steps_per_call * config.num_seeds
  completions = steps * config.rl.batch_size * len(exp.layout.roles)
  # A rollout timed longer than the whole step (a noisy machine, a tiny step) leaves no time to rate.
  rest_s = seconds - rollout_s if seconds > rollout_s else math.nan
  params_per_agent = model_lib.count_params(jax.tree.map(lambda p: p[0, 0], state.params))
  step, rollout = step_flops(exp), rollout_flops(exp)  # analytic, per step of one seed
  # Last: the traced call consumes (donates) the state.
  traced = hlo_profile.profile_summary(hlo_profile.profile_call(train_call, (state,)), compiled.as_text()) if profile else {}
  return {"job": job, "devices": exp.mesh.size, "roles": len(exp.layout.roles), "seeds": config.num_seeds,
          "canvas": exp.layout.length, "memory_bytes": need.total if need else math.nan,
          "sharing": config.roles.sharing, "d_model": config.model.d_model,
          "microbatch_size": config.rl.microbatch_size,
          "credit": config.credit.name, "completions_per_s": completions / seconds,
          "tokens_per_s": tokens / seconds, "flops_per_s": steps * step / seconds,
          "rollout_tokens_per_s": rollout_tokens / rollout_s,
          "rollout_flops_per_s": steps * rollout / rollout_s,
          "update_tokens_per_s": tokens / rest_s,
          "update_flops_per_s": steps * (step - rollout) / rest_s,
          "compile_s": compile_s, "step_flops": step, "role_grad_flops": role_grad_flops(exp),
          "params_per_agent": params_per_agent, "call_s": seconds / calls, **traced}


def print_profile(row: dict, bound: float):
  """One row's traced call: seconds per kind of thunk, its share of all thunk time, the rate of the
  matmul thunks (their dots' FLOPs over their thunk time, against the 1024 x 1024 matmul; two thunks
  at once each count whole, so this is a lower bound on what the cores delivered), the dots' FLOPs
  against the analytic count, and the call's `hlo_profile.ceiling`."""
  total = sum(row["thunk_s"].values())
  flops = sum(f for _, f in row["matmul_thunks"])
  cores = len(os.sched_getaffinity(0))
  matmul_flops_per_s = flops / max(row["thunk_s"]["matmul"], 1e-9)
  analytic = row["flops_per_s"] * row["call_s"]
  print(f"  profile of one call ({row['call_s']:.2f} s wall, {total:.2f} s of thunks): " + ", ".join(
      f"{kind} {s:.2f} s ({s / total:.0%})" for kind, s in row["thunk_s"].items()) +
        f"; matmul thunks at {matmul_flops_per_s / 1e9:.1f} GFLOP/s, {matmul_flops_per_s / bound:.2f} of the "
        "matmul", flush=True)
  print(f"  its dots: {flops / 1e9:.1f} GFLOP, {flops / analytic:.3f} of step_flops; ceiling with every dot "
        f"at the matmul's rate and every other thunk packed onto the {cores} cores with no gap (one split "
        "over the cores counts whole): "
        "{:.2f} of the matmul, {:.2f} with the dots that ran under a tenth of it at their traced "
        "time".format(*hlo_profile.ceiling(row, bound, cores)) +
        # Several devices' split loops share the cores at once, so their traced time swells.
        (f" (a ceiling for one device; on {row['devices']} it reads low)" if row["devices"] > 1 else ""),
        flush=True)


def workflow_flops_table():
  """Per workflow of WORKFLOWS at its size=cpu config: canvas length, views, and the model FLOPs per
  episode of sampling (`sampling.episode_flops`) with the computed-to-minimum ratio."""
  here = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "experiments", "x.py")
  print(f"{'workflow':<30} {'T':>3} {'views':>5} {'lockstep MFLOP':>14} {'computed':>9} {'minimum':>8} "
        f"{'computed/min':>12}")
  for name, module, arg in WORKFLOWS:
    exp = experiment.build(configs.sibling(here, module).get_config(arg))
    flops = sampling.episode_flops(exp.model, exp.layout)
    print(f"{name:<30} {exp.layout.length:>3} {len(exp.layout.view_set_V):>5} {flops['lockstep'] / 1e6:>14.1f} "
          f"{flops['computed'] / 1e6:>9.1f} {flops['minimum'] / 1e6:>8.1f} "
          f"{flops['computed'] / flops['minimum']:>12.2f}")


def row_configs() -> list:
  """Each row of the grid, (roles, seeds, sharing, credit), with its config, every one built
  (`experiment.build`: nothing compiles) so that a bad one stops the command before the first row is
  timed: one line naming the row, the config key and the flags that set it, exit status 1."""
  roles_grid, seeds_grid = grid(_GRID.value)
  return built([((roles, seeds, sharing, name),
                 relay_config(roles, seeds, name, _BATCH.value, _STEPS.value, sharing, _CHECKPOINT.value,
                              _RANDOM.value, _MICRO.value, _D_MODEL.value))
                for roles in roles_grid for seeds in seeds_grid
                for sharing in names(_SHARING.value, experiment.NAMED_SHARING)
                for name in names(_CREDITS.value, credit.REGISTRY)])


def worker_row_configs() -> list:
  """Each row of `--workers` (W, and each of `--credits` if given, else team credit) with its config,
  every one built before the first is timed, as `row_configs` does."""
  chosen = names(_CREDITS.value, credit.REGISTRY) if _CREDITS.present else ["team"]
  return built([((W, name), wide_config(W, name, _BATCH.value, _STEPS.value, _MICRO.value, _D_MODEL.value))
                for W in worker_counts(_WORKERS.value) for name in chosen])


def built(rows: list) -> list:
  """`rows`, (row, config) pairs, once every config is built (nothing compiles): a bad one ends the
  command before the first row is timed (`refuse_row`)."""
  for row, config in rows:
    try:
      experiment.build(config)
    except (ValueError, OSError) as e:
      refuse_row(row, e)
  return rows


def refuse_row(row, error: Exception):
  """Ends the command with one line naming the row (a relay row's roles, seeds, sharing and credit, or
  a wide row's workers and credit), what `error` says and the flags that set the config keys it names."""
  keys = ("roles", "seeds", "sharing", "credit") if len(row) == 4 else ("workers", "credit")
  given = dict.fromkeys(f"--{holder.name}={holder.value}" for key, holder in _FLAG_OF_KEY.items()
                        if f"config.{key}" in str(error))
  sys.exit(f"FATAL ConfigError: the row {', '.join(f'{k}={v}' for k, v in zip(keys, row))}: "
           f"{error}" + (f" (from {', '.join(given)})" if given else ""))


def worker_rows(row_configs_: list) -> list[dict]:
  """Times each wide row (`measure`) and prints, per W: the canvas, worker-episodes per second (a
  step's episodes x W over its time), each one's cost against the first row's (the per-worker cost
  ratio), the rollout's share of the step, the train call's memory (`memory.need`), the step's model
  FLOPs per worker-episode and the share of them the per-role gradient norms take (`role_grad_flops`)."""
  print(f"{'W':>3} {'credit':>10} {'T':>4} {'worker-eps/s':>12} {'cost_vs_first':>13} {'rollout_share':>13} "
        f"{'memory MiB':>10} {'MFLOP/worker-ep':>15} {'role_grad_share':>15} {'compile_s':>9}")
  rows = []
  for (W, credit_name), config in row_configs_:
    try:
      row = measure(config, _CALLS.value, _PROFILE.value, job="wide")
    except memory.DoesNotFit as e:
      refuse_row((W, credit_name), e)
    steps = _CALLS.value * config.steps_per_call
    row.update(workers=W, worker_episodes_per_s=steps * config.rl.batch_size * W / (row["call_s"] * _CALLS.value),
               rollout_share=row["tokens_per_s"] / row["rollout_tokens_per_s"],
               mflop_per_worker_episode=row["step_flops"] / config.rl.batch_size / W / 1e6,
               role_grad_share=row["role_grad_flops"] / row["step_flops"])
    row["cost_vs_first"] = rows[0]["worker_episodes_per_s"] / row["worker_episodes_per_s"] if rows else 1.0
    rows.append(row)
    print(f"{W:>3} {credit_name:>10} {row['canvas']:>4} {row['worker_episodes_per_s']:>12.0f} "
          f"{row['cost_vs_first']:>13.2f} {row['rollout_share']:>13.2f} {row['memory_bytes'] / 2 ** 20:>10.1f} "
          f"{row['mflop_per_worker_episode']:>15.1f} {row['role_grad_share']:>15.2f} {row['compile_s']:>9.1f}",
          flush=True)
    if _JSON.value:
      files.write_atomically(_JSON.value, json.dumps(rows, indent=1))
  return rows


def main(argv):
  del argv
  if _WORKFLOWS.value:
    workflow_flops_table()
    return
  if _CPU_DEVICES.value:  # before anything starts the backend
    jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value)
  grid_configs = worker_row_configs() if _WORKERS.value else row_configs()
  if _JSON.value:  # a path it cannot write refused now, not after the first row; an earlier file stays
    problem = "Is a directory" if os.path.isdir(_JSON.value) else None
    try:
      with open(f"{_JSON.value}.tmp", "w"):  # where each row's file is written before it replaces the last
        pass
      os.remove(f"{_JSON.value}.tmp")
    except OSError as e:
      problem = e.strerror
    if problem:
      sys.exit(f"FATAL Flags error: --json={_JSON.value}: {problem}; allowed: a file that can be written, "
               "in a directory that exists")
  if _WORKERS.value:
    print(f"backend={jax.default_backend()} devices={jax.device_count()} batch_size={_BATCH.value} "
          f"d_model={_D_MODEL.value}: the wide job, W chains, an orchestrator and W workers of one set")
    worker_rows(grid_configs)
    return
  rows = []
  matmul_n, matmul_dtype = bounds.reference_matmul()
  on_huge_pages = bounds.huge_pages()
  print(f"backend={jax.default_backend()} devices={jax.device_count()} batch_size={_BATCH.value} "
        f"microbatch_size={_MICRO.value} model={_CHECKPOINT.value or f'built-in, d_model {_D_MODEL.value}'} "
        f"matmul={matmul_n}x{matmul_n} {jnp.dtype(matmul_dtype).name} huge_pages={'on' if on_huge_pages else 'off'}")
  print(f"{'roles':>5} {'seeds':>5} {'sharing':>8} {'credit':>10} {'completions/s':>14} "
        f"{'tokens/s':>10} {'GFLOP/s':>8} {'of_matmul':>9} {'rollout_tok/s':>13} {'of_matmul':>9} "
        f"{'update_tok/s':>12} {'of_matmul':>9} {'compile_s':>9} {'matmul GFLOP/s':>15}")
  for (roles, seeds, sharing, credit_name), config in grid_configs:
    bound_before = bounds.matmul_flops_per_s()
    try:
      row = measure(config, _CALLS.value, _PROFILE.value)
    except memory.DoesNotFit as e:
      refuse_row((roles, seeds, sharing, credit_name), e)
    row["matmul_flops_per_s"] = (bound_before, bounds.matmul_flops_per_s())
    row["huge_pages"] = on_huge_pages
    bound = float(np.mean(row["matmul_flops_per_s"]))
    for part in ("", "rollout_", "update_"):
      row[f"{part}fraction_of_matmul"] = row[f"{part}flops_per_s"] / bound
    rows.append(row)
    print(f"{roles:>5} {seeds:>5} {sharing:>8} {credit_name:>10} {row['completions_per_s']:>14.0f} "
          f"{row['tokens_per_s']:>10.0f} {row['flops_per_s'] / 1e9:>8.1f} "
          f"{row['fraction_of_matmul']:>9.2f} {row['rollout_tokens_per_s']:>13.0f} "
          f"{row['rollout_fraction_of_matmul']:>9.2f} {row['update_tokens_per_s']:>12.0f} "
          f"{row['update_fraction_of_matmul']:>9.2f} {row['compile_s']:>9.1f} "
          f"{'{:.0f}, {:.0f}'.format(*np.divide(row['matmul_flops_per_s'], 1e9)):>15}", flush=True)
    if "thunk_s" in row:
      print_profile(row, bound)
    if _JSON.value:  # replaced after every row, so an interrupted run keeps what it measured
      files.write_atomically(_JSON.value, json.dumps(rows, indent=1))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
