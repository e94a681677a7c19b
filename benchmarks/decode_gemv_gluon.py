"""An experiment: the one-row fp4 GEMV with its layouts chosen by hand (Gluon), so that the activations reach each
thread straight from global memory (issue #12, M = 1).

    python -m benchmarks.decode_gemv_gluon                               # 7168x4096, 7168x2048, 8192x8192; mxfp4
    python -m benchmarks.decode_gemv_gluon --configs n8:k4096:w8:r2,n16:k1024:w4:r1:p
    python -m benchmarks.decode_gemv_gluon --sass                        # CPU: SASS per weight element

The question. Nsight Compute on the dispatched GEMV (`decode.gemv_kernel`, mxfp4 7168 x 4096, H200, session 40):
issue slots 54% busy, 10.1 cycles between a warp's instructions, of which 1.7 stalled at a barrier, 1.0 on MIO
throttle and 0.7 on short scoreboard, with 45% excess shared-memory wavefronts (bank conflicts). Triton loads the
activation row in one layout and moves it through shared memory into the layout of the products (`convert_layout`,
STS / bar.sync / LDS), and moves the group sums through shared memory again to meet their scales. Gluon lets the
loads use the products' layouts: the weight tile (rows, groups, bytes) with each thread's 16 bytes one vector, the
activations (groups, bytes, 2) as the slice of that layout without the rows (each thread's 32 values are 64
contiguous bytes: four 16-byte loads, shared by the rows it holds), the scales (rows, groups) as its slice without
the bytes. No shared memory, no barrier until the row sums.

The arithmetic is the GEMV's (`decode._FP4_F32_PTX`: 2**-6 times the e2m1 values as fp32, one FMA per element,
each group's sum times 2**6 and its scale). Config `nR:kB:wW:rWR[:p]`: R rows per program, B codes per K tile,
W warps of which WR along the rows, `p`: the next K tile's codes and scales loaded before this one is used.

Result (H200, 2026-12-02, session 40, `benchmarks/results/decode_gemv_experiments_h200_2026-12-02_session40.md`): not
adopted. Correct (relative error 5-8e-8) and no shared memory but the row sums' (128-256 bytes); 5.5 SASS per weight
element for the whole kernel at n8:k4096:w8:r2 (the dispatched GEMV: 5.3). Against the dispatched GEMV in the same
run: 7168 x 4096 mxfp4 7.99 us at best (n16:k1024:w4:r4:p, 1.05x; 8.31-9.61 elsewhere), 7168 x 2048 5.10 against
5.02 (0.98x), 8192 x 8192 14.25 against 14.96 (n8:k2048:w4:r2, 1.05x). Removing the shared-memory round trips and
barriers that Nsight Compute flagged gives at most 5%: they are not what bounds the GEMV.
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")  # torch (CUPTI) shares the GPU

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton import launch as scratch  # noqa: E402
from jax_blockscale._triton.decode import _FP4_F32_PTX, tensor_scale_operands  # noqa: E402
from jax_blockscale._triton.problem import NVFP4  # noqa: E402
from jax_blockscale._triton.upcast import scales_to_f32  # noqa: E402

KINDS = {"mxfp4": "e2m1", "nvfp4": NVFP4}
DEFAULT_CONFIGS = "n8:k4096:w8:r2,n8:k4096:w4:r1,n16:k4096:w8:r2,n8:k2048:w4:r1:p,n16:k1024:w4:r1:p"


@gluon.jit
def _load_tile(w_ptr, s_ptr, rows_w, rows_s, g_w, b_w, g_s, k0, K: gl.constexpr, GROUP: gl.constexpr,
               BPG: gl.constexpr, W_KIND: gl.constexpr):
    """The K tile at k0: codes (R, G, BPG) uint8 and raw scales (R, G), each in its layout."""
    codes = gl.load(w_ptr + rows_w * (K // 2) + (k0 // 2 + g_w * BPG + b_w))
    raw = gl.load(s_ptr + rows_s * (K // GROUP) + (k0 // GROUP + g_s))
    return codes, raw


@gluon.jit
def gemv_gluon_kernel(w_ptr, s_ptr, x_ptr, a_ts_ptr, b_ts_ptr, out_ptr,
                      N: gl.constexpr, K: gl.constexpr, W_KIND: gl.constexpr, BLOCK_N: gl.constexpr,
                      BLOCK_K: gl.constexpr, WARPS_N: gl.constexpr, PREFETCH: gl.constexpr, WIDE: gl.constexpr):
    """out (1, N) = a_ts * b_ts * x (1, K) bf16 @ decode(w (N, K / 2), s).T, fp4 weights (mxfp4 / nvfp4).
    Grid (cdiv(N, BLOCK_N),); K in K / BLOCK_K tiles of BLOCK_K codes per row."""
    W: gl.constexpr = gl.num_warps()
    GROUP: gl.constexpr = 16 if W_KIND == "nvfp4" else 32
    BPG: gl.constexpr = GROUP // 2          # bytes per scale group
    VG: gl.constexpr = 16 // BPG            # groups per thread: one 16-byte vector
    G: gl.constexpr = BLOCK_K // GROUP
    K_TILES: gl.constexpr = K // BLOCK_K
    # (rows, groups, bytes, the two codes of a byte): each thread VG groups' 16 bytes of some rows
    L4: gl.constexpr = gl.BlockedLayout([1, VG, BPG, 2], [1, 32, 1, 1], [WARPS_N, W // WARPS_N, 1, 1], [3, 2, 1, 0])
    L3: gl.constexpr = gl.SliceLayout(3, L4)     # the codes and products (R, G, BPG)
    LS: gl.constexpr = gl.SliceLayout(2, L3)     # the scales and group sums (R, G)

    pid = gl.program_id(0)
    offs_n = pid * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LS))
    rows_s = (offs_n % N)[:, None]          # rows past N read a valid row; the store mask drops them
    rows_w = (pid * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))) % N
    rows_w = rows_w[:, None, None]
    if WIDE:
        rows_w = rows_w.to(gl.int64)
        rows_s = rows_s.to(gl.int64)
    g_w = gl.arange(0, G, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))[None, :, None]
    b_w = gl.arange(0, BPG, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :]
    g_s = gl.arange(0, G, layout=gl.SliceLayout(0, LS))[None, :]
    # The activations as 32-bit pairs (element 2i in the low half, 2i + 1 in the high half: the low and the high
    # nibble of weight byte i), (G, BPG) in the products' layout without the rows: each thread's BPG words are
    # contiguous, so they load as 16-byte vectors; widening a bf16 half is one shift or mask (exact).
    LX: gl.constexpr = gl.SliceLayout(0, L3)
    x32_ptr = x_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
    offs_x = (gl.arange(0, G, layout=gl.SliceLayout(1, LX))[:, None] * BPG
              + gl.arange(0, BPG, layout=gl.SliceLayout(0, LX))[None, :])

    acc = gl.zeros([BLOCK_N, G], gl.float32, layout=LS)
    codes, raw = _load_tile(w_ptr, s_ptr, rows_w, rows_s, g_w, b_w, g_s, 0, K, GROUP, BPG, W_KIND)
    for kt in gl.static_range(K_TILES):
        k0 = kt * BLOCK_K
        if PREFETCH:
            # the next tile's loads go out before this one's arithmetic (the last tile re-reads itself)
            k_next = gl.minimum(kt + 1, K_TILES - 1) * BLOCK_K
            next_codes, next_raw = _load_tile(w_ptr, s_ptr, rows_w, rows_s, g_w, b_w, g_s, k_next, K, GROUP, BPG,
                                              W_KIND)
        elif kt > 0:
            codes, raw = _load_tile(w_ptr, s_ptr, rows_w, rows_s, g_w, b_w, g_s, k0, K, GROUP, BPG, W_KIND)
        x32 = gl.load(x32_ptr + k0 // 2 + offs_x)                            # (G, BPG) bf16 pairs
        x_lo = (x32 << 16).to(gl.float32, bitcast=True)
        x_hi = (x32 & -65536).to(gl.float32, bitcast=True)                   # & 0xFFFF0000
        w_lo, w_hi = gl.inline_asm_elementwise(_FP4_F32_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r", [codes],
                                               dtype=(gl.float32, gl.float32), is_pure=True, pack=4)
        part = gl.sum(w_lo * x_lo[None, :, :], axis=2) + gl.sum(w_hi * x_hi[None, :, :], axis=2)
        acc += (part * 64.0) * scales_to_f32(raw, W_KIND)   # 2**6: what _FP4_F32_PTX's values lack (exact)
        if PREFETCH:
            codes = next_codes
            raw = next_raw
    total = gl.sum(acc, axis=1)
    alpha = gl.load(a_ts_ptr) * gl.load(b_ts_ptr)
    gl.store(out_ptr + offs_n, (total * alpha).to(out_ptr.dtype.element_ty), mask=offs_n < N)


def parse_config(spec: str) -> dict:
    """'n8:k4096:w8:r2:p' -> 8 rows x 4096 codes per K tile, 8 warps, 2 of them along the rows, prefetch."""
    m = re.fullmatch(r"n(\d+):k(\d+):w(\d+):r(\d+)(:p)?", spec)
    if m is None:
        raise ValueError(f"config {spec!r}: expected nR:kB:wW:rWR[:p], e.g. n8:k4096:w8:r2")
    cfg = dict(zip(("block_n", "block_k", "warps", "warps_n"), (int(v) for v in m.groups()[:4])))
    return dict(cfg, prefetch=m.group(5) is not None)


def describe(cfg: dict) -> str:
    return "n{block_n}:k{block_k}:w{warps}:r{warps_n}".format(**cfg) + (":p" if cfg["prefetch"] else "")


def check(rows: int, n: int, k: int, cfg: dict, fmt: str = "mxfp4") -> None:
    """Refuses what the kernel cannot take, before anything compiles."""
    if rows != 1:
        raise ValueError(f"the Gluon GEMV takes one activation row, got {rows}")
    for name in ("block_n", "block_k", "warps", "warps_n"):
        v = cfg[name]
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if cfg["warps_n"] > cfg["warps"] or cfg["warps_n"] > cfg["block_n"]:
        raise ValueError(f"warps along the rows ({cfg['warps_n']}) must not exceed the warps ({cfg['warps']}) "
                         f"or the rows ({cfg['block_n']})")
    group = 16 if fmt == "nvfp4" else 32
    threads_k = 32 * cfg["warps"] // cfg["warps_n"]   # threads along K, 16 bytes (32 codes) each
    if k % cfg["block_k"] or cfg["block_k"] < 32 * threads_k or cfg["block_k"] % group:
        raise ValueError(f"block_k ({cfg['block_k']}) must divide K ({k}) and hold 32 codes for each of the "
                         f"{threads_k} threads along K")


def launch(x: jax.Array, w: "jb.BlockScaledArray", cfg: dict, out_dtype=jnp.bfloat16) -> jax.Array:
    """x (1, K) bf16 @ w (N, K) mxfp4 / nvfp4 (quantize_operand(..., side="b")).T -> (1, N)."""
    if w.fmt.name not in KINDS:
        raise ValueError(f"formats {tuple(KINDS)}, got {w.fmt.name!r}")
    (rows, _), (n, k) = x.shape, w.shape
    check(rows, n, k, cfg, w.fmt.name)
    a_ts, b_ts = tensor_scale_operands(jnp.ones((1,), jnp.float32), 1.0, w.tensor_scale)
    (out,) = scratch.scratch_call(
        gemv_gluon_kernel, w.values, w.scales, x, a_ts, b_ts,
        out_shape=[jax.ShapeDtypeStruct((1, n), out_dtype)], grid=(triton.cdiv(n, cfg["block_n"]),),
        num_warps=cfg["warps"], num_stages=1, compute_capability=90, name=f"gemv_gluon_{KINDS[w.fmt.name]}",
        N=n, K=k, W_KIND=KINDS[w.fmt.name], BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"],
        WARPS_N=cfg["warps_n"], PREFETCH=cfg["prefetch"], WIDE=n * (k // 2) >= 2**31)
    return out


def sass(configs, kinds, k: int = 4096, n: int = 7168) -> None:
    """CPU: compile for sm_90; registers, shared memory and SASS per weight element (whole kernel)."""
    from benchmarks.sass_quant import kernel_summary
    from jax_blockscale._triton.compile import compile_kernel

    for kind in kinds:
        for cfg in configs:
            sig = dict(w_ptr="*u8", s_ptr="*fp8e4nv" if kind == "nvfp4" else "*u8", x_ptr="*bf16",
                       a_ts_ptr="*fp32", b_ts_ptr="*fp32", out_ptr="*bf16")
            ck = compile_kernel(gemv_gluon_kernel, target="sm_90", signature=sig, num_warps=cfg["warps"],
                                num_stages=1, constexprs=dict(N=n, K=k, W_KIND=KINDS[kind], BLOCK_N=cfg["block_n"],
                                                              BLOCK_K=cfg["block_k"], WARPS_N=cfg["warps_n"],
                                                              PREFETCH=cfg["prefetch"], WIDE=False))
            print(f"{kind} {describe(cfg)}: " + kernel_summary(ck, 32 * cfg["warps"] / (cfg["block_n"] * k)))


def main(argv=None) -> None:
    from .decode import experiment_main

    experiment_main(argv, __doc__.split("\n")[0], shapes="7168x4096,7168x2048,8192x8192", formats="mxfp4",
                    configs=DEFAULT_CONFIGS, config_help="nR:kB:wW:rWR[:p],... (parse_config)", parse=parse_config,
                    sass=sass, variant=lambda c, fmt: (describe(c), lambda n, k: check(1, n, k, c, fmt),
                                                       lambda x, w, dtype: launch(x, w, c, dtype)))


if __name__ == "__main__":
    main()
