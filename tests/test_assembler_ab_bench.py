"""CPU checks of benchmarks/assembler_ab.py: the operands it hands both launches meet the Gluon block FP8
launcher's contract (dtypes, shapes, finite codes), so that the two builds it compares get valid inputs."""

import jax.numpy as jnp
import numpy as np

from benchmarks import assembler_ab as ab
from jax_blockscale._triton import block_fp8_gluon as bg
from jax_blockscale._triton.problem import GemmProblem, check_operands


def test_operands_meet_the_launch_contract():
    m, n, k = 256, 384, 512
    a, a_s, b, b_s, alpha = ab._operands(m, n, k)
    p = GemmProblem(1, False, m, n, k, "block_fp8", "block_fp8", "bf16")
    check_operands(p, a, a_s, b, b_s)  # raises on a wrong dtype
    bg.check_config(p, bg.default_config(p))
    assert a.shape == (1, m, k) and a_s.shape == (1, m, k // 128)
    assert b.shape == (n, k) and b_s.shape == (-(-n // 128), k // 128) and alpha.shape == (1,)
    for values in (a, b):
        assert np.isfinite(np.asarray(values.astype(jnp.float32))).all()
    for scales in (a_s, b_s):
        assert float(scales.min()) >= 0.5 and float(scales.max()) < 1.5
