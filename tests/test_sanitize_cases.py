"""CPU check of benchmarks/sanitize.py's cases: each one runs the kernel family it is labelled with on
sm_90 (dispatch's pick, or a forced config its kernel accepts), so a compute-sanitizer run on the device
cannot spend its time on a harness mistake."""

import importlib

import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from benchmarks import sanitize
from jax_blockscale._triton.problem import GemmProblem
from jax_blockscale.api import operand_kind
from jax_blockscale.primitive import _K_ALIGN


@pytest.mark.parametrize("small", [False, True], ids=["full", "small"])
def test_every_case_runs_its_family_on_sm90(small):
    families = set()
    for fam, label, fa, fb, a_shape, n, config in sanitize._matmul_cases(small):
        k = a_shape[-1]
        a = jnp.ones(a_shape, jnp.float32)
        a = a.astype(jnp.bfloat16) if fa == "bf16" else jb.quantize_operand(a, fa, side="a")
        b = jb.quantize_operand(jnp.ones((n, k), jnp.float32), fb, side="b")
        rows = int(np.prod(a_shape[:-1]))
        if config is None or config.kernel is None:
            assert jb.explain(a, b, rows=rows, target="sm_90").kernel == fam, (fam, label)
        if config is not None:
            assert config.kernel in (None, fam), (fam, label)
            batch = int(np.prod(a_shape[:-2], dtype=np.int64)) if len(a_shape) > 2 else 1
            p = GemmProblem(batch, False, a_shape[-2], n, -(-k // _K_ALIGN) * _K_ALIGN, operand_kind(a, "a"),
                            operand_kind(b, "b"), "fp32")
            importlib.import_module(f"jax_blockscale._triton.{fam}").check_config(p, config)
        families.add(fam)
    assert families == set(sanitize.FAMILIES) - {"quantize", "dot_scaled"}
