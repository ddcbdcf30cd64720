"""tools/compact_agents.py: a compact parameter file gives back the .eqx byte for byte, every tool reads it, and a damaged
or doubled file stops with one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from common.run import ConfigError
from tools import compact_agents
from tools.evaluate import load_agent, params_files

ROOT = Path(__file__).resolve().parent.parent
MSFA_BABYAI = ROOT / "results/babyai/paper_protocol_h200/msfa/params_seed1.eqz"


def fake_eqx(length: int) -> bytes:
    """A header line and `length` bytes of float32-like words (not a multiple of 4: the padding is exercised)."""
    words = np.random.default_rng(length).normal(size=length // 4 + 1).astype(np.float32).tobytes()[:length]
    return json.dumps({"step": 7, "method": "MSFA"}).encode() + b"\n" + words


@pytest.mark.parametrize("length", [0, 1, 4, 4099])
def test_round_trip_is_exact(length):
    original = fake_eqx(length)
    packed = compact_agents.compress(original)
    assert packed.split(b"\n")[0] == original.split(b"\n")[0]  # `head -1` still shows the header
    assert compact_agents.decompress(packed, "x") == original


def test_the_planes_are_what_makes_it_small():
    """Word-aligned data whose top bytes repeat (as a layer's sign and exponent bytes do) packs to far less than
    its size; the planes are the four bytes of each word, grouped."""
    words = (np.random.default_rng(0).uniform(1, 2, 4096).astype(np.float32)).tobytes()
    packed = compact_agents.compress(b"{}\n" + words)
    assert len(packed) < 0.8 * len(words)


def test_a_damaged_file_stops_with_one_line():
    packed = bytearray(compact_agents.compress(fake_eqx(4099)))
    header, about, _ = bytes(packed).split(b"\n", 2)
    with pytest.raises(ConfigError, match="do not decompress"):
        compact_agents.decompress(bytes(packed[:-20]), "cut.eqz")
    changed = json.loads(about) | {"sha256": "0" * 64}
    with pytest.raises(ConfigError, match="do not match their SHA-256"):
        compact_agents.decompress(header + b"\n" + json.dumps(changed).encode() + b"\n" + bytes(packed).split(b"\n", 2)[2],
                           "other.eqz")


def test_the_committed_agent_loads_from_its_compact_form(tmp_path, capsys):
    """The committed BabyAI MSFA agent: decompressed, it is a valid .eqx whose leaves load; compacting that .eqx
    again (the CLI) gives the same .eqz bytes, and a run directory with both forms of a seed is refused."""
    original = compact_agents.decompress(MSFA_BABYAI.read_bytes(), str(MSFA_BABYAI))
    (tmp_path / "params_seed1.eqx").write_bytes(original)
    script, args, params, header = load_agent(tmp_path / "params_seed1.eqx")
    assert header["step"] == 468_480 and script.__name__.endswith("msfa_babyai")
    (tmp_path / "params_seed1.eqz").write_bytes(b"")
    with pytest.raises(ConfigError, match="holds both params_seed1.eqx and params_seed1.eqz"):
        params_files(tmp_path)
    (tmp_path / "params_seed1.eqz").unlink()
    compact_agents.main(compact_agents.Args(run_dirs=(str(tmp_path),)))
    assert "-> params_seed1.eqz" in capsys.readouterr().out and not (tmp_path / "params_seed1.eqx").exists()
    assert (tmp_path / "params_seed1.eqz").read_bytes() == MSFA_BABYAI.read_bytes()
