"""The five scripts share their algorithm's building blocks by copy (each script is self-contained): the helpers
meant to be the same must stay character-for-character the same in every script that has them, so that a fix in
one is a fix in all (copy it over, or this test fails), and `diff msfa_babyai.py msfa_fruitbot.py` shows only what
differs between the envs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ("msfa_babyai.py", "msfa_fruitbot.py", "msfa_minihack.py", "usfa.py", "uvfa.py")
SAME_IN_ALL = ("reset_where", "masked_mean", "n_step_targets", "double_q_bootstrap", "sequence_priority",
               "importance_weights")
SAME_WHERE_PRESENT = ("gpi_q_values",)  # only the scripts with GPI have it


def functions(script: str) -> dict[str, str]:
    source = (ROOT / script).read_text()
    return {node.name: ast.get_source_segment(source, node) for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("name", SAME_IN_ALL + SAME_WHERE_PRESENT)
def test_shared_helpers_have_the_same_source_in_every_script(name):
    sources = {script: functions(script).get(name) for script in SCRIPTS}
    if name in SAME_IN_ALL:
        assert all(sources.values()), f"{name} is missing from {[s for s, v in sources.items() if not v]}"
    present = {s: v for s, v in sources.items() if v}
    assert len(present) >= 2
    reference = present["msfa_babyai.py"]
    differ = [s for s, v in present.items() if v != reference]
    assert not differ, f"{name} differs from msfa_babyai.py's in {differ}: copy one version to every script"


def test_the_readmes_method_map_points_at_the_right_lines():
    """Each row of the README's method map names functions of msfa_babyai.py and their line range: the range must
    run from the first one's `def` to the last one's end, so the map cannot drift from the code."""
    import re

    source = (ROOT / "msfa_babyai.py").read_text()
    spans = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            spans[node.name] = (node.lineno, node.end_lineno)
            for sub in getattr(node, "body", []):
                if isinstance(sub, ast.FunctionDef):
                    spans[f"{node.name}.{sub.name}"] = (sub.lineno, sub.end_lineno)
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Where each part of the method is")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if re.search(r"\| \d+-\d+ \|$", line)]
    assert len(rows) >= 15
    for row in rows:
        names = [n for n in re.findall(r"`([\w.]+)`", row) if n in spans]
        first, last = map(int, re.search(r"(\d+)-(\d+) \|$", row).groups())
        assert names, row
        assert (first, last) == (spans[names[0]][0], spans[names[-1]][1]), (row, [spans[n] for n in names])


CONTRACT = {  # what each script must expose to the tools (docs/contract.md), beyond tools.evaluate's names
    "msfa_babyai": ("core_step", "q_values", "gpi_q_values"),
    "msfa_fruitbot": ("core_step", "q_values", "gpi_q_values", "make_env"),
    "msfa_minihack": ("core_step", "q_values", "gpi_q_values", "make_env"),
    "usfa": ("core_step", "q_values", "gpi_q_values", "make_env"),
    "uvfa": ("core_step", "q_values", "make_env"),
}


@pytest.mark.parametrize("name", list(CONTRACT))
def test_every_script_exposes_what_the_results_tools_use(name):
    from helpers import SCRIPTS
    from tools import script_contract

    script = SCRIPTS[name]
    needed = script_contract.EVALUATE + CONTRACT[name]
    assert set(needed) <= set(script_contract.SCRIPT_NAMES)
    assert set(script_contract.play_names(script)) <= set(needed)
    script_contract.require_names(script, needed, "the tools")  # one line naming what is missing, if anything
