"""Sequence parallelism (Ulysses, DeepSpeed-Ulysses arXiv 2309.14509, as diffusers' context parallelism and FastVideo
run it for Wan): the all-to-all exchanges between a rank's chunk of the sequence and its share of the heads, and a
wrapper that runs any attention backend on the whole sequence for H / N heads, the diffusers context-parallel plan
and the degree check (`ulysses`); the conditional and unconditional CFG passes on two halves of the ranks (`cfg`); a
launch's ranks (torchrun's or vsagen's own), process group, `enable_parallelism` and per-rank timing gather for
`--ulysses` / `--cfg-parallel` (`launch`); the workers of `--gpus N` started through torch's elastic agent (`spawn`).
"""
