"""Step caching (`--cache`): a cache as a value, parsed and checked without torch (`cache_spec`: `CacheSpec`, its
options, what a run reused), and its installation on a pipeline's transformers through diffusers' cache hooks, with
the counts of computed and reused forwards and MagCache's calibration files (`install`).
"""
