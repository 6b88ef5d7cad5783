"""Upper bounds that turn absurd requests into bad input before anything loads (shared by the option groups and
the sampler entries): diffusers' schedulers train on 1000 timesteps (runs past a few thousand steps only repeat
them; huge counts fail inside numpy); CFG scales past ~20 already saturate pictures and far larger ones overflow the
latents into black frames; flow shifts of the Wan family are 3..16; ffmpeg writes an empty file for frame rates it
cannot parse."""

MAX_STEPS = 10_000
MAX_GUIDANCE = 100.0
MAX_FLOW_SHIFT = 1000.0
MAX_FPS = 240
MAX_SEED = 2**63
