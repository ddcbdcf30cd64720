"""The procgen images Fruitbot's frame is drawn from (common/envs/fruitbot_frame.py), by name, and the sprite ids
that index them. A module of its own, importing nothing, so that the frame (which draws them) and
common/envs/procgen_env.py (which copies them out of stock procgen's environment) both read it without importing
each other."""

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
