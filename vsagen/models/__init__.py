"""Where a model comes from: `--model` resolved to a `ModelSource` and `--model`'s default (`sources`), the bundled
presets (`presets`, read from `vsagen/preset_data`), checkpoint layouts other than a stock diffusers folder
(`checkpoint_layouts`), transformer-only checkpoint files (`transformer_files`), the embedded tiny models (`tiny`,
which also says where vsagen's cache folder is), torch's compile caches kept in that folder (`compile_caches`), the
hub files a preset's run reads (`hub_files`, for `vsagen download`),
and the loading of a pipeline (`loading`) with the weights attention backends own attached to every transformer of
it (`pipeline_weights`; reading and fitting those tensors per layer is `vsagen.attention.weights`).

Everything but `loading` and `pipeline_weights` reads configs and file headers only (no torch, no diffusers), below
the request layer; those two load and run a request, above it (docs/internals.md, "Layers").
"""
