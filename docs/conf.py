"""Sphinx configuration of marl_jax's documentation site.

Build (warnings are errors):  python -m sphinx -W --keep-going -b html docs docs/_build/html
Install what it needs:        pip install -e ".[dev,docs]"
"""
import os
import pathlib
import pkgutil
import re
import sys

# Autodoc imports marl_jax, hence JAX: keep it on the CPU whatever the machine has.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

project = "marl_jax"
copyright = "the marl_jax authors"
author = "the marl_jax authors"

extensions = [
    "myst_nb",  # MyST Markdown pages and Jupyter notebooks (it brings myst_parser along)
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
# No intersphinx: it fetches other projects' inventories over the network, which CI does not have.

exclude_patterns = ["_build"]
myst_heading_anchors = 3  # `page.md#a-heading` links resolve, as they do on GitHub
myst_enable_extensions = ["colon_fence"]

# The notebooks (docs/notebooks/*.ipynb are links to notebooks/) train for minutes, so the build shows
# them without running them; the test suite's slow tier runs both (tests/notebook_test.py).
nb_execution_mode = "off"

# API reference: docstrings use single backticks for code, as in Markdown.
default_role = "code"
autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
    # A package's page documents what the package itself defines; what it re-exports from its
    # modules is documented once, on the module's own entry.
    "ignore-module-all": True,
}
autodoc_typehints = "description"
autodoc_preserve_defaults = True
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "sphinx_book_theme"
html_title = "marl_jax"
html_theme_options = {"show_toc_level": 2}

# Modules without an API entry on purpose: `main` is the command line (its docstring is the command,
# shown on the Running page), and it defines the same absl flags as `tools.credit_benchmark`, so both cannot be
# imported into one process.
API_EXEMPT = {"marl_jax.main"}


def _check_api_coverage(app):
  """Fails the build (a warning, under -W) when a marl_jax module has no entry in docs/api/."""
  from sphinx.util import logging
  documented = set()
  for page in (DOCS / "api").glob("*.md"):
    documented |= set(re.findall(r"^\.\. automodule:: (\S+)", page.read_text(), re.M))
  import marl_jax
  modules = {"marl_jax"} | {m.name for m in pkgutil.walk_packages(marl_jax.__path__, "marl_jax.")}
  for name in sorted(modules - documented - API_EXEMPT):
    logging.getLogger(__name__).warning(f"API reference: module {name} has no automodule entry in docs/api/")
  for name in sorted(documented - modules):
    logging.getLogger(__name__).warning(f"API reference: docs/api/ documents {name}, which is not a module")


def setup(app):
  app.connect("builder-inited", _check_api_coverage)
