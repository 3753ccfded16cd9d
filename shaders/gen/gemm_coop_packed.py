#!/usr/bin/env python3
"""Writes shaders/gemm_coop_packed.wgsl, the GEMM on the matrix units from
packed f16 operands, from shaders/gen/gemm_coop_packed.wgsl.in, with
attention_coop.py's blocks (`//@ ALL`, `//@ EACH`, `//@ GRID`, `//@ END`)
expanded over the MAXR = 4 matrices of op(A) and of op(B) a subgroup may
hold per step: its matrices and accumulators are named variables.
`.ci/run` checks the committed file matches this output:
    python3 shaders/gen/gemm_coop_packed.py > shaders/gemm_coop_packed.wgsl
"""
import os
import sys

sys.dont_write_bytecode = True

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_coop import render  # noqa: E402

MAXR = 4

if __name__ == "__main__":
    print(render("gemm_coop_packed", count=MAXR))
