#!/usr/bin/env python3
"""Writes shaders/attention_tiled_shuffle.wgsl: attention_tiled.py's kernel
(`render(shuffle=True)`) whose row maxima and P move between a row's
invocations by subgroup shuffles (two barriers per key tile instead of
four), for adapters with subgroups of at least TK lanes; only `webattn
tune` tries it.
`.ci/run` checks the committed file matches this output:
    python3 shaders/gen/attention_tiled_shuffle.py > shaders/attention_tiled_shuffle.wgsl
"""
import os
import sys

sys.dont_write_bytecode = True

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_tiled import render  # noqa: E402

if __name__ == "__main__":
    print(render(shuffle=True))
