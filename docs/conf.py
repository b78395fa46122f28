"""Sphinx configuration of the everystep documentation.

Pages are Markdown (MyST); the API reference comes from the docstrings through
autodoc. Build it with ``./scripts/docs``: warnings are errors (``-W``) and
every cross-reference must resolve (``-n``), so a broken link fails the build.
"""

import os
import sys
from pathlib import Path

import django

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_settings")
django.setup()

project = "everystep"
author = "the everystep developers"
copyright = "the everystep developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# Headings up to ### get anchors, so that [text](page.md#a-heading) links resolve
# (and fail the build when the heading is renamed).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True

# The build runs offline, without intersphinx: references to the standard
# library's and Django's objects cannot be resolved and are not checked.
# References to everystep's own objects are.
nitpick_ignore_regex = [
    ("py:.*", r"(collections\.abc|typing|types|datetime|uuid|enum|threading)\..*"),
    ("py:.*", r"django\..*"),
    ("py:class", r"(Any|Callable|Exception|BaseException|str|int|float|bool|tuple|list|dict)"),
]

html_theme = "furo"
html_title = "everystep"
html_static_path = []
