"""`vsagen.compiling`: which runs get the fused block regions or whole compiled blocks, and the notes that say so."""

from vsagen.compiling import compile_note, fused_blocks_apply, fused_blocks_note


def test_only_eager_cuda_runs_without_offloading_get_the_regions():
    assert fused_blocks_apply("cuda", False, "none")
    assert fused_blocks_apply("cuda:1", False)
    assert not fused_blocks_apply("cpu", False)
    assert not fused_blocks_apply("cuda", True)  # --compile compiles whole blocks
    assert not fused_blocks_apply("cuda", False, "group")  # offload hooks wrap forward
    assert not fused_blocks_apply("cuda", False, "model")


def test_note_says_when_the_compile_is_timed():
    assert "--warmup 1" in fused_blocks_note(0) and "--warmup" not in fused_blocks_note(1)
    assert "VSAGEN_FUSED_BLOCKS=0" in fused_blocks_note(1)


def test_compile_note_names_graphs_breaks_and_warmup():
    whole = compile_note(None, ["vsa"], warmup=1)
    assert whole.startswith("--compile: every transformer block is one compiled graph")
    assert "(vsa) runs inside the graphs" in whole and "measure the compiler" not in whole
    broken = compile_note("--offload group's onload hook on every block is not traceable", [], warmup=0)
    assert "compiled with graph breaks (--offload group's onload hook" in broken
    assert "attn1 is inside the graphs and not timed, the attention backend is" in broken
    assert broken.endswith("--warmup 0: the timed steps include the compilation, so their times measure the compiler")
    for note in (whole, broken):
        assert "layout counts only the reorderings outside the blocks" in note and "\n" not in note
