"""Fruitbot's 64x64 frame, drawn inside the jitted program from procgen's own images.

The sprites and backgrounds are read at start-up from the installed procgen package's data folder (never copied into
this repository). Sprite ids below index `SPRITE_FILES`; `common.fruitbot_jax` stores one sprite id per entity.
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
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


# ---------------------------------------------------------------------------------------------------------------------
# The frame, drawn as procgen's Qt painter draws it
# ---------------------------------------------------------------------------------------------------------------------
# How procgen draws a Fruitbot frame (basic-abstract-game.cpp, fruitbot.cpp, game.cpp; Qt 5 raster engine, no
# antialiasing and no smooth pixmap transform, so every image is sampled nearest-neighbour into a float rect):
#   1. black, then the level's background image tiled vertically over the level rect (bg_tile_ratio -1: tiles as
#      wide as the level, here exactly 64 px square);
#   2. the grid cells in view: fruitbot's grid is all space, but cells outside the level answer OUT_OF_BOUNDS_WALL,
#      drawn with the barrier image (tileStone_slope) in rects widened by RENDER_EPS: a row of stone tiles below the
#      level's bottom edge and above its top edge;
#   3. the entities of render_z 0 in list order, barriers tiled horizontally (tile aspect 1), locked doors too
#      (aspect 3.25), then the agent (render_z 1) rotated by -90 degrees about its rect's centre.
# An unrotated image drawn into a float rect (left, top, w, h) covers the pixel columns [round(left), round(left+w))
# (round half up), and column X samples source column (ceil((X + 0.5 - left) * ix) - 1) >> 16 with the 16.16
# fixed-point step ix = int(65536 * src_width / w); rows likewise (Qt's qt_scale_image_32bit mapping). The rotated
# agent is sampled at pixel centres (Qt's transformed-image path): a pixel is drawn where its centre, rotated back
# into the rect, falls inside, at floor of the source coordinate. Sprites are premultiplied ARGB (QImage's
# ARGB32_Premultiplied) blended source-over with Qt's byte multiply, dst = src + (dst * (255 - a) + 128 + ...) / 256.
# These were matched pixel for pixel against procgen's observations (tests/test_fruitbot_frame.py).

RENDER_EPS = np.float32(0.02)
OUT_OF_BOUNDS_SPRITE = BARRIER_SPRITE  # fruitbot's OUT_OF_BOUNDS_WALL uses the barrier's image
TILE_ASPECT = np.zeros(NUM_SPRITES, np.float32)  # fruitbot.cpp get_tile_aspect_ratio: 0 = not tiled
TILE_ASPECT[BARRIER_SPRITE], TILE_ASPECT[DOOR_SPRITE] = 1.0, 3.25
BG_ROWS, RES = 512, 64


class FrameImages(NamedTuple):
    """Everything `render` reads, built once by `frame_images()` from procgen's images."""
    atlas: jax.Array  # uint32 [A]: every sprite's premultiplied ARGB pixels row by row; atlas[0] is transparent
    base: jax.Array  # int32 [NUM_SPRITES]: where each sprite starts in the atlas
    width: jax.Array  # int32 [NUM_SPRITES]
    height: jax.Array  # int32 [NUM_SPRITES]
    backgrounds: jax.Array  # uint32 [len(BACKGROUND_FILES), 512, 64]: 0x00RRGGBB, scaled to the 64 px width
    bg_height: jax.Array  # int32 [len(BACKGROUND_FILES)]: source rows of each background


def _pack(rgba: np.ndarray) -> np.ndarray:
    """uint8 [..., 4] RGBA -> uint32 ARGB premultiplied as Qt's qPremultiply rounds it."""
    c = rgba[..., :3].astype(np.uint32)
    a = rgba[..., 3:].astype(np.uint32)
    t = c * a
    p = (t + (t >> 8) + 0x80) >> 8
    return (a[..., 0] << 24) | (p[..., 0] << 16) | (p[..., 1] << 8) | p[..., 2]


def _qround_np(v):
    """Qt's qRound: round half up (floor(v + 0.5)), in numpy float64."""
    return np.floor(np.asarray(v, np.float64) + 0.5).astype(np.int64)


def _scale_indices(left: float, width: float, src: int, n: int = RES):
    """Qt's nearest-neighbour mapping (float64, as Qt computes it): the source index of each of n pixels, -1 outside."""
    ix = int(65536 / (width / src))
    lo, hi = max(_qround_np(left), 0), min(_qround_np(left + width), n)
    out = np.full(n, -1, np.int64)
    for p in range(lo, hi):
        out[p] = min(max((math.ceil((p + 0.5 - left) * ix) - 1) >> 16, 0), src - 1)
    return out


@functools.lru_cache(maxsize=None)
def _frame_images_np():
    sprites = [_pack(load_image(name)) for name in SPRITE_FILES]
    base, offset = [], 1  # atlas[0]: a transparent texel for "nothing here"
    for s in sprites:
        base.append(offset)
        offset += s.size
    atlas = np.concatenate([np.zeros(1, np.uint32)] + [s.ravel() for s in sprites])
    backgrounds = np.zeros((len(BACKGROUND_FILES), BG_ROWS, RES), np.uint32)
    bg_height = []
    for b, name in enumerate(BACKGROUND_FILES):
        img = load_image(name)
        # the level rect is exactly 64 px wide (main_width * unit), at x = 0: the column mapping is fixed
        cols = _scale_indices(0.0, float(RES), img.shape[1])
        rgb = img[:, cols, :3].astype(np.uint32)
        backgrounds[b, : img.shape[0]] = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
        bg_height.append(img.shape[0])
    return (atlas, np.array(base, np.int32), np.array([s.shape[1] for s in sprites], np.int32),
            np.array([s.shape[0] for s in sprites], np.int32), backgrounds, np.array(bg_height, np.int32))


def frame_images() -> FrameImages:
    """The images `render` draws from (procgen's package images, premultiplied and pre-scaled), as device arrays."""
    return FrameImages(*(jnp.asarray(a) for a in _frame_images_np()))


# -- the camera (BasicAbstractGame::prepare_for_drawing with FruitBotGame::choose_center), in procgen's float math --
f32 = np.float32


class _View(NamedTuple):
    """What depends only on the level's size (static): procgen's float32 camera constants and the fixed mappings."""
    unit: np.float32  # pixels per world unit
    view_dim: np.float32
    x_off: np.float32
    half_view: np.float32
    center_x_minus: np.float32  # main_width / 2.0 as procgen's float
    margin: np.float32  # draw_foreground's visibility / 2.0 + 1
    bg_top0: np.float32  # (view_dim - main_height) * unit: the level rect's top before y_off
    bg_tile_h: np.float32
    bg_tiles: int
    cell_h: np.float32  # an out-of-bounds cell's height in pixels (1 + 2 RENDER_EPS units)
    oob_cols: np.ndarray  # int [2, 64]: the stone tile's source column drawn in each pixel column by its first
    # (left) and second (right) cell, -1 none


@functools.lru_cache(maxsize=None)
def _view(main_width: int, main_height: int) -> _View:
    visibility = f32(main_width)
    unit = f32(f32(64) / visibility)  # raw_unit * (64 / 64.0)
    view_dim = f32(64.0 / float(unit))
    center_x = f32(main_width / 2.0)
    half_view = f32(view_dim / f32(2))
    x_off = f32(unit * f32(center_x - half_view))
    margin = f32(float(visibility) / 2.0 + 1)
    # the level rect: get_screen_rect(0, main_height, main_width, main_height), tiled vertically (bg_tile_ratio -1)
    bg_w, bg_h = f32(f32(main_width) * unit), f32(f32(main_height) * unit)
    if x_off != 0 or bg_w != RES:
        raise NotImplementedError(f"main_width {main_width}: the level rect is not 64 px wide at x 0 "
                                  f"({bg_w} at {-x_off}); the pre-scaled backgrounds assume it is")
    tiles = max(int(float(bg_h) / float(bg_w)), 1)
    tile_h = f32(float(bg_h) / tiles)
    # out-of-bounds cells: columns low_x..high_x, each (1 + 2 eps) units wide from x - eps (fixed horizontally)
    low_x, high_x = int(center_x - margin), int(center_x + margin)
    cell_w = f32(f32(1 + f32(2 * RENDER_EPS)) * unit)
    src = int(load_image(SPRITE_FILES[OUT_OF_BOUNDS_SPRITE]).shape[1])
    cols = np.full((2, RES), -1, np.int64)  # a pixel column can lie in two neighbouring cells (they overlap by 2 eps)
    for cell in range(low_x, high_x + 1):
        left = float(f32(f32(f32(cell) - RENDER_EPS) * unit) - x_off)
        idx = _scale_indices(left, float(cell_w), src)
        if not 0 <= cell < main_width and (idx >= 0).any():
            raise NotImplementedError(f"main_width {main_width}: the out-of-bounds cells beside the level are in view")
        second = (idx >= 0) & (cols[0] >= 0)
        if (second & (cols[1] >= 0)).any():
            raise NotImplementedError(f"main_width {main_width}: a pixel column in three grid cells")
        cols[1] = np.where(second, idx, cols[1])
        cols[0] = np.where((idx >= 0) & ~second, idx, cols[0])
    return _View(unit, view_dim, x_off, half_view, center_x, margin, f32(f32(view_dim - f32(main_height)) * unit),
                 tile_h, tiles, cell_w, cols)




AGENT_R = np.float32(0.4)  # procgen's agent half-size (basic-abstract-game.cpp a_r): fixes the agent's pixel rows


def agent_band(main_width: int) -> tuple[int, int]:
    """The pixel rows the agent can cover (static: the camera follows it, cy = agent.y + main_width / 2 - 0.8)."""
    unit = _view(main_width, 60).unit
    top = float(unit) * (main_width - 3 * float(AGENT_R))
    return max(int(np.floor(top)) - 1, 0), min(int(np.ceil(top + 2 * float(AGENT_R) * float(unit))) + 1, RES)


# -- exact float helpers: procgen's rects are float32, Qt's arithmetic on them is double -----------------------------
def _two_sum(a, b):
    """a + b = s + e exactly (float32)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _two_product(a, b):
    """a * b = p + e exactly (float32, Dekker's splitting; XLA does not fuse it into FMAs on the CPU)."""
    def split(v):
        c = jnp.float32(4097.0) * v
        hi = c - (c - v)
        return hi, v - hi
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _qround(a, b=None):
    """Qt's qRound (floor(v + 0.5)) of the float32 a, or of the double a + b, exactly; int32."""
    s, e = (a, jnp.float32(0)) if b is None else _two_sum(a, b)
    fl = jnp.floor(s)
    frac = s - fl
    return fl.astype(jnp.int32) + ((frac > 0.5) | ((frac == 0.5) & (e >= 0))).astype(jnp.int32)


def _step(size, src):
    """Qt's 16.16 source step per pixel, int(65536 / (size / src)) (the exact quotient's integer part), float32."""
    num = jnp.float32(65536.0) * src.astype(jnp.float32)
    size = jnp.maximum(size, jnp.float32(2.0 ** -10))
    t = jnp.floor(num / size)
    p, e = _two_product(t + 1, size)
    up = (p < num) | ((p == num) & (e <= 0))
    p, e = _two_product(t, size)
    down = (p > num) | ((p == num) & (e > 0))
    return jnp.minimum(jnp.where(up, t + 1, jnp.where(down, t - 1, t)), jnp.float32(2.0 ** 30))


def _fixed(centre, start, step):
    """Qt's 16.16 source position of a pixel, ceil((centre - start) * step) - 1, exactly (Qt's double is exact here:
    a float32 difference times a 24-bit integer); int32."""
    d, de = _two_sum(centre, -start)
    p, e = _two_product(d, step)
    p = jnp.clip(p, -(2.0 ** 30), 2.0 ** 30)
    fl = jnp.floor(p)
    return fl.astype(jnp.int32) + jnp.ceil((p - fl) + (e + de * step)).astype(jnp.int32) - 1


def _tile_count(w, h, ratio):
    """tile_image's int(rect.width() / (rect.height() * tile_ratio)), at least 1: computed in double by procgen, so
    near an integer (a locked door is made exactly num_doors tiles wide, up to float noise) the float32 quotient is
    checked exactly: m tiles fit when (m * ratio) * h <= w (m * ratio is exact in float32)."""
    q = w / jnp.maximum(h * ratio, jnp.float32(1e-30))
    m = jnp.round(q)
    p, e = _two_product(m * ratio, h)
    fits = (p < w) | ((p == w) & (e <= 0))
    n = jnp.where(jnp.abs(q - m) < 1e-3, jnp.where(fits, m, m - 1), jnp.floor(q))
    return jnp.clip(n, 1, 4096)


def _axis(start, size, src):
    """One axis of an unrotated image drawn into [start, start + size) (float32 pixels, any leading shape): the first
    and last+1 pixels drawn (clipped to the frame), and the 16.16 source position at the first one and its step."""
    lo = jnp.maximum(_qround(start), 0)
    hi = jnp.minimum(_qround(start, size), RES)
    step = _step(size, src)
    return lo, hi, _fixed(lo.astype(jnp.float32) + jnp.float32(0.5), start, step), step.astype(jnp.int32)


def _blend(dst, src):
    """Qt's source-over of a premultiplied ARGB pixel onto an RGB32 one (uint32 0xAARRGGBB): src + dst * (255 - a)
    with Qt's BYTE_MUL rounding, two channels per multiply."""
    ia = jnp.uint32(255) - (src >> 24)
    rb = (dst & 0xFF00FF) * ia
    rb = ((rb + ((rb >> 8) & 0xFF00FF) + 0x800080) >> 8) & 0xFF00FF
    ag = ((dst >> 8) & 0xFF00FF) * ia
    ag = (ag + ((ag >> 8) & 0xFF00FF) + 0x800080) & jnp.uint32(0xFF00FF00)  # (a python int above 2^31: uint32)
    return src + (rb | ag)


def max_visible(main_width: int) -> tuple[int, int]:
    """How many slots `render` draws besides the agent: (tiled: barriers and locked doors, the rest). Barrier rows
    are at least 4 units apart, so a 20-unit view (hard) shows at most 6 rows of 2 barriers and a door (18), a
    10-unit view (easy, the paper's games) 3 rows (and easy has no doors); fruit, food, locks, presents and keys
    have no such bound: the test measures how many procgen's frames show (hard at most 32, easy 20) against 46/26."""
    return (18, 46) if main_width > 10 else (6, 26)


def _select(visible, k):
    """The indices of the first k True entries of `visible`, in order, and which of the k exist."""
    count = jnp.cumsum(visible.astype(jnp.int32))  # visible slots up to and including each slot
    want = jnp.arange(k, dtype=jnp.int32)
    index = (count[None, :] <= want[:, None]).sum(1, dtype=jnp.int32)  # slots before the (k+1)-th visible one
    return jnp.minimum(index, visible.shape[0] - 1), want < count[-1]


def _oob_table(images: FrameImages, v: _View) -> jax.Array:
    """The out-of-bounds rows' pixels over black: row s (0-15) where one cell row (source row s) covers a pixel row,
    16 + 16 a + b where two do (source rows a of the lower cell, b of the upper), then a black row. Per pixel column,
    procgen draws cell column x's rows bottom to top, then cell column x + 1's (the columns' overlaps)."""
    size = int(load_image(SPRITE_FILES[OUT_OF_BOUNDS_SPRITE]).shape[0])
    src = jnp.arange(size)[:, None] * images.width[OUT_OF_BOUNDS_SPRITE] + images.base[OUT_OF_BOUNDS_SPRITE]
    layers = [jnp.where(jnp.asarray(c >= 0), images.atlas[src + jnp.asarray(np.maximum(c, 0))], jnp.uint32(0))
              for c in v.oob_cols]  # [16, 64] each: the first and the second cell covering each column
    black = jnp.zeros((size, RES), jnp.uint32)
    one, two = black, jnp.zeros((size, size, RES), jnp.uint32)
    for layer in layers:
        one = _blend(one, layer)
        two = _blend(_blend(two, layer[:, None, :]), layer[None, :, :])
    return jnp.concatenate([one, two.reshape(size * size, RES), jnp.zeros((1, RES), jnp.uint32)])


def render(images: FrameImages, x, y, rx, ry, sprite, alive, background, main_width: int,
           main_height: int) -> jax.Array:
    """Fruitbot's 64x64x3 uint8 observation as procgen draws it (see the notes above), for one env (vmap it).

    x, y, rx, ry: float32 [N] entity centres and half extents (world units, y up); sprite: int32 [N] sprite ids;
    alive: bool [N]; background: int32 index into BACKGROUND_FILES; slot 0 is the agent (drawn last, rotated -90
    degrees, half-size AGENT_R), the others are drawn in slot order. main_width/main_height: the level's size
    (static ints). Drawn: the first max_visible(main_width) live barriers/doors in view, then the first ones of the
    rest, one image per pixel (the last slot covering it: where two overlap, which procgen's levels avoid but for a
    key flying over a locked door or a fruit, the lower one is not drawn under the upper one's transparent pixels)."""
    v = _view(main_width, main_height)
    num = x.shape[0]
    k_tiled, k_other = (min(k, num - 1) for k in max_visible(main_width))
    unit = jnp.float32(v.unit)
    pix_i = jnp.arange(RES, dtype=jnp.int32)
    pix = pix_i.astype(jnp.float32) + jnp.float32(0.5)  # pixel centres

    # camera: cy = agent.y + main_width / 2.0 - 2 agent.ry (double, stored as float); y_off as prepare_for_drawing
    cy = (y[0] + jnp.float32(main_width / 2.0)) - jnp.float32(2) * ry[0]
    y_off = unit * (cy - jnp.float32(v.half_view))

    # every slot's screen rect (get_object_rect): left, top, width, height in pixels
    left = (x - rx) * unit - jnp.float32(v.x_off)
    top = (jnp.float32(v.view_dim) - (y + ry)) * unit + y_off
    wid = (jnp.float32(2) * rx) * unit
    hei = (jnp.float32(2) * ry) * unit

    # ---- the background: black, the level rect's tiles, then the out-of-bounds cells' rows --------------------------
    bg_top = jnp.float32(v.bg_top0) + y_off
    tile_h = jnp.float32(v.bg_tile_h)
    tile = jnp.clip(jnp.ceil((pix - bg_top) / tile_h) - 1, 0, v.bg_tiles - 1)  # the tile at each pixel row
    t_top = bg_top + tile_h * tile
    tile = jnp.where(pix <= t_top, tile - 1, jnp.where(pix > t_top + tile_h, tile + 1, tile))
    t_top = bg_top + tile_h * tile
    bg_h = images.bg_height[background]
    lo, hi, fixed, step = _axis(t_top, tile_h, bg_h)
    bg_on = (tile >= 0) & (tile < v.bg_tiles) & (pix_i >= lo) & (pix_i < hi)
    bg_row = jnp.clip((fixed + (pix_i - lo) * step) >> 16, 0, bg_h - 1)

    # out-of-bounds cells: rows r < 0 or >= main_height within draw_foreground's low_y..high_y, each cell
    # get_screen_rect(x, r + 1, 1, 1, RENDER_EPS); a pixel row lies in at most two (they overlap by 2 eps)
    low_y = jnp.trunc(cy - jnp.float32(v.margin)).astype(jnp.int32)
    high_y = jnp.trunc(cy + jnp.float32(v.margin)).astype(jnp.int32)
    world = jnp.floor(jnp.float32(v.view_dim) - (pix - y_off) / unit).astype(jnp.int32)  # the cell row at a centre
    stone = images.height[OUT_OF_BOUNDS_SPRITE]
    cell_h = jnp.float32(v.cell_h)
    cells = []  # (drawn, source row) of cell rows world - 1, world, world + 1 at each pixel row
    for d in (-1, 0, 1):
        r = world + d
        c_top = ((jnp.float32(v.view_dim) - (r + 1).astype(jnp.float32)) - RENDER_EPS) * unit + y_off
        lo, hi, fixed, step = _axis(c_top, cell_h, stone)
        on = ((r < 0) | (r >= main_height)) & (r >= low_y) & (r <= high_y) & (pix_i >= lo) & (pix_i < hi)
        cells.append((on, jnp.clip((fixed + (pix_i - lo) * step) >> 16, 0, stone - 1)))
    (on0, s0), (on1, s1), (on2, s2) = cells
    lower_on, lower = on0 | on1 | on2, jnp.where(on0, s0, jnp.where(on1, s1, s2))  # drawn first
    upper_on, upper = (on0 & on1) | (on1 & on2), jnp.where(on0, s1, s2)  # then the cell above (cells do not skip)
    code = jnp.where(upper_on, 16 + 16 * lower + upper, jnp.where(lower_on, lower, 16 + 256))
    canvas = jnp.where(bg_on[:, None], images.backgrounds[background, bg_row], _oob_table(images, v)[code])
    # a pixel row both in the level rect and in a cell (one at most at each end of the level): the cells' tiles
    # drawn over the background's row
    special = bg_on & lower_on
    stone_at = lambda rows, cols: images.atlas[images.base[OUT_OF_BOUNDS_SPRITE] + rows[:, None] * images.width[
        OUT_OF_BOUNDS_SPRITE] + jnp.asarray(np.maximum(cols, 0))[None, :]]
    for end in (jnp.argmax(special), RES - 1 - jnp.argmax(special[::-1])):
        row = images.backgrounds[background, bg_row[end]][None]
        for c in v.oob_cols:
            if (c >= 0).any():
                keep = jnp.asarray(c >= 0)[None, :]
                row = jnp.where(keep & lower_on[end], _blend(row, stone_at(lower[end][None], c)), row)
                row = jnp.where(keep & upper_on[end], _blend(row, stone_at(upper[end][None], c)), row)
        canvas = jnp.where(((pix_i == end) & special)[:, None], row, canvas)

    # ---- entities: the first visible barriers/doors (tiled), then the first others, in slot order ------------------
    slot = jnp.arange(num, dtype=jnp.int32)
    tiled = (sprite == BARRIER_SPRITE) | (sprite == DOOR_SPRITE)
    visible = alive & (slot > 0) & (top < RES - 0.5) & (top + hei >= 0.5)
    sel_t, on_t = _select(visible & tiled, k_tiled)
    sel_o, on_o = _select(visible & ~tiled, k_other)
    sel, on = jnp.concatenate([sel_t, sel_o]), jnp.concatenate([on_t, on_o])
    s_left, s_top, s_w, s_h, s_spr = left[sel], top[sel], wid[sel], hei[sel], sprite[sel]
    s_base, s_sw, s_sh = images.base[s_spr], images.width[s_spr], images.height[s_spr]

    # rows (every slot): coverage and the atlas offset of the source row
    r_lo, r_hi, r_fixed, r_step = _axis(s_top, s_h, s_sh)
    row_on = on[:, None] & (pix_i[None] >= r_lo[:, None]) & (pix_i[None] < r_hi[:, None])
    src_row = jnp.clip((r_fixed[:, None] + (pix_i[None] - r_lo[:, None]) * r_step[:, None]) >> 16, 0,
                       s_sh[:, None] - 1)
    row_tab = jnp.where(row_on, s_base[:, None] + src_row * s_sw[:, None], 0)
    # columns of the untiled slots: one image
    o_left, o_w, o_sw = s_left[k_tiled:], s_w[k_tiled:], s_sw[k_tiled:]
    c_lo, c_hi, c_fixed, c_step = _axis(o_left, o_w, o_sw)
    col_on_o = (pix_i[None] >= c_lo[:, None]) & (pix_i[None] < c_hi[:, None])
    col_o = jnp.clip((c_fixed[:, None] + (pix_i[None] - c_lo[:, None]) * c_step[:, None]) >> 16, 0,
                     o_sw[:, None] - 1)
    # columns of the tiled slots: tile_image's tiles of width w / n side by side, each the whole image
    t_left, t_w, t_h, t_sw = s_left[:k_tiled], s_w[:k_tiled], s_h[:k_tiled], s_sw[:k_tiled]
    ratio = jnp.asarray(TILE_ASPECT)[s_spr[:k_tiled]]
    tiles = _tile_count(t_w, t_h, ratio)
    tw = t_w / tiles
    c = pix[None]
    j = jnp.clip(jnp.ceil((c - t_left[:, None]) / tw[:, None]) - 1, 0, tiles[:, None] - 1)
    j_left = t_left[:, None] + tw[:, None] * j
    j = jnp.where(c <= j_left, j - 1, jnp.where(c > j_left + tw[:, None], j + 1, j))
    j_left = t_left[:, None] + tw[:, None] * j
    col_on_t = (j >= 0) & (j < tiles[:, None]) & (c > j_left) & (c <= j_left + tw[:, None])
    step_t = _step(tw, t_sw)[:, None]
    col_t = jnp.clip(jnp.ceil((c - j_left) * step_t).astype(jnp.int32) - 1 >> 16, 0, t_sw[:, None] - 1)
    col_on = jnp.concatenate([col_on_t, col_on_o])
    col_tab = jnp.concatenate([col_t, col_o])

    # per pixel: the last selected slot covering it, from bit masks (bit k: selected slot k, in draw order)
    k_all = k_tiled + k_other
    words = (k_all + 31) // 32
    pad = words * 32 - k_all
    bits = jnp.uint32(1) << jnp.arange(32, dtype=jnp.uint32)[None, :, None]
    def mask(cover):
        cover = jnp.pad(cover, ((0, pad), (0, 0))).reshape(words, 32, RES).astype(jnp.uint32)
        return (cover * bits).sum(1, dtype=jnp.uint32)  # [words, 64]
    row_mask, col_mask = mask(row_on), mask(col_on)
    owner = jnp.full((RES, RES), k_all, jnp.int32)  # k_all: nothing
    for w in range(words):
        m = row_mask[w][:, None] & col_mask[w][None, :]
        owner = jnp.where(m != 0, 32 * w + 31 - jax.lax.clz(m).astype(jnp.int32), owner)
    row_tab = jnp.concatenate([row_tab, jnp.zeros((1, RES), jnp.int32)])
    col_tab = jnp.concatenate([col_tab, jnp.zeros((1, RES), jnp.int32)])
    index = row_tab[owner, pix_i[:, None]] + col_tab[owner, pix_i[None, :]]
    canvas = _blend(canvas, images.atlas[index])

    # ---- the agent, last, rotated -90 degrees about its rect's centre (Qt's transformed drawing samples pixel
    # centres): its source column follows the pixel row, its source row the pixel column; rows in a fixed band
    band_lo, band_hi = agent_band(main_width)
    rows = pix[band_lo:band_hi]
    aw, ah = images.width[PLAYER_SPRITE], images.height[PLAYER_SPRITE]
    a_w, a_h = wid[0], hei[0]
    ucoord = (a_w / 2 - (rows - (top[0] + a_h / 2))) * (aw.astype(jnp.float32) / a_w)
    vcoord = ((pix - (left[0] + a_w / 2)) + a_h / 2) * (ah.astype(jnp.float32) / a_h)
    a_on = alive[0] & (ucoord >= 0)[:, None] & (ucoord < aw)[:, None] & (vcoord >= 0)[None] & (vcoord < ah)[None]
    a_index = (images.base[PLAYER_SPRITE] + jnp.clip(jnp.floor(ucoord).astype(jnp.int32), 0, aw - 1)[:, None]
               + jnp.clip(jnp.floor(vcoord).astype(jnp.int32), 0, ah - 1)[None] * aw)
    band = canvas[band_lo:band_hi]
    band = _blend(band, jnp.where(a_on, images.atlas[a_index], jnp.uint32(0)))
    canvas = jnp.concatenate([canvas[:band_lo], band, canvas[band_hi:]])
    return jnp.stack([(canvas >> 16) & 0xFF, (canvas >> 8) & 0xFF, canvas & 0xFF], -1).astype(jnp.uint8)
