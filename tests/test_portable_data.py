"""The committed runs (results/, data only) name no folder of the machine they ran on: a user's copy of a run
points at nothing they lack. Runs write their run directory as "." and their command with the script as the
repository names it (common.run.portable_config); tools.export writes older runs' files that way."""

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ABSOLUTE = re.compile(r"(?<![\w.~/:<>+\-\])])/[\w.+-]+(?:/[\w.+-]+)+")
"""an absolute path of two or more parts (not a URL's, a relative path's inner slash, or a placeholder's)"""


def tracked(folder: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return [ROOT / f for f in out]


def text_of(path: Path) -> str | None:
    """What of a file can name a folder: a text file's text; a parameter file's JSON header; None for the rest
    (images, packed tables of numbers, parameters)."""
    if path.suffix in (".eqz", ".eqx"):
        return path.open("rb").readline().decode()
    if path.suffix in (".png", ".gif", ".xz"):
        return None
    return path.read_text()


def test_no_committed_data_file_holds_an_absolute_path():
    found = []
    for path in tracked("results"):
        text = text_of(path)
        found += [f"{path.relative_to(ROOT)}: {m.group()}" for m in ABSOLUTE.finditer(text or "")]
    assert not found, found[:10]


def test_the_paths_are_found_where_they_would_be():
    """The check finds the paths runs used to write (and not a URL or a relative path)."""
    config = json.dumps({"args": {"run_dir": "/work/runs/mini/msfa"}, "command": "/home/me/repo/usfa.py --seed 1"})
    assert [m.group() for m in ABSOLUTE.finditer(config)] == ["/work/runs/mini/msfa", "/home/me/repo/usfa.py"]
    fine = "see https://github.com/x/y and results/babyai/README.md, external/xla+/xla/a.cc, <site-packages>/jax/x.py"
    assert not ABSOLUTE.findall(fine)


@pytest.mark.parametrize("merged", [False, True])
def test_portable_config_writes_the_run_directory_relative_to_the_run(merged):
    from common.run import portable_config

    config = {"script": "msfa_babyai.py", "args": {"run_dir": "/work/runs/mini/msfa/seed1", "seed": 1},
              "command": "/work/frozen/msfa_babyai.py --seed 1 --run-dir /work/runs/mini/msfa/seed1",
              "resumes": [{"command": "/x/msfa_babyai.py --resume --run-dir=/y/seed1",
                           "changed": {"run_dir": ["/a", "/b"], "total_timesteps": [1, 2]}}]}
    out = portable_config(config, run_dir_as="seed1" if merged else None)
    where = "seed1" if merged else "."
    assert out["args"]["run_dir"] == "."
    assert out["command"] == f"msfa_babyai.py --seed 1 --run-dir {where}"
    assert out["resumes"][0]["command"] == f"msfa_babyai.py --resume --run-dir={where}"
    assert out["resumes"][0]["changed"] == {"total_timesteps": [1, 2]}  # where it lay is not a setting
    assert portable_config(out, run_dir_as="seed1" if merged else None) == out  # twice changes nothing
    assert not ABSOLUTE.findall(json.dumps(out))


QUOTED_RESULT = re.compile(r"(?<![\w/:.])results/[\w./-]*[\w/]")
"""a path under results/ quoted in a page (not one inside another path, nor a `git show REV:results/...`)"""


def test_every_results_path_the_pages_quote_is_committed():
    """A page that names a committed run, agent or figure names one a fresh clone has (a method merged after its
    seeds moves its files from <method>/seed<k>/ to <method>/: the pages must follow)."""
    files = {str(p.relative_to(ROOT)) for p in tracked("results")}
    folders = {str(parent) for f in files for parent in Path(f).parents}
    missing = []
    for page in [p for p in tracked(".") if p.suffix == ".md"]:
        for m in QUOTED_RESULT.finditer(page.read_text()):
            path = m.group().rstrip("/.")
            if path not in files and path not in folders:
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, missing
