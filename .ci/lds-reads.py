#!/usr/bin/env python3
"""Cycles a 32-lane subgroup spends on the register-tiled kernel's 16-byte
reads from workgroup memory per key tile, under NVIDIA's account of its
shared memory (Volta/Turing): a 16-byte read is served a quarter-subgroup
(8 lanes) at a time, one cycle per quarter, more where a quarter's distinct
addresses share banks; half that (at least 2) where lanes 2n and 2n+1, or 2n
and 2n+2, read one address. A model, not a measurement: "rows" numbers a
grid row's invocations consecutively (attention_tiled before 2026-11-27),
"pairs" as the kernels now do (src/kernels/attention/tiled/generator.rs).

    python3 .ci/lds-reads.py      # a Markdown table (BENCHMARKS.md)
"""
import sys

def cycles(addrs):  # addrs: vec4 index per lane (32 lanes)
    total = 0
    for q in range(4):
        lanes = addrs[8 * q: 8 * q + 8]
        groups = {}
        for a in set(lanes):
            groups.setdefault(a % 8, set()).add(a)   # 32 banks = 8 vec4 groups
        total += max(len(s) for s in groups.values())
    paired = all(addrs[n] == addrs[n ^ 1] for n in range(32)) or all(addrs[n] == addrs[n ^ 2] for n in range(32))
    return max(2, total // 2) if paired else total

def per_tile(bq, bk, tq, tk, d4, paired):
    rq, rk, dvt = bq // tq, bk // tk, -(-d4 // tk)
    qs = ks = d4 + 1
    ps = bk // 4 + (1 if paired else 0)
    def lane(li):
        return ((li & 1) | ((li // (2 * tk)) << 1), (li >> 1) % tk) if paired else (li // tk, li % tk)
    warps = tq * tk // 32
    s = pv = 0
    for w in range(warps):
        ls = [lane(32 * w + n) for n in range(32)]
        # S = Q K^T: per vec4 column, RQ reads of Q and RK of K.
        for d in range(d4):
            s += sum(cycles([(tr + tq * i) * qs + d for tr, tc in ls]) for i in range(rq))
            s += sum(cycles([(tc + tk * j) * ks + d for tr, tc in ls]) for j in range(rk))
        # O += P V: per 4 keys, RQ reads of P and 4 DVT of V.
        for t4 in range(bk // 4):
            pv += sum(cycles([(tr + tq * i) * ps + t4 for tr, tc in ls]) for i in range(rq))
            pv += sum(cycles([(4 * t4 + u) * ks + min(tc + tk * c, d4 - 1) for tr, tc in ls])
                      for u in range(4) for c in range(dvt))
    fma = 2 * bq * bk * d4 * 4  # both products, per workgroup
    return s, pv, fma


# An NVIDIA SM (Volta to Hopper) does 128 fp32 fma a cycle and returns 128
# bytes of workgroup memory a cycle: reads bound a kernel to this share of
# its FMA ceiling where it does fewer than 128 fma per cycle of reads.
def bound(r):
    return f"{min(1.0, r[2] / (r[0] + r[1]) / 128):.0%}"

print("| shape (d, rows x keys on grid) | S = QK^T reads (cycles), rows / pairs | O += PV reads, rows / pairs | share of the FMA ceiling the reads allow, rows / pairs |")
print("|---|---|---|---|")
for d, bq, bk, tq, tk in [(64, 64, 32, 16, 16), (64, 32, 32, 16, 16), (64, 64, 32, 16, 8), (64, 64, 64, 16, 16),
                          (128, 32, 32, 16, 16), (128, 64, 32, 16, 16), (128, 32, 32, 8, 8), (64, 64, 32, 8, 8)]:
    a = per_tile(bq, bk, tq, tk, d // 4, False)
    b = per_tile(bq, bk, tq, tk, d // 4, True)
    print(f"| {d}, {bq}x{bk} on {tq}x{tk} | {a[0]} / {b[0]} | {a[1]} / {b[1]} | {bound(a)} / {bound(b)} |")
