#!/usr/bin/env python3
"""Writes shaders/attention_coop_packed.wgsl, the fused attention kernel on
the matrix units with K and V packed as f16 ahead of it, from
shaders/gen/attention_coop.wgsl.in with PACKED defined (attention_coop.py
renders the staged form from the same template).
`.ci/run` checks the committed file matches this output:
    python3 shaders/gen/attention_coop_packed.py > shaders/attention_coop_packed.wgsl
"""
import os
import sys

sys.dont_write_bytecode = True

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_coop import render  # noqa: E402

if __name__ == "__main__":
    print(render("attention_coop", defines=("PACKED",), generator="attention_coop_packed"))
