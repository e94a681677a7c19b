"""The skip every lowering-through-jax-triton test module starts with, in one place."""

import pytest


def require_jax_triton():
    """`jax_blockscale._triton.jt` once jax-triton imports (it needs a GPU jaxlib or the CUDA plugin);
    otherwise skips the calling test module."""
    pytest.importorskip("triton")
    jt = pytest.importorskip("jax_blockscale._triton.jt")
    try:
        jt.jax_triton()
    except ImportError as e:  # pragma: no cover - depends on the install
        pytest.skip(f"jax-triton cannot import here: {e}", allow_module_level=True)
    return jt


def lowered_for_cuda(fn, *args):
    """`jax.jit(fn)` traced on `args` and lowered for cuda (no GPU needed); skips without jax-triton."""
    import jax

    require_jax_triton()
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
