"""Scratch: one decode_wgmma launch per case (M x N x K [: group_m]), for Nsight Compute."""
import sys
import jax, jax.numpy as jnp
import jax_blockscale as jb
from jax_blockscale._triton import decode_wgmma as dw
from jax_blockscale._triton.problem import GemmProblem
for spec in sys.argv[1].split(","):
    shape, _, gm = spec.partition(":")
    m, n, k = (int(v) for v in shape.split("x"))
    w = jb.quantize_operand(jax.random.normal(jax.random.key(1), (n, k), jnp.float32) / 64, "mxfp4", side="b")
    x = jax.random.normal(jax.random.key(2), (m, k), jnp.float32).astype(jnp.bfloat16)
    cfg = dw.default_config(GemmProblem(1, False, m, n, k, "bf16", "e2m1", "bf16")).replace(group_m=int(gm or 1))
    f = jax.jit(lambda x, w: jb.matmul(x, w, config=cfg))
    print(spec, cfg, flush=True)
    for _ in range(3):
        jax.block_until_ready(f(x, w))
