"""Sequence parallelism (Ulysses, DeepSpeed-Ulysses arXiv 2309.14509, as diffusers' context parallelism and FastVideo
run it for Wan): the all-to-all exchanges between a rank's chunk of the sequence and its share of the heads, and a
wrapper that runs any attention backend on the whole sequence for H / N heads, the diffusers context-parallel plan
and the degree check (`ulysses`); a torchrun launch's ranks, process group and `enable_parallelism` for `--ulysses`
(`launch`). CFG parallel and per-rank timing come with issue 15's later parts.
"""
