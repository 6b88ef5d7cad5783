"""The VAE decode, from latents to frames: the stock Wan VAEs' decode as a stream of frame chunks that the mp4 encode
overlaps (`stream`), Hummingbird-XT's lightweight decoder network (`light_decoder`), the TAEHV family's tiny decoder
(`tiny_decoder`: taew2_1, taew2_2, LightX2V's lighttaew2_*) and where its published weights are found (`tiny_files`),
and which decoder a run uses, attached to the stock VAE (`decoder_choice`: `--vae auto|light|stock|tiny`).
"""
