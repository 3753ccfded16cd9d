#!/usr/bin/env python3
"""Writes shaders/attention_tiled_chunked.wgsl: attention_tiled.py's kernel
(`render(chunked=True)`) with its Q, K, V and P tiles held in chunks of CW
columns of a row, so naga's runtime checks clamp an invocation's row once
per chunk instead of every load's index (fewer instructions per key tile,
more workgroup memory and perhaps more registers); only `webattn tune`
tries it.
`.ci/run` checks the committed file matches this output:
    python3 shaders/gen/attention_tiled_chunked.py > shaders/attention_tiled_chunked.wgsl
"""
import os
import sys

sys.dont_write_bytecode = True

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_tiled import render  # noqa: E402

if __name__ == "__main__":
    print(render(chunked=True))
