"""Static sparse-attention patterns (Sparse-vDiT, seed 003): the patterns as predicates over the tile grid compiled to
q2k index tables (`patterns`), the pattern files that assign one to every (step range, expert, layer, head)
(`files`). The `sparse-vdit` backend (`vsagen.attention.sparse_vdit`) runs them; the offline search that writes them
scores attention, so it lives beside that backend (`vsagen.attention.sparse_vdit_search`): this package imports no
attention module.
"""
