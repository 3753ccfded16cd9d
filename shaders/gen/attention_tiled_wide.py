#!/usr/bin/env python3
"""Writes shaders/attention_tiled_wide.wgsl: attention_tiled.py's kernel with
up to 8 query rows per invocation (MAX_RQ = 8) for the register-tiled
kernel's 8-row shapes, which only `webattn tune` tries.
`.ci/run` checks the committed file matches this output:
    python3 shaders/gen/attention_tiled_wide.py > shaders/attention_tiled_wide.wgsl
"""
import os
import runpy

runpy.run_path(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_tiled.py"),
    init_globals={"WIDE": True},
    run_name="__main__",
)
