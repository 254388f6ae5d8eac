"""marl_jax's modules import each other without a cycle: module A imports B (anywhere in A) and B
never reaches A again.  The same holds between its parts, each folder (`marl_jax/credit/`, ...) taken
whole beside each top-level module, so that drawn from the imports no arrow runs back up; the library
never imports a tool (`marl_jax/tools/`, the commands built on it); and no module imports the tests.

A cycle at module level works only in the import order that happens to be tried: imported from another
end, a module meets a half-initialised one and fails with an error that names neither.  An import of
another marl_jax module moved inside a function only hides such a cycle, so it counts like one at the
top (a lazy import of an optional outside library is no edge: the graph holds marl_jax's modules only).
"""
import ast
import pkgutil

import marl_jax


def top_level_imports(source: str) -> set[str]:
  """The first component of every absolute import in `source`, at the top or in a function."""
  names = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names.update(alias.name.partition(".")[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and not node.level:
      names.add(node.module.partition(".")[0])
  return names


def module_imports(name: str, source: str, is_package: bool, modules: set[str]) -> set[str]:
  """The modules of `modules` that module `name` (its `source`) imports, at the top or in a function.

  `from X import Y` imports X.Y when that is a module, else X; importing a module first imports the
  packages above it, except those above `name` itself (Python imported them before it).
  """
  package = name if is_package else name.rpartition(".")[0]
  targets = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      targets.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: level 1 is this module's package, each level above it one more up
        parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{parent}.{base}" if base else parent
      targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names)
  above_name = {name.rsplit(".", i)[0] for i in range(name.count(".") + 1)}
  imported = set()
  for target in targets:
    parts = target.split(".")
    imported.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
  return {m for m in imported if m in modules and m not in above_name}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle (a, b, ..., a) through each strongly connected group of `graph` (name -> names it
  imports) that has more than one member or imports itself, each the shortest from its first name."""
  index, low, on_stack, stack, groups = {}, {}, set(), [], []

  def connect(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        connect(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = set()
      while v not in group:
        group.add(stack.pop())
      on_stack.difference_update(group)
      groups.append(group)

  for v in sorted(graph):
    if v not in index:
      connect(v)
  cycles = []
  for group in groups:
    start = min(group)
    if len(group) == 1 and start not in graph.get(start, ()):
      continue
    # Breadth-first from `start` within the group, back to `start`.
    paths, seen = [[start]], {start}
    while paths:
      path = paths.pop(0)
      if start in graph.get(path[-1], ()):
        cycles.append(path + [start])
        break
      for w in sorted(graph.get(path[-1], set()) & group - seen):
        seen.add(w)
        paths.append(path + [w])
  return sorted(cycles)


def part(module: str) -> str:
  """The part of marl_jax that `module` belongs to: its folder under marl_jax (`marl_jax.credit` for
  `marl_jax.credit.base`), or itself for a top-level module."""
  return ".".join(module.split(".")[:2])


def part_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  """`graph` between parts (`part`): A imports B when a module of A imports one of B.  The root package
  imports nothing and is no part."""
  parts = {}
  for name, imported in graph.items():
    if name != "marl_jax":
      parts.setdefault(part(name), set()).update(part(m) for m in imported if part(m) not in (part(name), "marl_jax"))
  return parts


TOOLS = "marl_jax.tools"


def marl_jax_sources() -> dict[str, tuple[str, bool]]:
  """Every marl_jax module: its source and whether it is a package."""
  infos = {info.name: info for info in pkgutil.walk_packages(marl_jax.__path__, "marl_jax.")}
  sources = {}
  for name, info in [("marl_jax", None), *infos.items()]:
    path = marl_jax.__file__ if info is None else info.module_finder.find_spec(name).origin
    with open(path, encoding="utf-8") as f:
      sources[name] = f.read(), info is None or info.ispkg
  return sources


def marl_jax_import_graph() -> dict[str, set[str]]:
  sources = marl_jax_sources()
  return {name: module_imports(name, source, is_package, set(sources))
          for name, (source, is_package) in sources.items()}


def test_marl_jax_has_no_import_cycle():
  graph = marl_jax_import_graph()
  assert {"marl_jax.tasks.word_problems", "marl_jax.lm.tokenizer", "marl_jax.datasets"} <= set(graph)
  cycles = find_cycles(graph)
  assert not cycles, "import cycles in marl_jax:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_loop_between_folders_and_top_level_modules():
  parts = part_graph(marl_jax_import_graph())
  assert {"marl_jax.credit", "marl_jax.lm", "marl_jax.tools", "marl_jax.loop"} <= set(parts)
  cycles = find_cycles(parts)
  assert not cycles, "loops between marl_jax's parts:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_library_imports_no_tool():
  graph = marl_jax_import_graph()
  assert any(part(name) == TOOLS for name in graph)
  imports = sorted(f"{name} -> {m}" for name, imported in graph.items() if part(name) != TOOLS
                   for m in imported if part(m) == TOOLS)
  assert not imports, "library modules that import a tool:\n" + "\n".join(imports)


def test_no_module_imports_the_tests():
  importing = sorted(name for name, (source, _) in marl_jax_sources().items()
                     if top_level_imports(source) & {"tests", "conftest"})
  assert not importing, f"marl_jax modules that import tests/: {importing}"


def test_module_imports_reads_every_form_wherever_it_is():
  modules = {"p", "p.a", "p.b", "p.d", "p.g", "p.q", "p.q.r", "p.sub", "p.sub.e", "p.sub.f"}
  source = """
import p.a
from p import b, CONSTANT
from . import e
from ..q import r
try:
  from p import d
except ImportError:
  pass
class K:
  from .f import name
def later():
  from p import g
"""
  # `.` is p.sub; p itself (from p import CONSTANT) was imported before p.sub, so it is no edge, but
  # p.q is imported on the way to p.q.r.
  expected = {"p.a", "p.b", "p.sub.e", "p.q", "p.q.r", "p.d", "p.sub.f", "p.g"}
  assert module_imports("p.sub.x", source, False, modules) == expected
  assert module_imports("p.sub", source, True, modules) == expected  # a package's `.` is itself


def test_find_cycles_names_each_cycle_once():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
  assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
  assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_part_graph_joins_each_folder():
  graph = {"marl_jax": set(), "marl_jax.a": {"marl_jax.f.x"}, "marl_jax.f": {"marl_jax.f.x"},
           "marl_jax.f.x": {"marl_jax.f.y", "marl_jax.b"}, "marl_jax.f.y": set(), "marl_jax.b": {"marl_jax"}}
  assert part_graph(graph) == {"marl_jax.a": {"marl_jax.f"}, "marl_jax.f": {"marl_jax.b"}, "marl_jax.b": set()}
  # A loop through a folder's two modules is a loop between parts, though no module meets itself.
  graph["marl_jax.b"] = {"marl_jax.f.y"}
  assert find_cycles(graph) == [] and find_cycles(part_graph(graph)) == [["marl_jax.b", "marl_jax.f", "marl_jax.b"]]


def test_top_level_imports_reads_absolute_imports_only():
  source = "import tests.fixtures\nfrom conftest import x\nfrom . import y\ndef f():\n  import numpy as np\n"
  assert top_level_imports(source) == {"tests", "conftest", "numpy"}
