"""Fruitbot's 64x64 frame, drawn inside the jitted program from procgen's own images.

The sprites and backgrounds are procgen's (MIT licence), read at start-up from the copies taken once from stock procgen's
own environment (`python -m common.envs.procgen_env setup`; not committed). Sprite ids index `SPRITE_FILES`
(common/envs/fruitbot_images.py); `common.envs.fruitbot_jax` stores one sprite id per entity.
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from common.envs import procgen_env
from common.envs.fruitbot_images import (BACKGROUND_FILES, BARRIER_SPRITE, DOOR_SPRITE, FOOD, FRUIT,  # noqa: F401
                                         KEY_SPRITE, LOCK_SPRITE, NUM_SPRITES, PLAYER_SPRITE, PRESENT, SPRITE_FILES)


def asset_dir() -> str:
    """The folder of procgen's images (copied once from stock procgen's own environment: common/envs/procgen_env.py)."""
    return str(procgen_env.image_dir(SPRITE_FILES + BACKGROUND_FILES))


@functools.lru_cache(maxsize=None)
def load_image(name: str) -> np.ndarray:
    """One of procgen's images as an RGBA uint8 array [height, width, 4]."""
    from PIL import Image

    return np.asarray(Image.open(os.path.join(asset_dir(), name)).convert("RGBA"))


@functools.lru_cache(maxsize=None)
def sprite_aspect_ratios() -> np.ndarray:
    """width / height of every sprite, as float32 like procgen's asset_aspect_ratios (fit_aspect_ratio uses it)."""
    return np.array([load_image(name).shape[1] / load_image(name).shape[0] for name in SPRITE_FILES], np.float32)


# ---------------------------------------------------------------------------------------------------------------------
# The frame, drawn as procgen's Qt painter draws it
# ---------------------------------------------------------------------------------------------------------------------
# How procgen draws a Fruitbot frame (basic-abstract-game.cpp, fruitbot.cpp, game.cpp; Qt 5.9's raster engine with
# neither antialiasing nor smooth pixmap transform, so every image is sampled nearest-neighbour into a float rect):
#   1. black, then the background image tiled vertically over the level rect (bg_tile_ratio -1: tiles as wide as the
#      level, exactly 64 px square at these widths);
#   2. the grid cells in view: fruitbot's grid is all space, but cells outside the level answer OUT_OF_BOUNDS_WALL,
#      drawn with the barrier's image (tileStone_slope) in rects widened by RENDER_EPS: rows of stone tiles below the
#      level's bottom edge and above its top edge (the top of the view at the end of a level);
#   3. the entities of render_z 0 in list order, barriers tiled horizontally (tile aspect 1), locked doors too
#      (aspect 3.25), then the agent (render_z 1), rotated by -90 degrees about its rect's centre.
# The view: unit = 64 / main_width px, cx = main_width / 2, cy = agent.y + main_width / 2 - 2 agent.ry, all in
# procgen's float32 (get_screen_rect). An unrotated image drawn into a float rect (left, top, w, h) covers the pixel
# columns [qRound(left), qRound(left + w)) (round half up, in double: the columns whose centre lies in
# (left, left + w]), and column X samples source column (ceil((X + 0.5 - left) * ix) - 1) >> 16 with the 16.16 step
# ix = int(65536 / (w / src_width)); rows likewise (Qt's qt_scale_image_32bit). The rotated agent goes through
# Qt's transformed-image path: a pixel is drawn where its centre, rotated back into the rect, falls inside, from the
# source pixel at the floor of that position. Sprites are premultiplied ARGB (ARGB32_Premultiplied, qPremultiply's
# rounding), blended source-over with Qt's BYTE_MUL: dst = src + (t + (t >> 8) + 128) >> 8, t = dst * (255 - alpha).
# Matched pixel for pixel against procgen's observations (tests/test_fruitbot_frame.py), with procgen's float32
# rect arithmetic emulated exactly (XLA's own fused multiply-adds kept out) and Qt's double arithmetic made exact
# with error-free sums and products.
#
# Speed (XLA on the CPU): per pixel only bit operations and three gathers. The first live slots in view are
# selected (max_visible: barriers/doors and the rest apart, in slot order); each gets a row table and a column table
# (64 entries: atlas offset of the source row/column, Qt's mapping done once per slot and row or column); coverage
# bit masks per pixel row and column give each pixel its owner, the last selected slot covering it (AND, count
# leading zeros); the pixel is atlas[row_table[owner, y] + column_table[owner, x]]. Backgrounds are pre-scaled to
# the 64 px width and out-of-bounds rows precomposed (FrameImages.rows: one gathered row per pixel row); the agent
# is drawn in its fixed band of rows. vmap runs one batched program (custom_vmap), in three parts XLA keeps apart
# (_stage): geometry, gathers, blending.

RENDER_EPS = np.float32(0.02)
OUT_OF_BOUNDS_SPRITE = BARRIER_SPRITE  # fruitbot's OUT_OF_BOUNDS_WALL uses the barrier's image
TILE_ASPECT = np.zeros(NUM_SPRITES, np.float32)  # fruitbot.cpp get_tile_aspect_ratio: 0 = not tiled
TILE_ASPECT[BARRIER_SPRITE], TILE_ASPECT[DOOR_SPRITE] = 1.0, 3.25
AGENT_R = np.float32(0.4)  # procgen's agent half-size (basic-abstract-game.cpp a_r): fixes the agent's pixel rows
RES = 64
BG_ROWS = 512  # rows per background in FrameImages.rows (the tallest background)
MAIN_WIDTHS = (10, 20)  # the level widths frame_images prepares (easy and the paper's games, hard)
OOB_CODES = 16 + 16 * 16 + 1  # out-of-bounds rows: one cell's source row, two cells' source rows, none


def _pack(rgba: np.ndarray) -> np.ndarray:
    """uint8 [..., 4] RGBA -> uint32 ARGB premultiplied as Qt's qPremultiply rounds it."""
    c = rgba[..., :3].astype(np.uint32)
    a = rgba[..., 3:].astype(np.uint32)
    t = c * a
    p = (t + (t >> 8) + 0x80) >> 8
    return (a[..., 0] << 24) | (p[..., 0] << 16) | (p[..., 1] << 8) | p[..., 2]


def _blend(dst, src):
    """Qt's source-over of premultiplied ARGB pixels onto RGB32 ones (uint32 0xAARRGGBB, numpy or jax): src +
    BYTE_MUL(dst, 255 - alpha), two channels per multiply. A transparent src (0) leaves dst's colour as it is."""
    ia = np.uint32(255) - (src >> 24)
    rb = (dst & np.uint32(0xFF00FF)) * ia
    rb = ((rb + ((rb >> 8) & np.uint32(0xFF00FF)) + np.uint32(0x800080)) >> 8) & np.uint32(0xFF00FF)
    ag = ((dst >> 8) & np.uint32(0xFF00FF)) * ia
    ag = (ag + ((ag >> 8) & np.uint32(0xFF00FF)) + np.uint32(0x800080)) & np.uint32(0xFF00FF00)
    return src + (rb | ag)


def _qround_np(v):
    """Qt's qRound: round half up (floor(v + 0.5)), in numpy float64."""
    return int(np.floor(np.float64(v) + 0.5))


def _scale_indices(left: float, width: float, src: int, n: int = RES):
    """Qt's nearest-neighbour mapping (float64, as Qt computes it): the source index of each of n pixels, -1 outside."""
    ix = int(65536 / (width / src))
    lo, hi = max(_qround_np(left), 0), min(_qround_np(left + width), n)
    out = np.full(n, -1, np.int64)
    for p in range(lo, hi):
        out[p] = min(max((math.ceil((p + 0.5 - left) * ix) - 1) >> 16, 0), src - 1)
    return out


# -- the camera (BasicAbstractGame::prepare_for_drawing with FruitBotGame::choose_center), in procgen's float math --
f32 = np.float32


class _View(NamedTuple):
    """What depends only on the level's size (static): procgen's float32 camera constants and the fixed mappings."""
    unit: np.float32  # pixels per world unit
    view_dim: np.float32
    x_off: np.float32
    half_view: np.float32
    center_x: np.float32  # main_width / 2.0 as procgen's float
    margin: np.float32  # draw_foreground's visibility / 2.0 + 1
    bg_top0: np.float32  # view_dim - main_height: the level rect's top (times unit, plus y_off)
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
    return _View(unit, view_dim, x_off, half_view, center_x, margin, f32(view_dim - f32(main_height)),
                 tile_h, tiles, cell_w, cols)


def agent_band(main_width: int) -> tuple[int, int]:
    """The pixel rows the agent can cover: fixed, as the camera follows it (its top is (main_width - 1.2) units
    down the view), with a row of margin each side."""
    unit = float(_view(main_width, 60).unit)
    top = unit * (main_width - 3 * float(AGENT_R))
    return max(int(np.floor(top)) - 1, 0), min(int(np.ceil(top + 2 * float(AGENT_R) * unit)) + 1, RES)


def _out_of_bounds_rows(stone: np.ndarray, main_width: int) -> np.ndarray:
    """uint32 [OOB_CODES, 64]: the out-of-bounds rows over black. Code s < 16: one cell row covers the pixel row,
    sampled at its source row s; 16 + 16 a + b: two do (the lower at source row a, the upper at b); last: none.
    Per pixel column procgen draws cell column x's rows bottom to top, then cell column x + 1's (columns overlap)."""
    size = stone.shape[0]
    one, two = np.zeros((size, RES), np.uint32), np.zeros((size, size, RES), np.uint32)
    for cols in _view(main_width, 60).oob_cols:  # the first, then the second cell covering each pixel column
        layer = np.where(cols >= 0, stone[:, np.maximum(cols, 0)], np.uint32(0))  # [16, 64]
        one = _blend(one, layer)
        two = _blend(_blend(two, layer[:, None, :]), layer[None, :, :])
    return np.concatenate([one, two.reshape(size * size, RES), np.zeros((1, RES), np.uint32)])


class FrameImages(NamedTuple):
    """Everything `render` reads, built once by `frame_images()` from procgen's images."""
    atlas: jax.Array  # uint32 [A]: every sprite's premultiplied ARGB pixels row by row; atlas[0] is transparent
    base: jax.Array  # int32 [NUM_SPRITES]: where each sprite starts in the atlas
    width: jax.Array  # int32 [NUM_SPRITES]
    height: jax.Array  # int32 [NUM_SPRITES]
    rows: jax.Array  # uint32 [R, 64]: 64-px rows: each background's (BG_ROWS apart, scaled to the level's 64 px
    # width), then for each of MAIN_WIDTHS the out-of-bounds rows (_out_of_bounds_rows)
    bg_height: jax.Array  # int32 [len(BACKGROUND_FILES)]: rows of each background image


@functools.lru_cache(maxsize=None)
def _frame_images_np():
    sprites = [_pack(load_image(name)) for name in SPRITE_FILES]
    base = np.cumsum([1] + [s.size for s in sprites[:-1]])  # atlas[0]: a transparent texel for "nothing here"
    atlas = np.concatenate([np.zeros(1, np.uint32)] + [s.ravel() for s in sprites])
    backgrounds = np.zeros((len(BACKGROUND_FILES), BG_ROWS, RES), np.uint32)
    for b, name in enumerate(BACKGROUND_FILES):
        img = load_image(name)
        # the level rect is exactly 64 px wide at x = 0 (checked by _view): its column mapping is fixed
        rgb = img[:, _scale_indices(0.0, float(RES), img.shape[1]), :3].astype(np.uint32)
        backgrounds[b, : img.shape[0]] = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    rows = [backgrounds.reshape(-1, RES)] + [_out_of_bounds_rows(sprites[OUT_OF_BOUNDS_SPRITE], w)
                                             for w in MAIN_WIDTHS]
    return FrameImages(atlas, base.astype(np.int32), np.array([s.shape[1] for s in sprites], np.int32),
                       np.array([s.shape[0] for s in sprites], np.int32), np.concatenate(rows),
                       np.array([load_image(name).shape[0] for name in BACKGROUND_FILES], np.int32))


def frame_images() -> FrameImages:
    """The images `render` draws from (procgen's package images, premultiplied and pre-scaled), as device arrays
    (about 1.5 MB)."""
    return FrameImages(*(jnp.asarray(a) for a in _frame_images_np()))


def _oob_offset(main_width: int) -> int:
    if main_width not in MAIN_WIDTHS:
        raise NotImplementedError(f"render: main_width {main_width} is not one of MAIN_WIDTHS {MAIN_WIDTHS} that "
                                  f"frame_images prepares out-of-bounds rows for")
    return len(BACKGROUND_FILES) * BG_ROWS + MAIN_WIDTHS.index(main_width) * OOB_CODES


# ---------------------------------------------------------------------------------------------------------------------
# The renderer (jax)
# ---------------------------------------------------------------------------------------------------------------------
# -- exact float helpers: procgen's rects are float32, Qt's arithmetic on them is double -----------------------------
def _two_sum(a, b):
    """a + b = s + e exactly (float32)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _two_product(a, b):
    """a * b = p + e exactly (float32, Dekker's splitting; still exact where XLA's CPU compiler contracts its
    products and sums into fused multiply-adds, as it does: checked on random pairs)."""
    def split(v):
        c = jnp.float32(4097.0) * v
        hi = c - (c - v)
        return hi, v - hi
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _rounded(p):
    """The product p, rounded to float32 before any sum uses it, as procgen's C++ rounds it. XLA's CPU compiler
    contracts a product and a sum into one fused multiply-add (one rounding), where the fusion it lands in allows
    (so differently for different batch sizes): a rect one float32 ulp off flips a source row in about one frame in
    300. The select keeps the product apart (a NaN becomes 0)."""
    return jnp.where(jnp.isnan(p), jnp.float32(0), p)


def _mul_add(a, b, c):
    """a * b + c with the product rounded first (get_screen_rect's (v - eps) * unit + y_off)."""
    return _rounded(a * b) + c


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
    """One axis of an unrotated image drawn into [start, start + size) (float32 pixels, any shape): the first and
    last+1 pixels drawn (clipped to the frame), the 16.16 source position at the first one and the step."""
    lo = jnp.maximum(_qround(start), 0)
    hi = jnp.minimum(_qround(start, size), RES)
    step = _step(size, src)
    return lo, hi, _fixed(lo.astype(jnp.float32) + jnp.float32(0.5), start, step), step.astype(jnp.int32)


def _materialize(x):
    """x, computed once into memory (within a _stage): XLA's CPU compiler fuses elementwise producers into all their
    consumers, so small per-slot or per-row results would be recomputed for every pixel that uses them. A reduction
    is a fusion root that consumers read from memory; this one (x + 0 over a stacked axis of two) costs one pass over
    x. (A gather consumer can still absorb it: see _stage. lax.optimization_barrier is dropped on the CPU.)"""
    if x.dtype == jnp.bool_:
        return _materialize(x.astype(jnp.uint8)).astype(bool)
    return jnp.stack([x, jnp.zeros_like(x)]).sum(0, dtype=x.dtype)


def _materialize_all(*xs):
    return tuple(_materialize(x) for x in xs)


def _stage(pred, fn, *args):
    """fn(*args) as a separate part of the program, its arguments and results in memory: XLA's CPU compiler fuses
    elementwise producers, and even reductions, into the gathers that read them (recomputing, unvectorised, what
    each gathered element needs), but never across a conditional. `pred` is always true (XLA cannot know it)."""
    shapes = jax.eval_shape(fn, *args)
    return jax.lax.cond(pred, fn, lambda *_: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes), *args)


def max_visible(main_width: int) -> tuple[int, int]:
    """How many slots `render` draws besides the agent: (tiled: barriers and locked doors, the rest). Barrier rows
    are at least 4 units apart, so a 20-unit view (hard) shows at most 6 rows of 2 barriers and a door (18), a
    10-unit view (easy, the paper's games) 3 rows (and easy has no doors); fruit, food, locks, presents and keys
    have no such bound: the test counts how many procgen's frames show (see tests/test_fruitbot_frame.py)."""
    return (18, 45) if main_width > 10 else (6, 25)  # with the "nothing" row, tables of 64 and 32 rows


def count_visible(y, ry, sprite, alive, main_width: int) -> tuple[jax.Array, jax.Array]:
    """How many slots besides the agent (slot 0) are in view, (barriers and doors, the rest), for one env ([N]
    arrays) or a batch ([..., N]): render draws at most max_visible(main_width) of each (check a game's levels
    against it)."""
    unit = jnp.float32(_view(main_width, 60).unit)
    y, ry = jnp.asarray(y, jnp.float32), jnp.asarray(ry, jnp.float32)
    cy = y[..., :1] + jnp.float32(main_width / 2.0) - jnp.float32(2) * ry[..., :1]
    top = (jnp.float32(main_width) - (y + ry)) * unit + unit * (cy - jnp.float32(main_width / 2.0))
    visible = jnp.asarray(alive) & (top < RES - 0.5) & (top + 2 * ry * unit >= 0.5)
    visible = visible.at[..., 0].set(False)
    tiled = (jnp.asarray(sprite) == BARRIER_SPRITE) | (jnp.asarray(sprite) == DOOR_SPRITE)
    return (visible & tiled).sum(-1), (visible & ~tiled).sum(-1)


def _select(visible, k):
    """[B, k]: the indices of the first k True entries of each row of `visible` [B, N], in order, and which exist."""
    batch, num = visible.shape
    rank = jnp.cumsum(visible.astype(jnp.int32), axis=1) - 1
    where = jnp.where(visible & (rank < k), rank, k)  # k: dropped
    rows = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, num))
    slots = jnp.broadcast_to(jnp.arange(num, dtype=jnp.int32)[None], (batch, num))
    index = jnp.zeros((batch, k + 1), jnp.int32).at[rows, where].set(slots, mode="drop")[:, :k]
    return index, jnp.arange(k)[None] < visible.sum(1, dtype=jnp.int32)[:, None]


def _geometry(images: FrameImages, x, y, rx, ry, sprite, alive, background, main_width: int, main_height: int):
    """Where every pixel's colour comes from (all but the pixels themselves; vectorised arithmetic): the row of
    FrameImages.rows each pixel row starts from, the rows where the level's edge meets an out-of-bounds row (where
    and their pixels), the row and column tables [B, K + 1, 64] of the selected slots (the atlas offsets of the
    source row drawn in each pixel row, and of the source column in each pixel column), each pixel's owner (the
    last selected slot covering it, K: none) and the agent's atlas indices in its band of rows."""
    v = _view(main_width, main_height)
    batch, num = x.shape
    k_tiled, k_other = (min(k, num - 1) for k in max_visible(main_width))
    unit = jnp.float32(v.unit)
    pix_i = jnp.arange(RES, dtype=jnp.int32)
    pix = pix_i.astype(jnp.float32) + jnp.float32(0.5)  # pixel centres
    b_idx = jnp.arange(batch, dtype=jnp.int32)

    # camera: cy = agent.y + main_width / 2.0 - 2 agent.ry (double, stored as float); y_off as prepare_for_drawing
    s1, e1 = _two_sum(y[:, 0], jnp.float32(main_width / 2.0))
    s2, e2 = _two_sum(s1, -(jnp.float32(2) * ry[:, 0]))
    cy = s2 + (e1 + e2)  # the double sum rounded once (to float32)
    y_off = _rounded(unit * (cy - jnp.float32(v.half_view)))[:, None]  # [B, 1]

    # every slot's screen rect (get_object_rect): left, top, width, height in pixels
    left = _mul_add(x - rx, unit, -jnp.float32(v.x_off))
    top = _mul_add(jnp.float32(v.view_dim) - (y + ry), unit, y_off)
    wid = _rounded((jnp.float32(2) * rx) * unit)
    hei = _rounded((jnp.float32(2) * ry) * unit)

    # ---- the background: black, the level rect's tiles, then the out-of-bounds cells' rows: per pixel row ---------
    bg_top = _mul_add(jnp.float32(v.bg_top0), unit, y_off)
    tile_h = jnp.float32(v.bg_tile_h)
    tile = jnp.clip(jnp.ceil((pix - bg_top) / tile_h) - 1, 0, v.bg_tiles - 1)  # the tile at each pixel row [B, 64]
    t_top = bg_top + tile_h * tile
    tile = jnp.where(pix <= t_top, tile - 1, jnp.where(pix > t_top + tile_h, tile + 1, tile))
    t_top = bg_top + tile_h * tile
    bg_h = images.bg_height[background][:, None]
    lo, hi, fixed, step = _axis(t_top, tile_h, bg_h)
    bg_on = (tile >= 0) & (tile < v.bg_tiles) & (pix_i >= lo) & (pix_i < hi)
    bg_row = background[:, None] * BG_ROWS + jnp.clip((fixed + (pix_i - lo) * step) >> 16, 0, bg_h - 1)

    # out-of-bounds cells: rows r < 0 or >= main_height within draw_foreground's low_y..high_y, each cell
    # get_screen_rect(x, r + 1, 1, 1, RENDER_EPS); a pixel row lies in at most two (they overlap by 2 eps)
    low_y = jnp.trunc(cy - jnp.float32(v.margin)).astype(jnp.int32)[:, None]
    high_y = jnp.trunc(cy + jnp.float32(v.margin)).astype(jnp.int32)[:, None]
    world = jnp.floor(jnp.float32(v.view_dim) - (pix - y_off) / unit).astype(jnp.int32)  # the cell row at a centre
    stone = images.height[OUT_OF_BOUNDS_SPRITE]
    cells = []  # (drawn, source row) of cell rows world - 1, world, world + 1 at each pixel row
    for d in (-1, 0, 1):
        r = world + d
        c_top = _mul_add((jnp.float32(v.view_dim) - (r + 1).astype(jnp.float32)) - RENDER_EPS, unit, y_off)
        lo, hi, fixed, step = _axis(c_top, jnp.float32(v.cell_h), stone)
        on = ((r < 0) | (r >= main_height)) & (r >= low_y) & (r <= high_y) & (pix_i >= lo) & (pix_i < hi)
        cells.append((on, jnp.clip((fixed + (pix_i - lo) * step) >> 16, 0, stone - 1)))
    (on0, s0), (on1, s1), (on2, s2) = cells
    lower_on, lower = on0 | on1 | on2, jnp.where(on0, s0, jnp.where(on1, s1, s2))  # drawn first
    upper_on, upper = (on0 & on1) | (on1 & on2), jnp.where(on0, s1, s2)  # then the cell above (cells do not skip)
    code = jnp.where(upper_on, 16 + 16 * lower + upper, jnp.where(lower_on, lower, OOB_CODES - 1))
    row_index = jnp.where(bg_on, bg_row, _oob_offset(main_width) + code)
    # a pixel row both in the level rect and in a cell (at most one at each end of the level): the cells' tiles drawn
    # over the background's row
    special = bg_on & lower_on
    stone_px = images.atlas[images.base[OUT_OF_BOUNDS_SPRITE] + jnp.arange(16)[:, None] * images.width[
        OUT_OF_BOUNDS_SPRITE] + jnp.asarray(np.maximum(v.oob_cols, 0))[:, None, :]]  # [2, 16, 64]
    special_at, special_rows = [], []
    for end in (jnp.argmax(special, 1), RES - 1 - jnp.argmax(special[:, ::-1], 1)):
        at = lambda a: a[b_idx, end][:, None]
        row = images.rows[at(bg_row)[:, 0]]  # [B, 64]
        for c, cols in enumerate(v.oob_cols):
            if (cols >= 0).any():
                keep = jnp.asarray(cols >= 0)[None, :]
                row = jnp.where(keep & at(lower_on), _blend(row, stone_px[c][at(lower)[:, 0]]), row)
                row = jnp.where(keep & at(upper_on), _blend(row, stone_px[c][at(upper)[:, 0]]), row)
        special_at.append(jnp.where(at(special)[:, 0], end, -1))
        special_rows.append(row)

    # ---- entities: the first visible barriers/doors (tiled), then the first others, in slot order ------------------
    slot = jnp.arange(num, dtype=jnp.int32)
    tiled = (sprite == BARRIER_SPRITE) | (sprite == DOOR_SPRITE)
    visible = alive & (slot > 0) & (top < RES - 0.5) & (top + hei >= 0.5)
    sel_t, on_t = _select(visible & tiled, k_tiled)
    sel_o, on_o = _select(visible & ~tiled, k_other)
    sel, on = jnp.concatenate([sel_t, sel_o], 1), jnp.concatenate([on_t, on_o], 1)  # [B, K]
    pick = lambda a: jnp.take_along_axis(a, sel, 1)
    s_left, s_top, s_w, s_h, s_spr = pick(left), pick(top), pick(wid), pick(hei), pick(sprite)
    s_base, s_sw, s_sh = images.base[s_spr], images.width[s_spr], images.height[s_spr]
    e = lambda a: a[..., None]  # [B, K] -> [B, K, 1] against pixels

    # rows (every slot): coverage and the atlas offset of the source row
    r_lo, r_hi, r_fixed, r_step = _materialize_all(*_axis(s_top, s_h, s_sh))
    s_base, s_sw, s_sh, on = _materialize_all(s_base, s_sw, s_sh, on)
    row_on = e(on) & (pix_i >= e(r_lo)) & (pix_i < e(r_hi))  # [B, K, 64]
    src_row = jnp.clip((e(r_fixed) + (pix_i - e(r_lo)) * e(r_step)) >> 16, 0, e(s_sh) - 1)
    row_tab = jnp.where(row_on, e(s_base) + src_row * e(s_sw), 0)
    # columns of the untiled slots: one image
    o_sw = s_sw[:, k_tiled:]
    c_lo, c_hi, c_fixed, c_step = _materialize_all(*_axis(s_left[:, k_tiled:], s_w[:, k_tiled:], o_sw))
    col_on_o = (pix_i >= e(c_lo)) & (pix_i < e(c_hi))
    col_o = jnp.clip((e(c_fixed) + (pix_i - e(c_lo)) * e(c_step)) >> 16, 0, e(o_sw) - 1)
    # columns of the tiled slots: tile_image's tiles of width w / n side by side, each the whole image
    t_left, t_sw = s_left[:, :k_tiled], s_sw[:, :k_tiled]
    tiles = _tile_count(s_w[:, :k_tiled], s_h[:, :k_tiled], jnp.asarray(TILE_ASPECT)[s_spr[:, :k_tiled]])
    tw = s_w[:, :k_tiled] / tiles
    t_left, tw, tiles, t_step = _materialize_all(t_left, tw, tiles, _step(tw, t_sw))
    j = jnp.clip(jnp.ceil((pix - e(t_left)) / e(tw)) - 1, 0, e(tiles) - 1)  # the tile at each pixel column
    j_left = e(t_left) + _rounded(e(tw) * j)  # tile j's left: rect.x() + tile_width * j (a float product)
    j = jnp.where(pix <= j_left, j - 1, jnp.where(pix > j_left + e(tw), j + 1, j))
    j_left = e(t_left) + _rounded(e(tw) * j)
    col_on_t = (j >= 0) & (j < e(tiles)) & (pix > j_left) & (pix <= j_left + e(tw))
    col_t = jnp.clip(jnp.ceil((pix - j_left) * e(t_step)).astype(jnp.int32) - 1 >> 16, 0, e(t_sw) - 1)
    col_on_t, col_t, col_on_o, col_o = _materialize_all(col_on_t, col_t, col_on_o, col_o)
    col_on = jnp.concatenate([col_on_t, col_on_o], 1)
    col_tab = jnp.concatenate([col_t, col_o], 1)

    # per pixel: the last selected slot covering it, from bit masks (bit k: selected slot k, in draw order)
    k_all = k_tiled + k_other
    words = (k_all + 31) // 32

    def mask(cover):  # [B, K, 64] -> [words] x [B, 64]
        cover = cover.astype(jnp.uint32)
        return [functools.reduce(jnp.bitwise_or, [cover[:, k] << (k - 32 * w) for k in range(32 * w, min(
            32 * w + 32, k_all))]) for w in range(words)]
    row_mask, col_mask = _materialize_all(*mask(row_on)), _materialize_all(*mask(col_on))
    owner = jnp.full((batch, RES, RES), k_all, jnp.int32)  # k_all: nothing (the tables' extra row: atlas[0])
    for w in range(words):
        m = row_mask[w][:, :, None] & col_mask[w][:, None, :]
        owner = jnp.where(m != 0, 32 * w + 31 - jax.lax.clz(m).astype(jnp.int32), owner)
    row_tab = jnp.pad(row_tab, ((0, 0), (0, 1), (0, 0)))  # [B, k_all + 1, 64]: flattened by the caller (here the
    col_tab = jnp.pad(col_tab, ((0, 0), (0, 1), (0, 0)))  # flat layout would cost a division per element)

    # ---- the agent, last, rotated -90 degrees about its rect's centre (Qt's transformed drawing samples pixel
    # centres): its source column follows the pixel row, its source row the pixel column; rows in a fixed band
    band_lo, band_hi = agent_band(main_width)
    rows = pix[band_lo:band_hi]
    aw, ah = images.width[PLAYER_SPRITE], images.height[PLAYER_SPRITE]
    a_w, a_h, a_top, a_left = wid[:, :1], hei[:, :1], top[:, :1], left[:, :1]
    ucoord = (a_w / 2 - (rows - (a_top + a_h / 2))) * (aw.astype(jnp.float32) / a_w)  # [B, band]
    vcoord = ((pix - (a_left + a_w / 2)) + a_h / 2) * (ah.astype(jnp.float32) / a_h)  # [B, 64]
    u_on, v_on = alive[:, :1] & (ucoord >= 0) & (ucoord < aw), (vcoord >= 0) & (vcoord < ah)
    u = images.base[PLAYER_SPRITE] + jnp.clip(jnp.floor(ucoord).astype(jnp.int32), 0, aw - 1)
    v_col = jnp.clip(jnp.floor(vcoord).astype(jnp.int32), 0, ah - 1) * aw
    agent_index = jnp.where(u_on[..., None] & v_on[:, None, :], u[..., None] + v_col[:, None, :], 0)
    return (row_index, jnp.stack(special_at), jnp.stack(special_rows), row_tab, col_tab, owner.astype(jnp.uint8),
            agent_index)


def _compose(canvas, objects, agent, special_at, special_rows, main_width: int):
    """The pixels: the background rows, the level-edge rows, the entities, the agent; uint8 RGB (vectorised)."""
    pix_i = jnp.arange(RES, dtype=jnp.int32)
    for at, row in zip(special_at, special_rows):
        canvas = jnp.where((pix_i == at[:, None])[..., None], row[:, None, :], canvas)
    canvas = _blend(canvas, objects)
    band_lo, band_hi = agent_band(main_width)
    band = _blend(canvas[:, band_lo:band_hi], agent)
    canvas = jnp.concatenate([canvas[:, :band_lo], band, canvas[:, band_hi:]], 1)
    return jnp.stack([(canvas >> 16) & 0xFF, (canvas >> 8) & 0xFF, canvas & 0xFF], -1).astype(jnp.uint8)


def _render_batch(images: FrameImages, x, y, rx, ry, sprite, alive, background, main_width: int,
                  main_height: int) -> jax.Array:
    """render for a batch: x ... alive [B, N], background [B] -> uint8 [B, 64, 64, 3]. Written batched (not vmapped)
    so that its lookups are flat gathers, in three parts that XLA keeps apart (_stage): the geometry (vectorised),
    the gathers alone, then the blending (vectorised)."""
    pred = jnp.isfinite(x[0, 0])  # a NaN agent position: zero frames
    (row_index, special_at, special_rows, row_tab, col_tab, owner, agent_index) = _stage(
        pred, functools.partial(_geometry, main_width=main_width, main_height=main_height), images, x, y, rx, ry,
        sprite, alive, background)
    canvas = images.rows[row_index]  # [B, 64, 64]
    batch, tab_len = x.shape[0], row_tab.shape[1]
    at = (jnp.arange(batch)[:, None, None] * tab_len + owner.astype(jnp.int32)) * RES  # the owner's table row
    pix = jnp.arange(RES)
    objects = images.atlas[row_tab.reshape(-1)[at + pix[:, None]] + col_tab.reshape(-1)[at + pix[None, :]]]
    agent = images.atlas[agent_index]
    return _stage(pred, functools.partial(_compose, main_width=main_width), canvas, objects, agent, special_at,
                  special_rows)


def render_batch(images: FrameImages, x, y, rx, ry, sprite, alive, background, main_width: int,
                 main_height: int) -> jax.Array:
    """render for a batch, called directly: x ... alive [B, N], background [B] -> uint8 [B, 64, 64, 3], the same
    frames. Without render's custom_vmap, so that it can run where that cannot: in the learner's SGD step, inside a
    conditional that a vmap over seeds turns into a select, which batches every value the custom_vmap closed over
    (JAX refuses that). Vmapped, it batches as any JAX function does."""
    _oob_offset(main_width), _view(main_width, main_height)  # unsupported sizes fail here, at trace time
    return _render_batch(images, jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32),
                         jnp.asarray(rx, jnp.float32), jnp.asarray(ry, jnp.float32), jnp.asarray(sprite, jnp.int32),
                         jnp.asarray(alive, bool), jnp.asarray(background, jnp.int32), int(main_width),
                         int(main_height))


@functools.lru_cache(maxsize=None)
def _renderer(main_width: int, main_height: int):
    """render for one level size: one env's frame, whose vmap (any depth) runs _render_batch on the whole batch."""
    _oob_offset(main_width), _view(main_width, main_height)  # unsupported sizes fail here, at trace time

    def spread(axis_size, in_batched, arrays):
        images_batched, *batched = in_batched
        if any(jax.tree.leaves(images_batched)):
            raise NotImplementedError("render: the images must be the same for every env (not vmapped)")
        return [a if b else jnp.broadcast_to(a, (axis_size,) + a.shape) for a, b in zip(arrays, batched)]

    @jax.custom_batching.custom_vmap
    def batched(images, *arrays):  # arrays with a leading batch axis
        return _render_batch(images, *arrays, main_width, main_height)

    @batched.def_vmap
    def _(axis_size, in_batched, images, *arrays):  # a vmap over a vmap: one batch of all
        arrays = spread(axis_size, in_batched, arrays)
        lead = arrays[0].shape[:2]
        out = batched(images, *(a.reshape((-1,) + a.shape[2:]) for a in arrays))
        return out.reshape(lead + out.shape[1:]), True

    @jax.custom_batching.custom_vmap
    def single(images, *arrays):
        return batched(images, *(a[None] for a in arrays))[0]

    @single.def_vmap
    def _(axis_size, in_batched, images, *arrays):
        return batched(images, *spread(axis_size, in_batched, arrays)), True

    return single


def render(images: FrameImages, x, y, rx, ry, sprite, alive, background, main_width: int,
           main_height: int) -> jax.Array:
    """Fruitbot's 64x64x3 uint8 observation as procgen draws it (see the notes above), for one env; vmap it (any
    depth of vmaps runs one batched program).

    x, y, rx, ry: float32 [N] entity centres and half extents (world units, y up); sprite: int32 [N] sprite ids;
    alive: bool [N]; background: int32 index into BACKGROUND_FILES; slot 0 is the agent (drawn last, rotated -90
    degrees, half-size AGENT_R), the others are drawn in slot order. main_width (one of MAIN_WIDTHS) and main_height:
    the level's size (static ints). Drawn: the first max_visible(main_width) live barriers/doors in view, then the
    first of the rest, one image per pixel (the last slot covering it: where two overlap, which procgen's levels
    avoid but for a key flying over a locked door or a fruit, the lower one is not drawn under the upper one's
    transparent pixels)."""
    arrays = (jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), jnp.asarray(rx, jnp.float32),
              jnp.asarray(ry, jnp.float32), jnp.asarray(sprite, jnp.int32), jnp.asarray(alive, bool),
              jnp.asarray(background, jnp.int32))
    return _renderer(int(main_width), int(main_height))(images, *arrays)
