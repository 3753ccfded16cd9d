#!/usr/bin/env python3
"""What a real GPU compiler makes of the engine's kernels, without a GPU.

Compiles the SPIR-V modules that `examples/spirv_dump.rs` wrote (DIR/index.tsv
lists them) with Mesa's RADV, the AMD Vulkan driver, on its null device
(RADV_FORCE_FAMILY: a GPU family with no hardware behind it; Mesa 22.3, as in
Debian 12, has it), and prints for each pipeline what its compiler (ACO) says:
vector registers, registers spilled to scratch memory, waves per SIMD, and the
instructions of each innermost loop that does multiply-adds, by kind:

    73/32fma(6ds,21v)   73 instructions per iteration, 32 of them fma
                        (mixed f16/f32 fma and fma with a literal count),
                        6 workgroup-memory loads, 21 other vector ALU

and, for the attention kernels, the widest loop around them (the key loop)
counted outside its innermost loops, once per trip:

    around: 1500/286fma(88ds,508v,498s)   ... 498 scalar instructions and
                                              branches (loop counters, uniform
                                              tests)

and, for attention_tiled, the key tile as a whole: the count around plus
each hot loop times its trips, against the tile's fma:

    per tile: 2132/512fma (24%)

A loop's count is static: a branch inside it counts both ways.

For the matrix-unit attention kernel's scalar code ("coop scalar" rows: its
matrices stood in by f32 scalars, examples/spirv_dump.rs), the instructions
per trip of each loop inside its key loop, in layout order: the softmax
step's walks first (one trip per key, or per 4 keys since 2026-11-27), then
the rare ones (O rescaled, V non-finite, ...).

A GPU's arithmetic ceiling is one fma per issue slot, so the fma share of a
kernel's hot loops bounds its share of the ceiling, on any vendor's GPU: every
other instruction (an address, a clamp, a max, a wait) takes a slot. This is a
static view, not a timing: it says nothing of memory latency or of how another
vendor's compiler schedules; registers and spills are AMD's (another compiler
allocates differently, but a block that needs more registers than a GPU has
spills on every GPU). Writes DIR/stats.json.

    python3 .ci/shader-stats.py DIR [FILTER]   (FILTER: a substring of the
                                                pipeline's description or key)

With WEBATTN_STATS_ASM set, each module's disassembly is kept beside it
(DIR/NAME.asm), to read what a loop spends its instructions on.

`bash .ci/shader-stats` builds the example, writes the modules and runs this.
"""
import json
import os
import re
import sys
from collections import Counter

# The compiler's disassembly goes to stderr under RADV_DEBUG=shaders; the
# shader cache would skip the compiler.
os.environ.setdefault("RADV_DEBUG", "shaders")
os.environ["MESA_SHADER_CACHE_DISABLE"] = "true"

try:
    import vulkan as vk
except ImportError:
    sys.exit("shader-stats: the Python `vulkan` module is missing (pip install vulkan)")


def blocks_of(asm):
    """Disassembly -> [(block number, [instructions])] in layout order."""
    blocks = []
    for line in asm.splitlines():
        text = line.strip()
        label = re.match(r"^BB(\d+):$", text)
        if label:
            blocks.append((int(label.group(1)), []))
            continue
        ins = text.split(";")[0].strip()
        if ins and blocks:
            blocks[-1][1].append(ins)
    return blocks


def kind(ins):
    """The kind of one instruction: fma, dual (gfx11 VOPD pair), lds, vmem,
    wait, branch, valu, salu or other."""
    op = ins.split()[0]
    if op.startswith("v_dual_"):
        return "dual"
    if re.match(r"v_(pk_)?(fma|fmac|mac|mad)(ak|mk|_mix)?_f32", op):
        return "fma"
    if op.startswith("ds_"):
        return "lds"
    if op.startswith(("global_", "buffer_", "flat_", "scratch_")):
        return "vmem"
    if op.startswith(("s_waitcnt", "s_delay_alu", "s_clause", "s_nop")):
        return "wait"
    if op.startswith(("s_cbranch", "s_branch")):
        return "branch"
    if op.startswith("v_"):
        return "valu"
    if op.startswith("s_"):
        return "salu"
    return "other"


def all_loops(blocks):
    """(first, last) block positions of each loop: a branch back to an
    earlier block."""
    at = {number: i for i, (number, _) in enumerate(blocks)}
    found = set()
    for i, (_, body) in enumerate(blocks):
        for ins in body:
            target = re.match(r"s_c?branch\w*\s+BB(\d+)", ins)
            if target and at.get(int(target.group(1)), i + 1) <= i:
                found.add((at[int(target.group(1))], i))
    return sorted(found)


def innermost(loops):
    """The loops that contain no other loop."""
    return [
        loop for loop in loops
        if not any(o != loop and loop[0] <= o[0] and o[1] <= loop[1] for o in loops)
    ]


def innermost_loops(blocks):
    """(first, last) block positions of each loop that contains no other loop."""
    return innermost(all_loops(blocks))


def count(counts, ins):
    """Adds one instruction to a Counter by kind."""
    k = kind(ins)
    counts[k] += 1
    counts["total"] += 1
    if k == "dual":
        # A pair issued as one instruction: its fmacs count.
        counts["fma"] += ins.split()[0].count("fmac")


def outer_loop(asm):
    """The widest loop that holds other loops (a fused kernel's key loop),
    counted outside its innermost loops: the work around the hot loops, once
    per trip, both sides of every branch. None where there is no such loop."""
    blocks = blocks_of(asm)
    loops = all_loops(blocks)
    outer = [loop for loop in loops if loop not in innermost(loops)]
    if not outer:
        return None
    first, last = max(outer, key=lambda loop: loop[1] - loop[0])
    inside = {
        i for a, b in innermost([l for l in loops if first <= l[0] and l[1] <= last and l != (first, last)])
        for i in range(a, b + 1)
    }
    counts = Counter()
    for i in range(first, last + 1):
        if i not in inside:
            for ins in blocks[i][1]:
                count(counts, ins)
    return dict(counts)


def key_loop_inner_loops(asm):
    """The instructions of each innermost loop inside the widest loop that
    holds others (a fused kernel's key loop), in layout order."""
    blocks = blocks_of(asm)
    loops = all_loops(blocks)
    outer = [loop for loop in loops if loop not in innermost(loops)]
    if not outer:
        return []
    first, last = max(outer, key=lambda loop: loop[1] - loop[0])
    out = []
    for a, b in innermost([l for l in loops if first <= l[0] and l[1] <= last and l != (first, last)]):
        counts = Counter()
        for _, body in blocks[a:b + 1]:
            for ins in body:
                count(counts, ins)
        out.append(counts["total"])
    return out


def hot_loops(asm):
    """Each innermost loop with multiply-adds: its instructions by kind."""
    blocks = blocks_of(asm)
    out = []
    for first, last in innermost_loops(blocks):
        counts = Counter()
        for _, body in blocks[first:last + 1]:
            for ins in body:
                count(counts, ins)
        if counts["fma"]:
            out.append(dict(counts))
    return out


class Compiler:
    """A RADV null device that compiles compute pipelines and reports on them."""

    def __init__(self):
        app = vk.VkApplicationInfo(apiVersion=vk.VK_MAKE_VERSION(1, 3, 0))
        instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
        devices = vk.vkEnumeratePhysicalDevices(instance)
        if not devices:
            sys.exit("shader-stats: no Vulkan device (is RADV_FORCE_FAMILY set, RADV installed?)")
        physical = devices[0]
        self.name = vk.vkGetPhysicalDeviceProperties(physical).deviceName
        queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=0, queueCount=1, pQueuePriorities=[1.0])
        executables = vk.VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
            pipelineExecutableInfo=vk.VK_TRUE)
        v12 = vk.VkPhysicalDeviceVulkan12Features(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, pNext=executables,
            vulkanMemoryModel=vk.VK_TRUE, vulkanMemoryModelDeviceScope=vk.VK_TRUE,
            shaderFloat16=vk.VK_TRUE)
        v11 = vk.VkPhysicalDeviceVulkan11Features(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, pNext=v12,
            storageBuffer16BitAccess=vk.VK_TRUE)
        self.device = vk.vkCreateDevice(physical, vk.VkDeviceCreateInfo(
            pNext=v11, queueCreateInfoCount=1, pQueueCreateInfos=[queue],
            enabledExtensionCount=1,
            ppEnabledExtensionNames=["VK_KHR_pipeline_executable_properties"]), None)
        self.statistics = vk.vkGetDeviceProcAddr(self.device, "vkGetPipelineExecutableStatisticsKHR")

    def compile(self, path, bindings):
        """Compiles one module (its group-0 bindings as a string of u, r, w);
        returns the driver's statistics and the disassembly."""
        dev = self.device
        kinds = {"u": vk.VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER,
                 "r": vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                 "w": vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER}
        entries = [vk.VkDescriptorSetLayoutBinding(
            binding=i, descriptorType=kinds[c], descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i, c in enumerate(bindings)]
        set_layout = vk.vkCreateDescriptorSetLayout(dev, vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=len(entries), pBindings=entries), None)
        layout = vk.vkCreatePipelineLayout(dev, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[set_layout]), None)
        code = open(path, "rb").read()
        module = vk.vkCreateShaderModule(dev, vk.VkShaderModuleCreateInfo(
            codeSize=len(code), pCode=code), None)
        stage = vk.VkPipelineShaderStageCreateInfo(
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main")
        info = vk.VkComputePipelineCreateInfo(
            flags=vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR, stage=stage, layout=layout)
        # The driver prints the disassembly to stderr: send it to a file.
        log_path = path + ".log"
        sys.stderr.flush()
        saved = os.dup(2)
        with open(log_path, "w") as log:
            os.dup2(log.fileno(), 2)
            try:
                pipeline = vk.vkCreateComputePipelines(dev, None, 1, [info], None)[0]
            finally:
                os.dup2(saved, 2)
                os.close(saved)
        text = open(log_path).read()
        os.remove(log_path)
        stats = {}
        for s in self.statistics(dev, vk.VkPipelineExecutableInfoKHR(
                pipeline=pipeline, executableIndex=0)):
            value = s.value
            stats[s.name] = {0: value.b32, 1: value.i64, 2: value.u64, 3: value.f64}[s.format]
        vk.vkDestroyPipeline(dev, pipeline, None)
        vk.vkDestroyShaderModule(dev, module, None)
        vk.vkDestroyPipelineLayout(dev, layout, None)
        vk.vkDestroyDescriptorSetLayout(dev, set_layout, None)
        asm = text.split("disasm:")[-1].split("\n\n\n")[0] if "disasm:" in text else ""
        return stats, asm


def loop_text(loop):
    return (f"{loop['total']}/{loop['fma']}fma"
            f"({loop.get('lds', 0)}ds,{loop.get('valu', 0)}v)")


def outer_text(loop):
    if not loop:
        return ""
    return (f"  around: {loop['total']}/{loop['fma']}fma"
            f"({loop.get('lds', 0)}ds,{loop.get('valu', 0)}v,"
            f"{loop.get('salu', 0) + loop.get('branch', 0)}s)")


def overrides(key):
    """A pipeline key's override constants: `kernel[A=1,B=2]` -> {A: 1, B: 2}."""
    m = re.search(r"\[(.*)\]", key)
    out = {}
    for item in (m.group(1).split(",") if m else []):
        name, _, value = item.partition("=")
        if value.isdigit():
            out[name] = int(value)
    return out


def per_tile(key, loops, around):
    """A register-tiled (not shuffle) pipeline's instructions and fma per key
    tile: the count around the hot loops plus each hot loop times its trips
    (S = Q K^T: two vec4 columns a step, DK4 / 2 steps, or in the chunked
    form a chunk of 8 a step, DK4 / 8 steps, then DK4 % 8 steps of one; O +=
    P V: four keys a step, BK / 4 steps), against the tile's fma, RQ RK Dk +
    RQ BK 4 DVT. None where a hot loop is none of these, or for other
    kernels."""
    o = overrides(key)
    chunked = key.startswith("attention_tiled_chunked[")
    if not (key.startswith("attention_tiled[") or chunked) or around is None or not all(
            k in o for k in ("RQ", "RK", "DK4", "BK", "DVT")):
        return None
    rq, rk, dk4, bk, dvt = o["RQ"], o["RK"], o["DK4"], o["BK"], o["DVT"]
    total = around["total"]
    for loop in loops:
        if chunked and loop["fma"] == 32 * rq * rk:
            total += loop["total"] * (dk4 // 8)
        elif chunked and dk4 % 8 and loop["fma"] == 4 * rq * rk:
            total += loop["total"] * (dk4 % 8)
        elif not chunked and loop["fma"] == 8 * rq * rk:
            # (An odd DK4's last column is a step after the loop, counted around.)
            total += loop["total"] * (dk4 // 2)
        elif loop["fma"] == 16 * rq * dvt and bk % 4 == 0:
            total += loop["total"] * (bk // 4)
        else:
            return None
    fma = rq * rk * dk4 * 4 + rq * bk * 4 * dvt
    return dict(instructions=total, fma=fma)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    only = sys.argv[2] if len(sys.argv) > 2 else ""
    compiler = Compiler()
    print(f"compiler: RADV/ACO on {compiler.name} (null device: no GPU)")
    print(f"{'pipeline':38s} checks vgprs spilled waves  hot loops: instructions/fma (lds loads, other valu)")
    rows = []
    index = open(os.path.join(folder, "index.tsv")).read().splitlines()[1:]
    for line in index:
        name, checks, bindings, what, key = line.split("\t")
        if only and only not in what and only not in key:
            continue
        stats, asm = compiler.compile(os.path.join(folder, name), bindings)
        if os.environ.get("WEBATTN_STATS_ASM"):
            with open(os.path.join(folder, name[:-len(".spv")] + ".asm"), "w") as out:
                out.write(asm)
        loops = hot_loops(asm)
        around = outer_loop(asm) if loops or "attention" in key else None
        tile = per_tile(key, loops, around)
        row = dict(what=what, checks=checks, key=key,
                   vgprs=stats.get("VGPRs"), spilled_vgprs=stats.get("Spilled VGPRs"),
                   waves_per_simd=stats.get("Subgroups per SIMD"),
                   instructions=stats.get("Instructions"), hot_loops=loops,
                   around_hot_loops=around, per_tile=tile)
        rows.append(row)
        tile_text = (f"  per tile: {tile['instructions']}/{tile['fma']}fma"
                     f" ({100 * tile['fma'] / tile['instructions']:.0f}%)" if tile else "")
        if what.startswith("coop scalar"):
            # The matrix-unit kernel's scalar code: its loops inside the key
            # loop (the softmax step's walks first, then the rare rescaling
            # and non-finite-V loops), instructions per trip.
            inner = key_loop_inner_loops(asm)
            row["key_loop_inner_loops"] = inner
            print(f"{what:38s} {checks:6s} {row['vgprs']:5d} {row['spilled_vgprs']:7d} {row['waves_per_simd']:5d}  "
                  + "loops in the key loop: " + " ".join(map(str, inner)) + outer_text(around), flush=True)
            continue
        print(f"{what:38s} {checks:6s} {row['vgprs']:5d} {row['spilled_vgprs']:7d} {row['waves_per_simd']:5d}  "
              + "  ".join(loop_text(l) for l in loops) + outer_text(around) + tile_text, flush=True)
    with open(os.path.join(folder, "stats.json"), "w") as out:
        json.dump(dict(compiler=f"RADV/ACO {compiler.name}", rows=rows), out, indent=1)


if __name__ == "__main__":
    main()
