"""Saved agents in a compact form that loads exactly: params_seed<N>.eqx -> params_seed<N>.eqz.

    python -m tools.compact_agents RUN_DIR [RUN_DIR ...]     # each params_seed<N>.eqx becomes params_seed<N>.eqz

Every tool reads either form (`open_params`), and the .eqz gives back the .eqx byte for byte (its SHA-256 is
checked on every load), so a compacted agent plays exactly as the trained one. The repository commits its agents this
way (results/*/README.md); a run writes plain .eqx files.

Why it is smaller: a parameter file is float32 words, and the bytes of a word differ in kind: the top one (sign and
exponent) takes few values across a layer, the bottom ones are close to noise. xz on the file as written sees the
four kinds interleaved; regrouped into four planes (every word's first byte, then every second byte, ...) it finds
the repetition in the top planes. Measured on the committed agents: 8.70 MB -> 7.33 MB (BabyAI MSFA), 6.64 MB ->
5.60 MB (Fruitbot MSFA), against 8.00 and 6.13 MB for plain `xz -9e`.

Format: the .eqx's JSON header line unchanged (`head -1` still shows step, method and settings), one JSON line
{"compact": ..., "bytes": n, "sha256": ...} describing the rest of the .eqx (the leaves, n bytes), then the xz stream
of those n bytes (zero-padded to whole words) as byte planes."""

from __future__ import annotations

import hashlib
import io
import json
import lzma
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

from common.run import ConfigError, exit_on_config_error, require

FORMAT = "xz of the leaves' bytes as 4 byte planes"
WORD = 4  # bytes per float32


def compress(eqx_bytes: bytes) -> bytes:
    """The .eqz file of a .eqx file's bytes."""
    header, _, body = eqx_bytes.partition(b"\n")
    padded = np.frombuffer(body + bytes(-len(body) % WORD), np.uint8)
    planes = padded.reshape(-1, WORD).T.tobytes()
    about = {"compact": FORMAT, "bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    return header + b"\n" + json.dumps(about).encode() + b"\n" + lzma.compress(planes, preset=9 | lzma.PRESET_EXTREME)


def decompress(eqz_bytes: bytes, origin: str = "") -> bytes:
    """The .eqx file's bytes back from a .eqz file's; one line (ConfigError) if the file is damaged."""
    header, _, rest = eqz_bytes.partition(b"\n")
    about_line, _, stream = rest.partition(b"\n")
    try:
        about = json.loads(about_line)
        require(about.get("compact") == FORMAT, f"{origin}: not a compact parameter file ({about.get('compact')!r})")
        planes = np.frombuffer(lzma.decompress(stream), np.uint8)
    except (ValueError, lzma.LZMAError, AttributeError):
        raise ConfigError(f"{origin} is damaged: its compact parameters do not decompress; get the file again "
                          "(git checkout) or recompact the .eqx") from None
    body = planes.reshape(WORD, -1).T.tobytes()[: about["bytes"]]
    require(hashlib.sha256(body).hexdigest() == about["sha256"],
            f"{origin} is damaged: its parameters do not match their SHA-256; get the file again (git checkout)")
    return header + b"\n" + body


def portable_header(data: bytes) -> bytes:
    """A parameter file's bytes (.eqx or .eqz) with its header's run directory as "." (the file's folder), as runs
    write it now: older ones named the folder of the machine they ran on. The parameters are untouched (the .eqz's
    SHA-256 covers them alone)."""
    header, newline, rest = data.partition(b"\n")
    meta = json.loads(header)
    if meta.get("args", {}).get("run_dir", ".") == ".":
        return data
    meta["args"]["run_dir"] = "."
    return json.dumps(meta).encode() + newline + rest


def open_params(path: Path):
    """A binary file object of a parameter file's .eqx bytes, whichever form it is stored in."""
    if path.suffix == ".eqz":
        return io.BytesIO(decompress(path.read_bytes(), str(path)))
    return path.open("rb")


@dataclass
class Args:
    run_dirs: tyro.conf.Positional[tuple[str, ...]]
    """run directories whose params_seed<N>.eqx files to compact"""


@exit_on_config_error
def main(args: Args) -> None:
    for run_dir in map(Path, args.run_dirs):
        files = sorted(run_dir.glob("params_seed*.eqx"))
        require(files, f"no params_seed<N>.eqx in {run_dir}: nothing to compact")
        for path in files:
            original = path.read_bytes()
            compact = compress(original)
            require(decompress(compact, str(path)) == original, f"{path}: the compact form does not give the file "
                                                                 "back; it is kept as it is")
            out = path.with_suffix(".eqz")
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_bytes(compact)
            tmp.replace(out)
            path.unlink()
            print(f"{path} ({len(original) / 1e6:.2f} MB) -> {out.name} ({len(compact) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main(tyro.cli(Args))
