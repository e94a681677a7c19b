"""The one-pass quantization kernel against the jnp quantizer, bit for bit, on the CPU.

The kernel runs in Triton's interpreter (numpy, IEEE without flush to zero) in a subprocess, since the
interpreter must be chosen before triton.language is imported; inputs hold every special value except
float32 subnormals, which XLA:CPU flushes (tests/test_gpu_quantize.py covers those on a GPU, where both
keep them). Each case checks the row side (along C) and the transposed column side (along R) together.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")

HERE = pathlib.Path(__file__).parent

MX = ["mxfp8", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]
CASES = []
seed = 0
for rounding in ("floor", "ceil", "even", "rceil"):
    for i, name in enumerate(MX):
        seed += 1
        col = MX[(i + 1) % len(MX)]
        CASES.append(dict(row=[name, None], col=[col, None], rounding=rounding, dtype=["f32", "bf16", "f16"][seed % 3],
                          shape=[2, 72, 150], seed=seed))
CASES += [
    dict(row=["nvfp4", None], col=["mxfp8", None], rounding="rceil", dtype="bf16", shape=[3, 40, 100], seed=101),
    dict(row=["nvfp4", None], col=["nvfp4", None], rounding="rceil", dtype="f32", shape=[64, 96], seed=102),
    dict(row=["nvfp4", None], col=None, rounding="rceil", dtype="f16", shape=[5, 48], seed=103),
    dict(row=["fp8_block", [1, 128]], col=["fp8_block", [128, 128]], rounding="rceil", dtype="bf16",
         shape=[200, 300], seed=104),
    dict(row=["fp8_block", [128, 128]], col=["fp8_block", [128, 128]], rounding="rceil", dtype="f32",
         shape=[130, 260], seed=105),
    dict(row=["fp8_block", [1, 128]], col=["fp8_block", [1, 128]], rounding="rceil", dtype="f32",
         shape=[2, 129, 131], seed=106),
    dict(row=["fp8_block", [256, 256]], col=None, rounding="rceil", dtype="bf16", shape=[300, 270], seed=107),
    dict(row=None, col=["mxfp4", None], rounding="rceil", dtype="bf16", shape=[33, 64], seed=108),
]
# Every way the column side can be computed (quantize_kernels.COL_MODES), beside the default each case
# above takes: x^T row-wise ("trans"), down x's columns then the codes transposed ("direct"), the row
# side's codes transposed ("reuse", square fp8 tiles).
CASES += [
    dict(row=["mxfp8", None], col=["mxfp8", None], rounding="rceil", dtype="bf16", shape=[2, 72, 150], seed=201,
         col_mode="direct"),
    dict(row=["mxfp8", None], col=["mxfp6_e3m2", None], rounding="even", dtype="f32", shape=[72, 150], seed=202,
         col_mode="direct"),
    dict(row=None, col=["mxfp4", None], rounding="floor", dtype="f16", shape=[100, 40], seed=203, col_mode="direct"),
    dict(row=["nvfp4", None], col=["nvfp4", None], rounding="rceil", dtype="f32", shape=[64, 96], seed=204,
         col_mode="direct"),
    dict(row=["fp8_block", [1, 128]], col=["fp8_block", [1, 128]], rounding="rceil", dtype="bf16",
         shape=[2, 129, 131], seed=205, col_mode="direct"),
    dict(row=["fp8_block", [128, 128]], col=["fp8_block", [128, 128]], rounding="rceil", dtype="f32",
         shape=[130, 260], seed=206, col_mode="trans"),
    dict(row=["fp8_block", [128, 128]], col=["fp8_block", [128, 128]], rounding="rceil", dtype="bf16",
         shape=[130, 260], seed=207, col_mode="direct"),
    # Program tiles one block high: the column blocks span the tile (2D reductions, no 4D view).
    dict(row=["mxfp8", None], col=["mxfp4", None], rounding="rceil", dtype="bf16", shape=[2, 72, 150], seed=208,
         col_mode="direct", tile=[32, 128]),
    dict(row=["nvfp4", None], col=["nvfp4", None], rounding="rceil", dtype="f32", shape=[40, 100], seed=209,
         col_mode="direct", tile=[16, 64]),
]

# Each side in passes over strips of the program tile (plan strips=, x re-read per strip): fp8 1x128 with its
# 128 x 1 transposed blocks (the 128 x 128 tile), MX and nvfp4 one-block-high tiles, both column modes.
CASES += [
    dict(row=["fp8_block", [1, 128]], col=["fp8_block", [1, 128]], rounding="rceil", dtype="bf16",
         shape=[2, 129, 131], seed=301, col_mode="direct", strips=2),
    dict(row=["fp8_block", [1, 128]], col=["fp8_block", [1, 128]], rounding="rceil", dtype="f32",
         shape=[130, 260], seed=302, col_mode="direct", strips=4),
    dict(row=["fp8_block", [1, 128]], col=["fp8_block", [1, 128]], rounding="rceil", dtype="f16",
         shape=[129, 140], seed=303, col_mode="trans", strips=2),
    dict(row=["mxfp8", None], col=["mxfp8", None], rounding="rceil", dtype="bf16", shape=[2, 72, 300], seed=304,
         col_mode="direct", strips=2),
    dict(row=["nvfp4", None], col=["nvfp4", None], rounding="rceil", dtype="f32", shape=[40, 300], seed=305,
         col_mode="direct", strips=2),
]

# The float64 element quotients (plan div="f64", the jnp quantizer's own arithmetic) beside the default
# float32 ones, on the nvfp4 / fp8_block cases above.
CASES += [dict(c, div="f64", seed=c["seed"] + 1000) for c in CASES
          if any(side and side[0] in ("nvfp4", "fp8_block") for side in (c["row"], c["col"]))]

# The hardware fp8 encoder (plan cvt="hw": cvt.rn.satfinite + fix-up, emulated by tests/_ptx_emulator.py) on
# every case with an e4m3 / e5m2 side: MX (each rounding), fp8_block through both quotient paths, each
# column mode; fp4 / fp6 sides beside them keep the integer encoder. Inputs hold NaN, +-Inf, saturating
# values and signed zeros (tests/_quant_inputs.py).
# Column sides of 1-byte codes in the "direct" / "reuse" modes can store through the word transpose (plan
# t_words, `_store_values_t_words`): with cvt "int" its shift / mask byte transpose (gfx950's), and below,
# as cvt "hw"'s default, its prmt one (emulated).
CASES += [dict(c, t_words=True, seed=c["seed"] + 3000) for c in CASES
          if c.get("col_mode") in ("direct", "reuse") and c["col"] and c["col"][0] not in ("mxfp4", "nvfp4")]
_FP8 = ("mxfp8", "mxfp8_e5m2", "fp8_block")
CASES += [dict(c, cvt="hw", seed=c["seed"] + 2000) for c in CASES
          if any(side and side[0] in _FP8 for side in (c["row"], c["col"])) and "t_words" not in c]
# ... and cvt "hw" with the byte transpose
CASES += [dict(c, cvt="hw", t_words=False, seed=c["seed"] + 4000) for c in CASES
          if c.get("t_words") is True]


@pytest.fixture(scope="module")
def results():
    # The checkout under test first on the path (the subprocess would otherwise import an installed copy).
    path = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", JAX_PLATFORMS="cpu", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, str(HERE / "_quantize_kernel_check.py"), json.dumps(CASES)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"{c['row'] and c['row'][0]}-{c['col'] and c['col'][0]}-{c['rounding']}-{c['dtype']}"
                              f"{'-' + c['col_mode'] if 'col_mode' in c else ''}{'-' + c['div'] if 'div' in c else ''}{'-cvt_' + c['cvt'] if 'cvt' in c else ''}{'-wordsT' if c.get('t_words') else '-bytesT' if c.get('t_words') is False else ''}{'-%dx%d' % tuple(c['tile']) if 'tile' in c else ''}{'-strips%d' % c['strips'] if 'strips' in c else ''}"
                              for c in CASES])
def test_kernel_matches_jnp_quantizer_bitwise(results, index):
    result = results[index]
    assert result["case"] == CASES[index]
    assert result["mismatches"] == [0, 0, 0, 0], result
