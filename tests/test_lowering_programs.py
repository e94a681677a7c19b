"""Whole JAX programs lowered on a CPU machine for MI355 (`rocm`, gfx950) and Blackwell (`cuda`, sm_100),
with the native block-scaled instruction asserted in every kernel the program embeds.

Programs: plain matmul for every MX pair, nvfp4 and block FP8; vmap; value_and_grad of a recipe; a Flax
`Dense` forward + backward; and a program partitioned over a CPU mesh. Nothing here runs a kernel: for
`rocm` the kernels are compiled to AMDGCN/hsaco for the target (`_triton/launch.py`), for `cuda` to PTX
through jax-triton. jax lowers for `rocm` without the ROCm plugin; the serializer of the custom call is
jaxlib's `gpu_triton`, which on a CPU machine comes from the CUDA plugin (the ROCm plugin's needs
libamdhip64), so these tests need what tests/test_lowering_primitive.py needs.

Recipes and Flax layers take no `target=`: they detect it from the device the program is lowered for. Here
that device is a stand-in (`_stand_in`) that target detection reads (platform, device kind, arch); after
detection the lowering is the same device-free path as with `target=`.
"""

from __future__ import annotations

import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_blockscale as jb
from jax_blockscale import primitive

from _jax_triton import require_jax_triton

jt = require_jax_triton()
from jax._src.lib import gpu_triton  # noqa: E402

if not hasattr(gpu_triton, "TritonKernel"):  # pragma: no cover - depends on the install
    pytest.skip("jaxlib's gpu_triton has no Triton call serializer (install jax-cuda13-plugin)",
                allow_module_level=True)

PLATFORM = {"gfx950": "rocm", "sm_100": "cuda"}
TARGETS = tuple(PLATFORM)
MX_PAIRS = [("mxfp8", "mxfp8"), ("mxfp8_e5m2", "mxfp8"), ("mxfp6_e2m3", "mxfp6_e3m2"), ("mxfp8", "mxfp4"),
            ("mxfp4", "mxfp4")]
PAIRS = MX_PAIRS + [("nvfp4", "nvfp4"), ("fp8_block", "fp8_block")]

_GFX950_SCALED = re.compile(r"v_mfma_scale_f32_\d+x\d+x\d+_f8f6f4")
_GFX950_FP8 = re.compile(r"v_mfma_f32_\d+x\d+x\d+_(?:f8f6f4|fp8_fp8)")
_GFX950_BF16 = re.compile(r"v_mfma_f32_\d+x\d+x\d+_?bf16")


def _kind(fmt: str) -> str:
    return "fp8_block" if fmt == "fp8_block" else "nvfp4" if fmt == "nvfp4" else "mx"


def _check_native(target: str, kind: str, asm: str, pair=None) -> None:
    """`asm` holds the native instruction for `kind` on `target` (gfx950 nvfp4: the upcast, see README)."""
    if target == "gfx950":
        mfma = set(re.findall(r"v_mfma\w*", asm))
        if kind == "mx":
            assert mfma and all(_GFX950_SCALED.fullmatch(i) for i in mfma), (pair, mfma)
        elif kind == "fp8_block":
            assert mfma and all(_GFX950_FP8.fullmatch(i) for i in mfma), (pair, mfma)
        else:  # Triton 3.6 cannot compile nvfp4 dot_scaled for gfx950: decoded to bf16 in the kernel
            assert mfma and all(_GFX950_BF16.fullmatch(i) for i in mfma), (pair, mfma)
        return
    assert "tcgen05.mma" in asm, pair
    want = {"mx": "kind::mxf4.block_scale" if pair == ("mxfp4", "mxfp4") else "kind::mxf8f6f4.block_scale",
            "nvfp4": "kind::mxf4nvf4.block_scale", "fp8_block": "kind::f8f6f4"}[kind]
    assert want in asm, (pair, want)


def _kernels(lowered, target: str) -> list[str]:
    if PLATFORM[target] == "rocm":
        return jt.lowered_amdgcn(lowered)
    return [k.decode("latin-1") for k in jt.lowered_kernels(lowered)]


def _lower(fn, *args, target: str):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(PLATFORM[target],))


def _q(shape, fmt, side):
    x = jax.random.normal(jax.random.key(len(shape)), shape, jnp.float32)
    return jb.quantize_operand(x, fmt, side=side)


_STAND_INS = {
    "gfx950": types.SimpleNamespace(platform="rocm", device_kind="AMD Instinct MI355X",
                                    compute_capability="gfx950"),
    "sm_100": types.SimpleNamespace(platform="cuda", device_kind="NVIDIA B200", compute_capability="10.0"),
}


@pytest.fixture
def stand_in(monkeypatch):
    """Makes the matmul primitive's target detection see a `target` device (see the module docstring)."""
    def use(target: str) -> None:
        monkeypatch.setattr(primitive, "_lowering_device", lambda ctx: _STAND_INS[target])
    return use


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa,fb", PAIRS)
def test_matmul(fa, fb, target):
    a, b = _q((2, 100, 512), fa, "a"), _q((192, 512), fb, "b")
    (asm,) = _kernels(_lower(lambda a, b: jb.matmul(a, b, target=target), a, b, target=target), target)
    _check_native(target, _kind(fa), asm, (fa, fb))


@pytest.mark.parametrize("target", TARGETS)
def test_vmap_over_weights_is_one_native_launch(target):
    a = _q((3, 64, 256), "mxfp8", "a")
    ws = jax.vmap(lambda t: jb.quantize(t, "mxfp8"))(jax.random.normal(jax.random.key(1), (3, 128, 256)))
    fn = jax.vmap(lambda a, b: jb.matmul(a, b, target=target))
    (asm,) = _kernels(_lower(fn, a, ws, target=target), target)
    _check_native(target, "mx", asm)


def _loss_and_grads(f):
    return jax.value_and_grad(lambda *args: f(*args).astype(jnp.float32).sum(), argnums=(0, 1))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("recipe,kind", [("mxfp8", "mx"), ("fp8_deepseek", "fp8_block")])
def test_recipe_value_and_grad(recipe, kind, target, stand_in):
    """fprop, dgrad and wgrad: three native launches (beside the three one-pass quantization kernels of
    x, W and dy, each writing both layouts)."""
    stand_in(target)
    x = jax.random.normal(jax.random.key(0), (2, 64, 256), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(1), (256, 256), jnp.bfloat16)
    kernels = _kernels(_lower(_loss_and_grads(lambda x, w: jb.recipe_matmul(x, w, recipe)), x, w,
                              target=target), target)
    quantizers = [k for k in kernels if "quantize_kernel" in k]
    kernels = [k for k in kernels if "quantize_kernel" not in k]
    assert len(quantizers) == 3 and len(kernels) == 3
    for asm in kernels:
        _check_native(target, kind, asm, recipe)


@pytest.mark.parametrize("target", TARGETS)
def test_flax_dense_forward_and_backward(target, stand_in):
    jbl = pytest.importorskip("jax_blockscale.nn.linen")
    layer = jbl.Dense(256, recipe="mxfp8", dtype=jnp.bfloat16)
    x = jax.random.normal(jax.random.key(0), (4, 32, 256), jnp.bfloat16)
    variables = layer.init(jax.random.key(1), x)  # on the CPU: the jnp reference
    stand_in(target)
    kernels = _kernels(_lower(_loss_and_grads(layer.apply), variables, x, target=target), target)
    quantizers = [k for k in kernels if "quantize_kernel" in k]
    kernels = [k for k in kernels if "quantize_kernel" not in k]
    assert len(quantizers) == 3 and len(kernels) == 3
    for asm in kernels:
        _check_native(target, "mx", asm)


def _compile_on_cpu(lowered, n_devices: int):
    """Runs XLA:CPU's compiler (and so its SPMD partitioner) on a module lowered for a GPU platform.

    custom_partitioning builds the per-device program only when XLA partitions, inside compilation, so
    lowering for a GPU alone leaves one `CustomSPMDPartitioning` call and no kernel. The partitioner calls
    the callback, which lowers the per-device program for the module's own platform (rocm or cuda), Triton
    kernels and collectives included; XLA:CPU then rejects the Triton custom call. Private jax API: skips
    if it moved."""
    try:
        from jax._src import compiler
        from jax._src.lib import xla_client as xc

        backend = jax.extend.backend.get_backend("cpu")
        devices = jax.devices("cpu")[:n_devices]
        options = compiler.get_compile_options(num_replicas=1, num_partitions=n_devices,
                                               device_assignment=np.array(devices).reshape(1, -1),
                                               backend=backend)
        options.executable_build_options.use_spmd_partitioning = True
        options.executable_build_options.use_shardy_partitioner = jax.config.jax_use_shardy_partitioner
        compile_ = backend.compile_and_load
        device_list = xc.DeviceList(tuple(devices))
    except (ImportError, AttributeError, TypeError) as e:  # pragma: no cover - depends on the jax version
        pytest.skip(f"jax's compile API differs here: {e}")
    return compile_(lowered.as_text(), device_list, options)


@pytest.mark.parametrize("target", TARGETS)
def test_partitioned_program_on_cpu_mesh(target, monkeypatch):
    """Data parallel over M and row parallel over K on a 2x4 CPU mesh: the per-device program the
    partitioner gets holds the native kernel on the local blocks and an all-reduce of its partial sums."""
    if len(jax.devices("cpu")) < 8:
        pytest.skip("needs 8 CPU devices (tests/conftest.py sets them up)")
    from jax._src import custom_partitioning as cp  # where the callback's program is built

    mesh = jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices("cpu")[:8])

    def put(x, spec):
        def leaf(t):
            return jax.device_put(t, NamedSharding(mesh, spec if t.ndim else P()))
        return jb.BlockScaledArray(leaf(x.values), leaf(x.scales), x.fmt, x.axis, x.length, x.tensor_scale)

    a = put(_q((256, 512), "mxfp8", "a"), P("data", "model"))
    b = put(_q((192, 512), "mxfp8", "b"), P(None, "model"))
    lowered = _lower(lambda a, b: jb.matmul(a, b, target=target), a, b, target=target)
    assert jt.lowered_kernels(lowered) == []
    assert "CustomSPMDPartitioning" in lowered.as_text()

    built = []
    build = cp.mlir.build_mlir_module_helper

    def recording(*args, **kwargs):
        module = build(*args, **kwargs)
        built.append(module)
        return module

    monkeypatch.setattr(cp.mlir, "build_mlir_module_helper", recording)
    with pytest.raises(Exception, match="triton_kernel_call"):
        _compile_on_cpu(lowered, 8)
    (program,) = built
    text = str(program)
    assert "stablehlo.all_reduce" in text or "all-reduce" in text
    (asm,) = _kernels(program, target)
    _check_native(target, "mx", asm)
    # The kernel works on the local blocks: 128 rows of a, K = 512 / 4 (padded to 256 for the kernel).
    assert re.search(r"tensor<128x128xf8E4M3FN>", text), "a's local block is not the kernel's operand"


def _fields(message: bytes) -> list[tuple[int, object]]:
    """(field number, value) of a protobuf message: varints as ints, length-delimited as bytes."""
    def varint(i):
        value = shift = 0
        while True:
            byte = message[i]
            value |= (byte & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if byte < 0x80:
                return value, i
    out, i = [], 0
    while i < len(message):
        key, i = varint(i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(i)
        elif wire == 2:
            size, i = varint(i)
            value, i = message[i:i + size], i + size
        else:  # pragma: no cover - jaxlib's call has no fixed-width fields here
            raise AssertionError(f"unexpected wire type {wire}")
        out.append((number, value))
    return out


def test_rocm_call_is_what_jaxlibs_hip_runtime_loads():
    """jaxlib's TritonAnyKernelCall (jaxlib/gpu/triton.proto): the kernel's `ptx` field is the path of an
    hsaco ELF for gfx950 (the HIP runtime reads and loads it), with the launcher's warps and grid and one
    pointer per operand and result."""
    from jax_blockscale._triton import dot_scaled_cdna4 as cdna4, launch
    from jax_blockscale._triton.problem import GemmProblem

    a, b = _q((100, 512), "mxfp8", "a"), _q((192, 512), "mxfp8", "b")
    (call,) = jt.lowered_kernels(_lower(lambda a, b: jb.matmul(a, b, target="gfx950"), a, b, target="gfx950"))
    kernel_call = dict(_fields(call))[1]
    fields = _fields(kernel_call)
    kernel = dict(_fields(dict(fields)[1]))
    path = kernel[4].decode()
    with open(path, "rb") as f:
        assert f.read(4) == b"\x7fELF"
    assert "amdgcn-amd-amdhsa--gfx950" in launch.hip_assembly(call)
    assert kernel[1] == b"scaled_gemm_kernel_cdna4"
    p = GemmProblem(1, False, 100, 192, 512, "e4m3", "e4m3", "bf16")
    config = cdna4.default_config(p)
    assert kernel[2] == config.num_warps
    grid = tuple(dict(fields).get(n, 0) for n in (2, 3, 4))
    assert grid == cdna4.grid(p, config)
    assert sum(1 for n, _ in fields if n == 5) == 6  # a, a scales, b, b scales, alpha, out
