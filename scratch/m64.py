import os
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")
import jax, jax.numpy as jnp, numpy as np, torch
import jax_blockscale as jb
from jax_blockscale._triton import decode_wgmma as dw
from jax_blockscale._triton.problem import GemmProblem
from benchmarks.decode import _weights, _activation, _checked, kernel_us, _XLA_BF16
for n, k in ((7168, 4096), (8192, 8192)):
    bws = _weights("bf16", n, k, 0)
    for fb, kind in (("mxfp4", "e2m1"), ("nvfp4", "nvfp4")):
        ws = _weights(fb, n, k, 1)
        for m in (17, 32, 64):
            xa = _activation("bf16", m, k)
            xla = kernel_us(_XLA_BF16, [(xa, w) for w in bws], torch)
            disp = kernel_us(jax.jit(lambda x, w: jb.matmul(x, w)), [(xa, w) for w in ws], torch)
            picked = jb.explain(xa, ws[0]).kernel
            p = GemmProblem(1, False, m, n, k, "bf16", kind, "bf16")
            line = f"{n}x{k} {fb} M {m}: XLA {xla:.2f}  dispatch({picked}) {disp:.2f}"
            for cfg in (dw.default_config(p), dw.default_config(p).replace(num_warps=8, block_n=128)):
                try:
                    dw.check_config(p, cfg)
                    err = _checked(xa, ws[0], cfg)
                    t = kernel_us(jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg)), [(xa, w) for w in ws], torch)
                    line += f"  wgmma(bm{cfg.block_m} s{cfg.split_k} w{cfg.num_warps}) {t:.2f} err {err:.1e}"
                except Exception as e:
                    line += f"  wgmma w{cfg.num_warps} {type(e).__name__}: {str(e)[:60]}"
            print(line, flush=True)
        del ws
    del bws
