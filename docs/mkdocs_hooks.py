"""MkDocs hooks (mkdocs.yml's ``hooks``): the README, which sits above docs/, is the site's index.

Its links into docs/ (``docs/protocol.md#host-limits``) become the site's (``protocol.md#host-limits``),
so the README reads right both on a code host and on the site, and the strict build checks them.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

README = Path(__file__).resolve().parent.parent / "README.md"
DOCS_LINK = re.compile(r"\]\(docs/")


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "index.md", content=DOCS_LINK.sub("](", README.read_text())))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """A page's links to the README (``../README.md#run-it-on-a-raspberry-pi``) lead to the index."""
    return markdown.replace("](../README.md", "](index.md")
