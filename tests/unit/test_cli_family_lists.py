"""The Hugging Face families the CLI's help names come from the registry
(attn_core/hf/families/__init__.py), read without importing it: every registered family is
listed in the help of every command that takes a model (``edit``, ``export-hf``, ...) and in
``export-hf``'s own, and a family added to the registry shows up there with no other change."""

import shutil
from pathlib import Path

from typer.testing import CliRunner

from attn_core import cli
from attn_core.cli.common import hf_families
from attn_core.hf import families
from attn_core.hf.families import FAMILIES


def _help(*words: str) -> str:
    out = CliRunner().invoke(cli.app, [*words, "--help"], env={"COLUMNS": "200"}).output
    return " ".join(out.split())


def test_the_help_lists_every_registered_family():
    assert hf_families() == FAMILIES
    listed = ", ".join(FAMILIES)
    for command in ("edit", "export-hf", "spectrum"):
        assert f"Hugging Face folder ({listed})" in _help(command), command
    assert f"Families: {listed}." in _help("export-hf")


def test_a_family_added_to_the_registry_shows_up_in_the_lists(tmp_path):
    folder = shutil.copytree(Path(families.__file__).parent, tmp_path / "families")
    (folder / "new_family.py").write_text('FAMILY = Family(\n    "new_type", config, slots)\n')
    registry = (folder / "__init__.py").read_text()
    (folder / "__init__.py").write_text(
        registry.replace("        deepseek_v2.FAMILY,\n", "        deepseek_v2.FAMILY,\n        new_family.FAMILY,\n")
    )
    assert hf_families(folder) == (*FAMILIES, "new_type")
