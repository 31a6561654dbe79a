"""Sphinx configuration: reference docs built from the docstrings (autodoc + napoleon) and the
pages beside this file. Build: ``python -m sphinx -n -W -b html docs build/docs`` (``build/`` is
git-ignored)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)                 # document this checkout, not an installed copy

import bincheck  # noqa: E402

project = "bincheck"
author = "bincheck developers"
copyright = "2026, bincheck developers"
release = version = bincheck.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
exclude_patterns = ["_build", "examples"]
templates_path: list[str] = []

# Standard-library and torch types in signatures: without intersphinx (the docs build offline)
# nothing documents them here. Every other reference must resolve: python -m sphinx -n -W.
nitpick_ignore = [("py:class", name) for name in (
    "collections.abc.Iterable", "collections.abc.Iterator", "collections.abc.Sequence",
    "os.PathLike", "torch.nn.modules.module.Module", "torch.nn.modules.container.Sequential")]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
napoleon_google_docstring = True
napoleon_numpy_docstring = True

html_theme = "alabaster"
html_theme_options = {"description": "Optimal checkpointing for HIPS autograd",
                      "fixed_sidebar": True, "page_width": "1100px", "sidebar_width": "230px"}
html_static_path: list[str] = []
html_show_sourcelink = False


# Napoleon reads the first line of an attribute's or property's docstring as "type: description"
# (Google style), which turns bincheck's prose ("The schedule: fixed, or ...") into a wrong
# "Type:" field. Keep napoleon for Args/Returns sections, but hand attribute and property
# docstrings through unchanged: save them before napoleon runs (priority 500) and put them back
# after it.
_saved: dict = {}


def _save(app, what, name, obj, options, lines):
    if what in ("attribute", "property"):
        _saved[name] = list(lines)


def _restore(app, what, name, obj, options, lines):
    if what in ("attribute", "property") and name in _saved:
        lines[:] = _saved.pop(name)


def setup(app):
    app.connect("autodoc-process-docstring", _save, priority=100)
    app.connect("autodoc-process-docstring", _restore, priority=900)
