"""The script that trained a run: config.json and every parameter file name it, so that the tools rebuild the
agent with that script (a copy with another network or loss included)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from common.run.errors import require


ROOT = Path(__file__).resolve().parents[2]  # the repository (common/run/scripts.py)
REPOSITORY_SCRIPTS = ("msfa_babyai", "msfa_fruitbot", "msfa_minihack", "usfa", "uvfa")
"""the repository's own training scripts: their runs are named by their method (MSFA, USFA, ...); a copy's runs by
its exp_name (a copy of msfa_babyai.py is not MSFA)"""


def script_of(args) -> str:
    """The file of the script whose Args `args` is: relative to the repository root when inside it."""
    path = Path(sys.modules[type(args).__module__].__file__).resolve()
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def is_copy(script: str) -> bool:
    """Whether a run's script (script_of) is a copy rather than one of the repository's own."""
    return Path(script).stem not in REPOSITORY_SCRIPTS


def load_script(script: str, origin: str = ""):
    """The module of a training script named by a run (a path relative to the repository root, or absolute).
    A missing file stops with one line saying which run needs it."""
    path = Path(script) if Path(script).is_absolute() else ROOT / script
    require(path.is_file(), f"{origin or 'the run'} was trained by {script}, which is not there (moved or deleted): "
                            "put the script back at that path to rebuild its agent")
    return _import_script(path.resolve())


@functools.lru_cache(maxsize=None)
def _import_script(path: Path):
    import importlib.util

    if path.parent == ROOT:  # a script of the repository, or a copy next to them: the importable module
        import importlib

        return importlib.import_module(path.stem)
    if str(path.parent) not in sys.path:  # modules beside a copy (its own edited farm.py, say) import as when it ran
        sys.path.append(str(path.parent))
    name = f"_script_{path.stem}_{abs(hash(str(path))) % 10**8}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
