"""The decode kernel (`_triton/decode.py`) on the CPU, in Triton's interpreter, against the jnp reference.

Every weight format, with bf16 and with quantized activations, on each compute variant (the swapped
`tl.dot`, the CUDA-core FMAs) and each split-K reduction (none, the ordered workspace, fp32 atomics),
at small odd shapes: K pads inside the kernel path, N spans two 128-row block_fp8 scale tiles and no
whole number of weight tiles, M is not a power of two (and once a folded batch). fp4 weights also run
the inline-PTX decode, emulated (tests/_ptx_emulator.py) with packs taken across scale groups, as
Triton's layout packs the FMA variant's nvfp4 tile on sm_90. The whole `jb.matmul` GPU path runs:
dispatch, the primitive's padding, the launcher, the kernel (tests/_decode_interpret_check.py).

Most cases ask for float32 output, so the only difference from the reference is the fp32 summation
order (1e-5); a few take bf16 output (2 bf16 eps). These cases fail on the two bugs the H100 found
(bf16 x block_fp8 read the activations as scales; the PTX fp4 decode gave a pack's four elements the
first two's scales) and on any wrong scale index along N or K.
"""

import pytest

pytest.importorskip("triton")

from _dispatch import sm90_decode_kernel  # noqa: E402
from _interpret import run_matmul_cases  # noqa: E402

# weight format -> the quantized activation format it is paired with (besides bf16)
WEIGHTS = {
    "mxfp4": "mxfp8", "nvfp4": "nvfp4", "mxfp6_e2m3": "mxfp6_e3m2", "mxfp6_e3m2": "mxfp4",
    "mxfp8": "mxfp8_e5m2", "mxfp8_e5m2": "mxfp6_e2m3", "fp8_block": "fp8_block",
}
FP4 = ("mxfp4", "nvfp4")


def _block_k(fb):
    return 256 if fb in FP4 else 128


def _config(fb, rows, variant):
    """variant: mma (no split), split (mma, ordered split-K 3), fma (ordered split-K 2), atomic (split-K 3,
    fp32 atomics; FMA for fp4 weights, MMA otherwise)."""
    fma = variant == "fma" or (variant == "atomic" and fb in FP4)
    block_m = max(1, 1 << (rows - 1).bit_length()) if fma else max(16, 1 << (rows - 1).bit_length())
    split = {"mma": 1, "split": 3, "fma": 2, "atomic": 3}[variant]
    return dict(block_m=block_m, block_n=32 if fma else 64, block_k=_block_k(fb), group_m=1, num_warps=4,
                num_stages=2, split_k=split, fma=fma, atomic_split_k=variant == "atomic", asm_decode=True)


CASES = []
seed = 0
for fb, fq in WEIGHTS.items():
    for fa in ("bf16", fq):
        for i, variant in enumerate(("mma", "split", "fma", "atomic")):
            seed += 1
            batch, m = ([2], 3) if (fa != "bf16" and variant == "split") else ([], (1, 3, 5, 2)[i])
            CASES.append(dict(fa=fa, fb=fb, batch=batch, m=m, n=150, k=700, seed=seed, a_gain=3.0,
                              config=_config(fb, m * (batch[0] if batch else 1), variant),
                              out_dtype="float32" if variant != "mma" else "bfloat16"))
# The PTX fp4 decode (emulated), both compute variants; nvfp4 activations with a tensor scale != 1.
for fb in FP4:
    for fa, variant in (("bf16", "fma"), ("bf16", "mma"), (WEIGHTS[fb], "atomic")):
        seed += 1
        CASES.append(dict(fa=fa, fb=fb, batch=[], m=3, n=150, k=700, seed=seed, a_gain=40.0, asm=True,
                          config=_config(fb, 3, variant), out_dtype="float32"))
# The streaming GEMV (config.gemv): every weight format with bf16 and quantized activations; one row (per-group
# accumulators) and several (row sums); no split, the ordered split-K over 3 splits, fp32 atomics.
for fb, fq in WEIGHTS.items():
    for fa, m, split, atomic in (("bf16", 1, 1, False), (fq, 3, 3, False), ("bf16", 2, 2, True)):
        seed += 1
        block_k = 512 if fb in FP4 else 256
        CASES.append(dict(fa=fa, fb=fb, batch=[], m=m, n=150, k=1536 if fb in FP4 else 700, seed=seed,
                          a_gain=3.0, out_dtype="float32",
                          config=dict(block_m=max(1, 1 << (m - 1).bit_length()), block_n=16 if m == 1 else 8,
                                      block_k=block_k, group_m=1, num_warps=4, num_stages=2, split_k=split,
                                      atomic_split_k=atomic, gemv=True, prefetch=split != 2)))
# ... the 8-bit weights' sm_90 tiles (gemv_tiles.FP8_GEMV_TILES): whole 2048-code rows on 8 warps at one row, 16 rows
# x 1024 codes at several, no K split.
for fa, m, block_n, block_k, warps, stages in (("bf16", 1, 8, 2048, 8, 2), ("mxfp8_e5m2", 3, 16, 1024, 4, 3)):
    seed += 1
    CASES.append(dict(fa=fa, fb="mxfp8", batch=[], m=m, n=150, k=2048, seed=seed, a_gain=3.0, out_dtype="float32",
                      config=dict(block_m=max(1, 1 << (m - 1).bit_length()), block_n=block_n, block_k=block_k,
                                  group_m=1, num_warps=warps, num_stages=stages, split_k=1, gemv=True,
                                  prefetch=False)))
# ... the block FP8 weights' one-row sm_90 tiles (gemv_tiles.BLOCK_FP8_GEMV_TILES): whole rows on 8 warps, 16 rows x
# 1024 codes on 4 (two K tiles).
for block_n, block_k, warps, stages, k in ((8, 2048, 8, 2, 2048), (16, 1024, 4, 3, 2048)):
    seed += 1
    CASES.append(dict(fa="bf16", fb="fp8_block", batch=[], m=1, n=150, k=k, seed=seed, a_gain=3.0, out_dtype="float32",
                      config=dict(block_m=1, block_n=block_n, block_k=block_k, group_m=1, num_warps=warps,
                                  num_stages=stages, split_k=1, gemv=True, prefetch=False)))
# ... its PTX fp4 decode (emulated), a folded batch, and bf16 output.
for fa, fb in (("bf16", "mxfp4"), ("nvfp4", "nvfp4")):
    seed += 1
    CASES.append(dict(fa=fa, fb=fb, batch=[2], m=2, n=150, k=700, seed=seed, a_gain=40.0, asm=True,
                      out_dtype="bfloat16",
                      config=dict(block_m=4, block_n=32, block_k=256, group_m=1, num_warps=4, num_stages=3,
                                  split_k=2, gemv=True)))
# ... its fp16-route PTX decode (config.f16_decode, emulated): one row (per-group sums), several rows with
# split-K, both fp4 formats, quantized and bf16 activations.
for fa, fb, m, split in (("bf16", "mxfp4", 1, 1), ("mxfp8", "mxfp4", 3, 3), ("bf16", "nvfp4", 1, 2),
                         ("nvfp4", "nvfp4", 4, 1)):
    seed += 1
    CASES.append(dict(fa=fa, fb=fb, batch=[], m=m, n=150, k=1536, seed=seed, a_gain=40.0, asm=True,
                      out_dtype="float32",
                      config=dict(block_m=max(1, 1 << (m - 1).bit_length()), block_n=8, block_k=512, group_m=1,
                                  num_warps=4, num_stages=2, split_k=split, gemv=True, prefetch=False,
                                  f16_decode=True)))
# The MMA on the tuned sm_90 tiles' shape (32 weight rows, 2 warps: mma.sync): the PTX fp4 decode (emulated)
# and the fp32 one, quantized activations, the ordered split-K, mxfp8 and fp6 weights.
for fa, fb, asm, split in (("bf16", "mxfp4", True, 1), ("nvfp4", "nvfp4", False, 3), ("mxfp8", "mxfp4", True, 3),
                           ("bf16", "mxfp8", True, 1), ("mxfp4", "mxfp6_e3m2", False, 1)):
    seed += 1
    CASES.append(dict(fa=fa, fb=fb, batch=[], m=5, n=150, k=700, seed=seed, a_gain=40.0, asm=asm,
                      out_dtype="float32",
                      config=dict(_config(fb, 5, "mma"), split_k=split, block_n=32, num_warps=2)))
# The default configuration, as dispatch gives it (the GEMV up to 4 rows, MMA above).
# (mxfp8 x mxfp4 and bf16 x mxfp8 at 2-64 rows, 8-bit MX on both sides and block FP8 x block FP8 at 1-64 dispatch
# to Gluon kernels, which the interpreter cannot run: mxfp8 weights here with bf16 activations at one row or fp6
# ones, and the other pairs only with the configs above.)
for fa, fb, m in (("bf16", "nvfp4", 1), ("bf16", "fp8_block", 4), ("bf16", "mxfp8", 1),
                  ("mxfp6_e2m3", "mxfp8", 5), ("bf16", "mxfp6_e3m2", 64)):
    seed += 1
    CASES.append(dict(fa=fa, fb=fb, batch=[], m=m, n=150, k=700, seed=seed, out_dtype="float32"))


def _id(case):
    config = case.get("config") or {}
    variant = ("default" if not config else
               ("gemv-" if config.get("gemv") else "")
               + ("atomic" if config.get("atomic_split_k") else "fma" if config.get("fma") else "mma")
               + f"-s{config['split_k']}" + f"-n{config['block_n']}")
    return f"{case['fa']}-{case['fb']}-m{case['m']}-{variant}{'-asm' if case.get('asm') else ''}"


def _batch(case) -> int:
    n = 1
    for d in case.get("batch", []):
        n *= d
    return n


@pytest.fixture(scope="module")
def results():
    return run_matmul_cases(CASES)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[_id(c) for c in CASES])
def test_decode_kernel_matches_reference(results, index):
    result, case = results[index], CASES[index]
    assert result["case"] == case
    # Dispatch sends every weight format to decode.py here, except fp4 weights at some rows (bf16 or quantized
    # activations), which it sends to the Gluon kernel (decode_wgmma, not run by Triton's interpreter); those
    # cases pass decode.py configs.
    dispatched = sm90_decode_kernel(case["fa"], case["fb"], case["m"] * _batch(case))
    assert result["kernel"] == dispatched, result
    assert dispatched == "decode" or case.get("config"), case
    (launch,) = result["launches"]
    config = case.get("config")
    gemv = launch["name"].endswith("_gemv")
    if config:
        assert gemv == bool(config.get("gemv"))
        assert (launch.get("FMA"), launch["ATOMIC"], launch["SPLIT_K"]) == (
            None if gemv else config["fma"], config.get("atomic_split_k", False), config["split_k"])
        assert launch["BLOCK_K"] == config["block_k"]
    else:
        assert gemv == (case["m"] <= 4), launch  # the default: the GEMV up to 4 rows
    assert launch["ASM"] == bool(case.get("asm"))
    if gemv:
        assert launch["F16"] == bool(case.get("asm") and (config or {}).get("f16_decode"))
    if not gemv:
        assert launch["BLOCK_K"] == _block_k(case["fb"])
    assert result["finite"], result
    tolerance = 1e-5 if case["out_dtype"] == "float32" else 2 * 2.0**-8 + 1e-5
    assert result["rel_err"] < tolerance, result

