"""A griffe extension for the API reference (mkdocs.yml): the library's docstrings are prose in
reStructuredText's manner, read here as Markdown. Doctest examples (``>>>`` lines and their output)
become Python code blocks, Sphinx roles (``:func:`load```) become code, and square brackets in
prose (``[L | R]``) stay text instead of being read as links."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj):`~?([^`]+)`")
CODE_SPAN = re.compile(r"(``.+?``|`[^`]+`)")


def _prose(line: str) -> str:
    parts = CODE_SPAN.split(ROLE.sub(r"``\1``", line))
    return "".join(p if i % 2 else p.replace("[", "\\[").replace("]", "\\]") for i, p in enumerate(parts))


def markdown_of(text: str) -> str:
    """``text`` (a docstring) with its doctests fenced and its prose made safe for Markdown."""
    out: list[str] = []
    in_example = in_fence = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            in_fence = not in_fence
            out.append(line)
        elif in_fence:
            out.append(line)
        elif stripped.startswith(">>>") and not in_example:
            out += ["", "```python", stripped]
            in_example = True
        elif in_example and stripped:
            out.append(stripped)
        elif in_example:
            out += ["```", ""]
            in_example = False
        elif line.startswith("    "):  # an indented block: code in Markdown, kept as it is
            out.append(line)
        else:
            out.append(_prose(line))
    if in_example:
        out.append("```")
    return "\n".join(out)


class DocstringsAsMarkdown(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
