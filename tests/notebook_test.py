"""The notebooks run top to bottom at their tiny size: quickstart.ipynb (train, transcripts, plots) and
credit_explorer.ipynb (a new estimator registered in the notebook, graded against exact Shapley)."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("notebook", ["quickstart.ipynb", "credit_explorer.ipynb"])
def test_notebook_runs(tmp_path, notebook):
  # TMPDIR: a notebook's workdir (a tempfile.mkdtemp) lands in pytest's tmp_path, not in /tmp.
  env = {**os.environ, "MARL_JAX_NOTEBOOK_SIZE": "tiny", "TMPDIR": str(tmp_path)}
  result = subprocess.run(
      [sys.executable, "-m", "pytest", "--nbmake", "--nbmake-timeout=600", "-q", f"notebooks/{notebook}"],
      cwd=ROOT, env=env, capture_output=True, text=True)
  assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]


def test_colab_install_cell_says_what_to_do_when_it_has_no_source(tmp_path):
  """In a fresh runtime (marl_jax not importable), with neither REPO_URL nor an uploaded zip, the
  install cell stops with a message that says how to give it the code."""
  import json
  cells = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text())["cells"]
  install = "".join(next(c for c in cells if "REPO_URL" in "".join(c["source"]))["source"])
  program = "import sys\nsys.modules['marl_jax'] = None  # a runtime without marl_jax\n" + install
  result = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True)
  assert result.returncode != 0
  assert "set REPO_URL in this cell" in result.stderr and "marl_jax.zip" in result.stderr


@pytest.mark.parametrize("notebook", ["quickstart.ipynb", "credit_explorer.ipynb"])
def test_cells_after_the_install_cell_do_not_need_it(notebook):
  """Where marl_jax is installed the install cell may be skipped: no later cell reads a name that
  only the install cell binds (e.g. its `import os`)."""
  import ast
  import json
  cells = ["".join(c["source"]) for c in json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
           if c["cell_type"] == "code"]

  def names(source, context):
    tree = ast.parse(source)
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, context)}
    if context is ast.Store:
      loaded |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
      loaded |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
      loaded |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    return loaded

  install = [c for c in cells if "REPO_URL" in c]
  rest = [c for c in cells if "REPO_URL" not in c]
  only_install = set().union(*(names(c, ast.Store) for c in install)) - set().union(
      *(names(c, ast.Store) for c in rest))
  assert not only_install & set().union(*(names(c, ast.Load) for c in rest))
