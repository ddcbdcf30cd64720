"""How the tools write their figures: PNG with a palette of at most 256 colours (matplotlib's figures hold few
colours; a palette keeps them as they are drawn and takes about a third of the bytes of full-colour PNG), so that
committed figures stay small."""

from __future__ import annotations

import io
from pathlib import Path


def compact_png(data: bytes) -> bytes:
    """A PNG's bytes with its colours in a palette of at most 256 (median cut, no dithering), saved optimised."""
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB")
    palette = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def save_figure(fig, path: Path, dpi: int = 110, **kwargs) -> None:
    """fig as a compact PNG at `path` (savefig's keyword arguments pass through)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, **kwargs)
    Path(path).write_bytes(compact_png(buffer.getvalue()))
