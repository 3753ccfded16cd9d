#!/usr/bin/env python3
"""Writes shaders/attention_tiled_wide.wgsl: attention_tiled.py's kernel
(`render(wide=True)`) with up to 8 query rows per invocation (MAX_RQ = 8)
for the register-tiled kernel's 8-row shapes, which only `webattn tune`
tries.
`.ci/run` checks the committed file matches this output:
    python3 shaders/gen/attention_tiled_wide.py > shaders/attention_tiled_wide.wgsl
"""
import os
import sys

sys.dont_write_bytecode = True

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_tiled import render  # noqa: E402

if __name__ == "__main__":
    print(render(wide=True))
