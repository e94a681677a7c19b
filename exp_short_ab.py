"""Session 33 A/B (temporary): runs benchmarks.quant_variants with nvfp4's short path (default) or, with
GENERAL=1, with `_short_path` patched to false (every program on the general path, the code before)."""
import os
import sys

import triton

from jax_blockscale._triton import quantize_mx_gluon as qm

if os.environ.get("GENERAL") == "1":
    @triton.jit
    def _never(ts):
        return ts != ts  # false for every scale this benchmark passes (finite)
    qm.quantize_mx_t_kernel.fn.__globals__["_short_path"] = _never

from benchmarks import quant_variants  # noqa: E402

sys.exit(quant_variants.main())
