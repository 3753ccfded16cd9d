#!/usr/bin/env python3
"""Writes shaders/attention_tiled_chunked.wgsl: attention_tiled.py's kernel
with its Q, K, V and P tiles held in chunks of CW columns of a row, so naga's
runtime checks clamp an invocation's row once per chunk instead of every
load's index (fewer instructions per key tile, more workgroup memory and
perhaps more registers); only `webattn tune` tries it.
`.ci/run` checks the committed file matches this output:
    python3 shaders/gen/attention_tiled_chunked.py > shaders/attention_tiled_chunked.wgsl
"""
import os
import runpy

runpy.run_path(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_tiled.py"),
    init_globals={"CHUNKED": True},
    run_name="__main__",
)
