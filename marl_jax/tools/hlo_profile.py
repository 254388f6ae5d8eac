"""Where a compiled call's time goes: its XLA thunks traced (`profile_call`), each told by kind from the
compiled module's text (`thunk_kinds`: matmul, data movement, compute), the dots' FLOPs read from its
shapes (`dot_flops`), and the fraction of a matmul bound the call would reach with no time lost
between thunks (`ceiling`)."""
import collections
import glob
import gzip
import json
import os
import re
import tempfile

import jax
import numpy as np


# Opcodes that only move or lay out data: a fusion of nothing else is a copy, transpose or broadcast.
_MOVES = frozenset({"parameter", "constant", "copy", "transpose", "bitcast", "broadcast", "reshape", "slice",
                    "concatenate", "dynamic-slice", "dynamic-update-slice", "pad", "iota", "tuple",
                    "get-tuple-element", "bitcast-convert", "reverse"})


_CONTROL = frozenset({"while", "conditional", "call"})  # their bodies' thunks are traced themselves


THUNK_KINDS = ("matmul", "data movement", "compute")


_INSTRUCTION = re.compile(r"\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*?)\s([a-z][a-z0-9\-]*)\((.*)$")


def _instructions(hlo_text: str):
  """(computation, name, shape, opcode, the rest of the line, the computation it calls or None) of
  each instruction of a compiled module's text."""
  computation = None
  for line in hlo_text.splitlines():
    if line.rstrip().endswith("{") and " = " not in line:
      computation = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
      continue
    match = _INSTRUCTION.match(line)
    if match and computation is not None:
      called = re.search(r"calls=%?([\w.\-]+)", match.group(4))
      yield (computation, *match.groups(), called.group(1) if called else None)


def thunk_kinds(hlo_text: str) -> dict[str, str]:
  """Each instruction of a compiled module's text by what its thunk does (`THUNK_KINDS`): `matmul` (a
  dot or convolution, or a fusion holding one: the matmul library's calls), `data movement` (copies,
  transposes, broadcasts, slices and nothing else) or `compute` (every other fusion or op:
  elementwise, reductions, gathers); control flow is left out, since its bodies' thunks are traced
  themselves."""
  opcodes_of, instructions = collections.defaultdict(set), {}
  for computation, name, _, opcode, _, called in _instructions(hlo_text):
    opcodes_of[computation].add(opcode)
    instructions[name] = (opcode, called)
  kind_of = {}
  for name, (opcode, called) in instructions.items():
    opcodes = opcodes_of[called] if opcode == "fusion" and called else {opcode}
    if opcodes & _CONTROL:
      continue
    if opcodes & {"dot", "convolution"}:
      kind_of[name] = "matmul"
    elif opcodes <= _MOVES:
      kind_of[name] = "data movement"
    else:
      kind_of[name] = "compute"
  return kind_of


def dot_flops(hlo_text: str) -> dict[str, int]:
  """FLOPs of one run of each thunk that computes dots (a dot, or a fusion calling a computation that
  holds them): 2 x output elements x contracted size per dot, from the compiled module's shapes."""
  dims_of, flops_in, flops_of, called_by = {}, collections.Counter(), {}, {}
  for computation, name, shape, opcode, rest, called in _instructions(hlo_text):
    dims = re.match(r"\w+\[([\d,]*)\]", shape)
    dims_of[name] = [int(d) for d in dims.group(1).split(",") if d] if dims else []
    if opcode == "fusion" and called:
      called_by[name] = called
    elif opcode == "dot":
      lhs = dims_of[re.search(r"%([\w.\-]+)", rest).group(1)]
      contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest).group(1)
      contracted = np.prod([lhs[int(i)] for i in contracting.split(",") if i])
      flops_of[name] = 2 * int(np.prod(dims_of[name])) * int(contracted)
      flops_in[computation] += flops_of[name]
  # A fused computation may come after the fusion that calls it, so fusions are resolved last.
  return flops_of | {name: flops_in[c] for name, c in called_by.items() if flops_in[c]}


def thunk_parts(hlo_text: str) -> dict[str, int]:
  """Each instruction of a compiled module's text split into more than one part
  (`outer_dimension_partitions`, set by XLA:CPU's parallel task assigner for loop fusions over a few
  hundred kB): the number of parts, which its thunk runs as tasks on the thread pool at once."""
  parts_of = {}
  for _, name, _, _, rest, _ in _instructions(hlo_text):
    parts = re.search(r'"outer_dimension_partitions":\[([^\]]*)\]', rest)
    count = int(np.prod([int(p.strip('" ')) for p in parts.group(1).split(",") if p.strip()])) if parts else 1
    if count > 1:
      parts_of[name] = count
  return parts_of


def profile_call(call, args) -> dict[str, tuple[float, int]]:
  """Traced seconds and runs of each event by name in one `call(*args)`: among them each XLA thunk,
  named after its instruction.  Thunks that run at the same time on different cores each count whole."""
  thunks = collections.defaultdict(lambda: [0.0, 0])
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      jax.block_until_ready(call(*args))
    path, = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    with gzip.open(path) as f:
      events = json.load(f)
  for event in events["traceEvents"] if isinstance(events, dict) else events:
    if event.get("ph") == "X":
      thunks[event["name"]][0] += event["dur"] / 1e6
      thunks[event["name"]][1] += 1
  return {name: tuple(value) for name, value in thunks.items()}


def profile_summary(thunks: dict[str, tuple[float, int]], hlo_text: str) -> dict:
  """A traced call (`profile_call`) of a compiled module: `thunk_s`, the seconds per kind of thunk
  (`thunk_kinds`); `matmul_thunks`, [seconds, FLOPs] of each thunk that computes dots (`dot_flops`); and
  `other_thunks`, [seconds, parts] of every other thunk (`thunk_parts`, 1 for one task), over all its
  runs."""
  kinds, flops, parts = thunk_kinds(hlo_text), dot_flops(hlo_text), thunk_parts(hlo_text)
  seconds = collections.Counter({kind: 0.0 for kind in THUNK_KINDS})
  for name, (s, _) in thunks.items():
    if name in kinds:
      seconds[kinds[name]] += s
  return {"thunk_s": dict(seconds),
          "matmul_thunks": [[s, flops[name] * runs] for name, (s, runs) in thunks.items() if name in flops],
          "other_thunks": [[s, parts.get(name, 1)] for name, (s, _) in thunks.items()
                           if kinds.get(name, "matmul") != "matmul"]}


def ceiling(row: dict, bound: float, cores: int, slow: float = 0.1) -> tuple[float, float]:
  """The fraction of the matmul bound a profiled row's call would reach with no time lost between
  thunks: every dot at the bound on all cores and every other thunk packed onto the cores with no gap
  (a thunk of P parts keeps min(P, cores) cores busy for its traced time, so one split over every core
  counts whole and a single task a core's share); and the same with the dots that ran under `slow` x
  the bound (the attention's tiny batched products) kept at their traced time, packed as single
  tasks."""
  dots, others = np.reshape(row["matmul_thunks"], (-1, 2)), np.reshape(row["other_thunks"], (-1, 2))
  flops = dots[:, 1].sum()
  other_s = np.sum(others[:, 0] * np.minimum(others[:, 1], cores)) / cores
  is_slow = dots[:, 1] < slow * bound * dots[:, 0]
  best_s = flops / bound
  return (best_s / (best_s + other_s),
          best_s / ((flops - dots[is_slow, 1].sum()) / bound + other_s + dots[is_slow, 0].sum() / cores))
