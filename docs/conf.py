"""Sphinx configuration of the icecrypt documentation (``make docs``).

Markdown pages (MyST), API reference from docstrings (autodoc), the furo theme.  Nothing
here fetches anything: no intersphinx, no remote assets.
"""

from __future__ import annotations

import sys
from pathlib import Path

from docutils import nodes

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import icecrypt  # noqa: E402

project = "icecrypt"
author = "the icecrypt authors"
copyright = "the icecrypt authors"  # noqa: A001 - Sphinx's name
release = icecrypt.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"icecrypt {release}"
html_static_path: list[str] = []
# The Markdown sources hold hidden test setup (HTML comments): do not publish them.
html_copy_source = False
html_show_sourcelink = False

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_inherit_docstrings = False
autodoc_default_options = {"members": True, "show-inheritance": True}

nitpicky = True
# Names of third-party libraries that have no inventory here (intersphinx would need the
# network).  Only names outside icecrypt belong in this list.
nitpick_ignore_regex = [
    (r"py:.*", r"(pa|pq|pqe|pafs|pyarrow)(\..*)?"),
    (r"py:.*", r"(pyspark|pyiceberg|fastavro|boto3|hvac|kmip|fsspec|sqlalchemy)(\..*)?"),
    (r"py:.*", r"(Schema|PartitionSpec|SortOrder|BooleanExpression)"),
    (r"py:.*", r"(Buffer|typing_extensions\.Buffer|collections\.abc\..*|os\.PathLike.*|io\..*)"),
    # the standard library (no inventory either)
    (r"py:.*", r"(atexit|abc\.ABC|threading\..*|typing\..*)"),
]


def _drop_html_comments(app, doctree) -> None:
    """Remove HTML comments (``<!-- setup ... -->`` and friends, see
    tests/docs/test_examples.py) from the pages: MyST keeps them as raw HTML."""
    for node in list(doctree.findall(nodes.raw)):
        text = node.astext().strip()
        if node.get("format") == "html" and text.startswith("<!--") and text.endswith("-->"):
            node.parent.remove(node)


def setup(app):
    app.connect("doctree-read", _drop_html_comments)
