"""vsagen: Wan video generation through diffusers with sparse video self-attention.

Shape vocabulary used throughout: B batch, S tokens (T*Hl*Wl latent tokens after patchify), H heads,
D head dim, (T, Hl, Wl) the post-patch latent grid, Q_TILES / KV_TILES tile counts, K top-k.
"""

__version__ = "0.1.0"
