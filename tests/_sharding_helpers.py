"""Helpers shared by the sharding tests: placing operands on a mesh, the collectives in compiled HLO, and
the opaque CPU GEMM (see tests/test_sharding.py's docstring for why the GEMM must be opaque on CPU)."""

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_blockscale as jb
from jax_blockscale import primitive

GATHERS = ("all-gather", "all-to-all", "collective-permute")


def put(mesh, x, spec, scale_spec=None):
    """Places values and scales with the same spec (scales shard with their values); scalars replicate."""
    def leaf(t, s):
        return jax.device_put(t, NamedSharding(mesh, s if t.ndim else P()))
    if isinstance(x, jb.BlockScaledArray):
        ts = None if x.tensor_scale is None else leaf(x.tensor_scale, P())
        scale_spec = spec if scale_spec is None else scale_spec
        return jb.BlockScaledArray(leaf(x.values, spec), leaf(x.scales, scale_spec), x.fmt, x.axis,
                                   x.length, ts)
    return leaf(x, spec)


def check(out, ref, exact: bool) -> None:
    """Bitwise equal, or (scales that are not powers of two: the float32 sums round by order) within
    rtol 1e-5 and 1e-5 of the largest |ref|."""
    out, ref = np.asarray(out), np.asarray(ref)
    if exact:
        np.testing.assert_array_equal(out, ref)
    else:
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def collectives(compiled_text: str) -> set:
    return set(re.findall(r"\b(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)\b",
                          compiled_text))


def run(fn, args, out_sharding=None):
    """`jax.jit(fn)(*args)` and the collectives its compiled HLO contains."""
    jitted = jax.jit(fn, out_shardings=out_sharding)
    return jitted(*args), collectives(jitted.lower(*args).compile().as_text())


def _opaque(x):
    """x, through a LAPACK custom call that XLA cannot partition: one tridiagonal system over every element
    (identity matrix, so the solve is exact). Any sharding of x is gathered in front of it."""
    flat = x.reshape(-1)
    one, zero = jnp.ones_like(flat), jnp.zeros_like(flat)
    return jax.lax.linalg.tridiagonal_solve(zero, one, zero, flat[:, None]).reshape(x.shape)


def _opaque_lowering(ctx, *args, a, b, out_dtype, transpose_out=False, **_):
    def gemm(a_values, a_scales, a_ts, b_values, b_scales, b_ts):
        af = _opaque(primitive._dequantized(a_values, a_scales, a_ts, a))
        bf = _opaque(primitive._dequantized(b_values, b_scales, b_ts, b))
        out = jnp.einsum("...mk,...nk->" + ("...nm" if transpose_out else "...mn"), af, bf,
                         precision=jax.lax.Precision.HIGHEST)
        return out.astype(out_dtype)
    return mlir.lower_fun(gemm, multiple_results=False)(ctx, *args)


@contextlib.contextmanager
def partition_callback_under_mesh(mesh):
    """Traces custom_partitioning's per-device function under `mesh`'s abstract mesh, as jax 0.11 does
    with the caller's `jax.set_mesh` (older jax traces it under none), so that CPU CI on older jax covers
    it: there, Explicit axes put sharding ops into the partitioned program, which GPUs cannot compile."""
    from jax._src import custom_partitioning as cp  # the callback's tracing is not public API

    make_jaxpr = cp.api.make_jaxpr

    def under_mesh(fn, **kwargs):
        trace = make_jaxpr(fn, **kwargs)

        def traced(*args):
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
                return trace(*args)
        return traced

    cp.api.make_jaxpr = under_mesh
    try:
        yield
    finally:
        cp.api.make_jaxpr = make_jaxpr


@contextlib.contextmanager
def opaque_cpu_gemm():
    """The primitive's CPU lowering as an unpartitionable GEMM, as the Triton kernel is on a GPU."""
    mlir.register_lowering(primitive.blockscaled_matmul_p, _opaque_lowering, platform="cpu")
    try:
        yield
    finally:
        mlir.register_lowering(primitive.blockscaled_matmul_p, primitive._cpu_lowering, platform="cpu")
