"""The VAE decode, from latents to frames: the stock Wan VAEs' decode as a stream of frame chunks that the mp4 encode
overlaps (`stream`), Hummingbird-XT's lightweight decoder network (`light_decoder`), and which decoder a run uses
with the light one attached to the stock VAE (`decoder_choice`: `--vae auto|light|stock`).
"""
