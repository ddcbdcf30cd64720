"""Fruitbot's 64x64 frame, drawn inside the jitted program from procgen's own images.

The sprites and backgrounds are read at start-up from the installed procgen package's data folder (never copied into
this repository). Sprite ids below index `SPRITE_FILES`; `common.fruitbot_jax` stores one sprite id per entity.
"""

from __future__ import annotations

import functools
import os

import numpy as np

# Sprite ids, in the order of SPRITE_FILES. Fruit k (1-6) is FRUIT + k - 1, food k is FOOD + k - 1.
PLAYER_SPRITE, BARRIER_SPRITE, KEY_SPRITE, FRUIT, FOOD, DOOR_SPRITE, LOCK_SPRITE, PRESENT = 0, 1, 2, 3, 9, 15, 16, 17
SPRITE_FILES = (["misc_assets/robot_3Dblue.png", "misc_assets/tileStone_slope.png", "misc_assets/keyRed2.png"]
                + [f"misc_assets/fruit{k}.png" for k in range(1, 7)] + [f"misc_assets/food{k}.png" for k in range(1, 7)]
                + ["misc_assets/fenceYellow.png", "misc_assets/lockRed2.png"]
                + [f"misc_assets/present{k}.png" for k in range(1, 4)])
NUM_SPRITES = len(SPRITE_FILES)
# fruitbot.cpp draws its backgrounds from procgen's "topdown_backgrounds" list (resources.cpp), in this order.
BACKGROUND_FILES = ["topdown_backgrounds/floortiles.png"] + [
    f"topdown_backgrounds/backgrounddetailed{k}.png" for k in range(1, 9)]


def asset_dir() -> str:
    """The installed procgen package's image folder."""
    try:
        import procgen
    except ImportError as error:
        raise SystemExit("Fruitbot's images come from the procgen package: pip install -r requirements.txt") from error
    return os.path.join(os.path.dirname(procgen.__file__), "data", "assets")


@functools.lru_cache(maxsize=None)
def load_image(name: str) -> np.ndarray:
    """One of procgen's images as an RGBA uint8 array [height, width, 4]."""
    from PIL import Image

    path = os.path.join(asset_dir(), name)
    if not os.path.exists(path):
        raise SystemExit(f"procgen's image {path} is missing: reinstall procgen (pip install -r requirements.txt)")
    return np.asarray(Image.open(path).convert("RGBA"))


@functools.lru_cache(maxsize=None)
def sprite_aspect_ratios() -> np.ndarray:
    """width / height of every sprite, as float32 like procgen's asset_aspect_ratios (fit_aspect_ratio uses it)."""
    return np.array([load_image(name).shape[1] / load_image(name).shape[0] for name in SPRITE_FILES], np.float32)
