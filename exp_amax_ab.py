"""Session 33 A/B (temporary): benchmarks.quant_variants with the block amax on the 16-bit patterns (default)
or, with F32AMAX=1, on the float32 values (the code before)."""
import os
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from jax_blockscale._triton import quantize_mx_gluon as qm

if os.environ.get("F32AMAX") == "1":
    @gluon.jit
    def _f32_amax(xr, x, AXIS: gl.constexpr):
        return gl.max(x.to(gl.uint32, bitcast=True) & 0x7FFFFFFF, axis=AXIS)
    qm.quantize_mx_t_kernel.fn.__globals__["_amax_bits"] = _f32_amax

from benchmarks import quant_variants  # noqa: E402

sys.exit(quant_variants.main())
