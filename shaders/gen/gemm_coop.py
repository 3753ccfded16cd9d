#!/usr/bin/env python3
"""Writes shaders/gemm_coop.wgsl, the GEMM on the matrix units, from
shaders/gen/gemm_coop.wgsl.in, with attention_coop.py's blocks (`//@ ALL`,
`//@ EACH`, `//@ END`) expanded over the MAXV = 16 vec4 slots an invocation
may stage per slice: its next slice's registers are named variables.
`.ci/run` checks the committed file matches this output:
    python3 shaders/gen/gemm_coop.py > shaders/gemm_coop.wgsl
"""
import os
import sys

sys.dont_write_bytecode = True

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_coop import render  # noqa: E402

MAXV = 16

if __name__ == "__main__":
    print(render("gemm_coop", count=MAXV))
