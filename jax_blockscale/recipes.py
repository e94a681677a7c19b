"""Training and inference recipes: which format each of a dense layer's three GEMMs uses.

A dense layer `y = x W^T` (x (..., M, K), W (N, K)) runs three GEMMs, all in the NT form of
`jax_blockscale.matmul` (a (.., M, K) x b (.., N, K), both quantized along their last axis):

- fprop  y  (M, N) = x (M, K)   . W   (N, K)   -> a = x along K,     b = W along K
- dgrad  dx (M, K) = dy (M, N)  . W^T (K, N)   -> a = dy along N,    b = W^T along N
- wgrad  dW (N, K) = dy^T (N, M) . x^T (K, M)  -> a = dy^T along M,  b = x^T along M (batch dims fold into M)

A `Recipe` names the format of each operand (None: kept dense in its own dtype). `recipe_matmul` and
`quantized_dense` wrap the three GEMMs in one `jax.custom_vjp`, so the recipe's backward, not the
straight-through backward of `jax_blockscale.matmul`, is what differentiates. Every GEMM with a quantized
operand runs on the `blockscaled_matmul` primitive; a GEMM with two dense operands runs as a jnp dot with
float32 accumulation (the primitive needs one block-scaled side).

Built-in recipes (`get_recipe(name)`); scales of MX formats use `rounding="rceil"`, which never saturates:

| name | fprop (x, W) | dgrad (dy, W^T) | wgrad (dy^T, x^T) |
|---|---|---|---|
| bf16 | dense | dense | dense |
| mxfp8 | mxfp8_e4m3, mxfp8_e4m3 | mxfp8_e4m3, mxfp8_e4m3 | mxfp8_e4m3, mxfp8_e4m3 |
| mxfp8_e5m2_grads | mxfp8_e4m3, mxfp8_e4m3 | mxfp8_e5m2, mxfp8_e4m3 | mxfp8_e5m2, mxfp8_e4m3 |
| nvfp4 | nvfp4, nvfp4 | as mxfp8 | as mxfp8 |
| fp8_deepseek | fp8 1x128, fp8 128x128 | fp8 1x128, fp8 128x128 | fp8 1x128, fp8 128x128 |
| w4a8 (inference) | mxfp8_e4m3, mxfp4 | dense | dense |
| w4a16 (inference) | dense, mxfp4 | dense | dense |
| w8a16_fp8 (inference) | dense, fp8 128x128 | dense | dense |

`bf16` quantizes nothing: a plain dot in the operands' own dtype (bf16 in a bf16 model), the baseline.
Choices: gradients are e4m3 in `mxfp8` because a 32-element power-of-two block scale already supplies the
range that e5m2 buys per tensor, and e4m3's extra mantissa bit halves the error (the finding of NVIDIA's
MXFP8 pre-training recipe); `mxfp8_e5m2_grads` is the OCP/Transformer-Engine "hybrid" alternative.
`fp8_deepseek` quantizes the gradient side of wgrad in DeepSeek-V3's 1x128 groups, but x^T in 128x128 tiles
instead of 1x128: the native block-FP8 kernels pair a 1x128 `a` with a 128x128 `b`, and a 1x128 `b` would run
the jnp reference (see `explain`). nvfp4 trains its backward in mxfp8 (no stochastic rounding here). The
inference recipes backpropagate densely, straight-through (dgrad against the high-precision weight, or the
dequantized one when the weight is pre-quantized), so they can also be fine-tuned quantization-aware.

Residuals: the forward saves the wgrad operand x^T and the dgrad operand W^T already quantized when the
recipe quantizes them (about 1 byte per element instead of 2-4), else the high-precision tensors.

GEMM inputs (`Recipe.gemm_inputs`): Hopper has no tensor-core instruction that takes MX or nvfp4 scales,
so there a large MX / nvfp4 GEMM decodes both operands to bf16 (one XLA pass each) before a bf16 GEMM. With
"decoded" the recipe asks the quantization kernel for those bf16 values instead of codes and scales (the
same single pass, 2 bytes written per element and side instead of about 1;
`quantize_primitive.decoded_pair`), and the three GEMMs are XLA's bf16 dots, times nvfp4's tensor scales
(on a bf16 product: one more bf16 rounding than the codes path, see `_gemm`): the same values as the codes
path, whose decode pass is gone. Residuals are then bf16 (2 bytes per element,
as the bf16 baseline's). "codes" keeps codes and scales everywhere (native block-scaled MMAs on sm_100 and
gfx950 read them). "auto", the default: "decoded" when the first JAX device is an NVIDIA sm_90 GPU and every
quantized operand is MX or nvfp4, else "codes". A pre-quantized (frozen) weight is codes either way. By name:
`get_recipe("mxfp8:codes")`.

Rematerialization: under `jax.checkpoint` / `nn.remat` the backward re-runs the forward, quantizations
included. The forward names what it quantizes (`jax.ad_checkpoint.checkpoint_name`): `WEIGHT_NAME` on
W's quantizations, `INPUT_NAME` on x's; `checkpoint_policy()` saves them, so the recomputation reads
them instead of quantizing again (about 2 bytes per element kept for each: both layouts of 1-byte codes).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Optional, Union

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from . import _explicit_sharding as explicit
from . import validation
from .api import matmul, quantize_operand
from .formats import (DEEPSEEK_TILES, BlockFP8Format, Format, FormatLike, MXFormat, NVFP4Format, format_family,
                      format_for_side)
from .quantize import ROUNDING_MODES, BlockScaledArray
from .quantize_primitive import Decoded, quantize_sides

__all__ = ["Recipe", "RecipeLike", "RECIPES", "RECIPE_NAMES", "GEMM_INPUTS", "get_recipe", "recipe_matmul",
           "quantized_dense", "quantize_weight", "WEIGHT_NAME", "INPUT_NAME", "checkpoint_policy"]

_DEEPSEEK_ACT = BlockFP8Format(tile=DEEPSEEK_TILES["a"])
_DEEPSEEK_WEIGHT = BlockFP8Format(tile=DEEPSEEK_TILES["b"])
_DENSE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_GEMMS = ("fprop", "dgrad", "wgrad")
GEMM_INPUTS = ("auto", "codes", "decoded")

FormatPair = tuple[Optional[Format], Optional[Format]]


def _resolve(fmt: Optional[FormatLike], side: str) -> Optional[Format]:
    return None if fmt is None else format_for_side(fmt, side)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Formats of a dense layer's three GEMMs; each pair is (a, b) of the NT matmul (module docstring).

    Fields take format names or objects ("fp8_block" means 1x128 on the a side, 128x128 on the b side) and
    are stored resolved. `rounding` is the MX scale rounding (`jax_blockscale.quantize`); nvfp4 and
    fp8_block scales ignore it. `gemm_inputs`: "auto", "codes" or "decoded" (module docstring). Frozen and
    hashable: usable as a static argument and a Flax field.
    """

    name: str
    fprop: FormatPair = (None, None)
    dgrad: FormatPair = (None, None)
    wgrad: FormatPair = (None, None)
    rounding: str = "rceil"
    inference: bool = False  # built for serving; its backward is a bf16 straight-through
    gemm_inputs: str = "auto"

    def __post_init__(self):
        if self.rounding not in ROUNDING_MODES:
            raise ValueError(f"recipe {self.name!r}: unknown rounding {self.rounding!r}; choose one of "
                             f"{ROUNDING_MODES}")
        if self.gemm_inputs not in GEMM_INPUTS:
            raise ValueError(f"recipe {self.name!r}: gemm_inputs must be one of {GEMM_INPUTS}, got "
                             f"{self.gemm_inputs!r}")
        for gemm in _GEMMS:
            pair = getattr(self, gemm)
            if len(pair) != 2:
                raise ValueError(f"recipe {self.name!r}: {gemm} must be an (a, b) pair of formats, "
                                 f"got {pair!r}")
            a, b = _resolve(pair[0], "a"), _resolve(pair[1], "b")
            fams = {format_family(a), format_family(b)}
            if len(fams) == 2 and "dense" not in fams:
                raise ValueError(f"recipe {self.name!r}: {gemm} pairs {a.name} with {b.name}, whose scale "
                                 f"blocks along K differ; the matmul takes MX x MX, nvfp4 x nvfp4, "
                                 f"fp8_block x fp8_block, or dense x any")
            if fams == {"fp8_block"} and a.tile[1] != b.tile[1]:
                raise ValueError(f"recipe {self.name!r}: {gemm} fp8_block tiles {a.tile} and {b.tile} "
                                 f"need the same width along K")
            object.__setattr__(self, gemm, (a, b))
        if self.gemm_inputs == "decoded" and not self._decodable:
            raise ValueError(f"recipe {self.name!r}: gemm_inputs='decoded' needs MX or nvfp4 formats for every "
                             f"quantized operand (block FP8 GEMMs read their codes natively on every target)")

    @property
    def _decodable(self) -> bool:
        formats = [f for g in _GEMMS for f in getattr(self, g) if f is not None]
        return bool(formats) and all(isinstance(f, (MXFormat, NVFP4Format)) for f in formats)

    def decodes(self) -> bool:
        """Whether the GEMMs take decoded bf16 operands here (`gemm_inputs`; "auto" looks at the first JAX
        device)."""
        if self.gemm_inputs != "auto":
            return self.gemm_inputs == "decoded"
        if not self._decodable:
            return False
        from .backends import detect_target

        return detect_target() == "sm_90"

    @property
    def quantizes(self) -> bool:
        """Whether any GEMM has a block-scaled operand (False for the bf16 baseline)."""
        return any(f is not None for g in _GEMMS for f in getattr(self, g))

    @property
    def weight_format(self) -> Optional[Format]:
        """The format a pre-quantized (inference) weight must have: fprop's b side."""
        return self.fprop[1]

    def describe(self) -> str:
        """One line per GEMM: which format each operand gets."""
        def name(f):
            if f is None:
                return "dense"
            return f"{f.name} {f.tile[0]}x{f.tile[1]}" if isinstance(f, BlockFP8Format) else f.name
        inputs = self.gemm_inputs + (f", here {'decoded' if self.decodes() else 'codes'}"
                                     if self.gemm_inputs == "auto" and self.quantizes else "")
        rows = [f"recipe {self.name} (rounding {self.rounding}; GEMM inputs {inputs})"]
        labels = {"fprop": ("x along K", "W along K"), "dgrad": ("dy along N", "W^T along N"),
                  "wgrad": ("dy^T along M", "x^T along M")}
        for gemm in _GEMMS:
            (fa, fb), (la, lb) = getattr(self, gemm), labels[gemm]
            rows.append(f"  {gemm}: {la}: {name(fa)}, {lb}: {name(fb)}")
        return "\n".join(rows)


RecipeLike = Union[str, Recipe]

_MXFP8 = ("mxfp8_e4m3", "mxfp8_e4m3")
RECIPES: types.MappingProxyType = types.MappingProxyType({
    "bf16": Recipe("bf16"),
    "mxfp8": Recipe("mxfp8", _MXFP8, _MXFP8, _MXFP8),
    "mxfp8_e5m2_grads": Recipe("mxfp8_e5m2_grads", _MXFP8, ("mxfp8_e5m2", "mxfp8_e4m3"),
                               ("mxfp8_e5m2", "mxfp8_e4m3")),
    "nvfp4": Recipe("nvfp4", ("nvfp4", "nvfp4"), _MXFP8, _MXFP8),
    "fp8_deepseek": Recipe("fp8_deepseek", (_DEEPSEEK_ACT, _DEEPSEEK_WEIGHT), (_DEEPSEEK_ACT, _DEEPSEEK_WEIGHT),
                           (_DEEPSEEK_ACT, _DEEPSEEK_WEIGHT)),
    "w4a8": Recipe("w4a8", ("mxfp8_e4m3", "mxfp4"), inference=True),
    "w4a16": Recipe("w4a16", (None, "mxfp4"), inference=True),
    "w8a16_fp8": Recipe("w8a16_fp8", (None, _DEEPSEEK_WEIGHT), inference=True),
})
RECIPE_NAMES: tuple[str, ...] = tuple(RECIPES)
_ALIASES = {"deepseek": "fp8_deepseek", "fp8_block": "fp8_deepseek", "bfloat16": "bf16", "none": "bf16"}


def get_recipe(recipe: RecipeLike) -> Recipe:
    """A `Recipe` from a name (`RECIPE_NAMES`, case-insensitive; "name:inputs" sets `gemm_inputs`, e.g.
    "mxfp8:codes") or passed through."""
    if isinstance(recipe, Recipe):
        return recipe
    if not isinstance(recipe, str):
        raise TypeError(f"a recipe is a name or a jax_blockscale.Recipe, got {type(recipe).__name__}")
    name, _, inputs = recipe.partition(":")
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPE_NAMES)} (optionally "
                         f"with ':' and one of {GEMM_INPUTS}) or build a Recipe")
    if inputs:
        return dataclasses.replace(RECIPES[key], gemm_inputs=inputs.lower())
    return RECIPES[key]


# ------------------------------------------------------------------------------------------ the GEMMs


def _quantize(x: jax.Array, fmt: Optional[Format], rounding: str):
    # fmt is already resolved for its side, so `side` only matters for names, which never reach here.
    return quantize_operand(x, fmt, side="a", rounding=rounding)


def _sides(s: "_Static", x: jax.Array, row: Optional[Format], col: Optional[Format]):
    """x quantized along its last axis (row) and its second last (col, stored transposed), from one read:
    BlockScaledArrays, or Decoded bf16 values when the recipe's GEMMs take them here (`Recipe.decodes`)."""
    return quantize_sides(x, row, col, s.recipe.rounding, decoded=s.decoded)


def _t(x: jax.Array) -> jax.Array:
    return jnp.swapaxes(x, -1, -2)


def _gemm(a, b, out_dtype, out_sharding=None) -> jax.Array:
    """a (.., M, K) x b (.., N, K) -> (.., M, N): the primitive if either side is block-scaled.

    `out_sharding`: the result's sharding on a mesh with Explicit axes (a gradient's must be its primal's);
    None leaves it to the matmul (`jax_blockscale._explicit_sharding`).
    """
    if isinstance(a, BlockScaledArray) or isinstance(b, BlockScaledArray):
        return explicit.like(matmul(a, b, out_dtype=out_dtype), out_sharding)
    if isinstance(a, Decoded) or isinstance(b, Decoded):
        # The bf16 values are exact (quantize_primitive.Decoded): their dot with fp32 accumulation is the
        # codes path's GEMM up to summation order; nvfp4's tensor scales multiply the product (below).
        scales = [t.tensor_scale for t in (a, b) if isinstance(t, Decoded) and t.tensor_scale is not None]
        a, b = (t.values if isinstance(t, Decoded) else t for t in (a, b))
        if scales:
            alpha = functools.reduce(jnp.multiply, scales)
            # A bf16 product is rounded, then scaled and rounded again (at most one more bf16 rounding error
            # than the codes path's single one): a float32 product would make cuBLAS write 4 bytes per
            # element and XLA run a pass to scale and narrow it (H100, nvfp4 d4096 training: ~3 ms per
            # step), where XLA fuses this multiply into the product's consumer. bf16's range is float32's,
            # so nothing overflows before the scaling; an f16 output, whose range is not, stays float32.
            narrow = jnp.dtype(out_dtype) == jnp.bfloat16
            out = explicit.nt_dot(a, b, out_sharding, preferred_element_type=out_dtype if narrow else jnp.float32)
            return (out.astype(jnp.float32) * alpha).astype(out_dtype)
    # out_dtype straight from the dot (float32 accumulation inside), as flax.linen.Dense does: an f32 result
    # cast down would make autodiff of the bf16 baseline run its backward GEMMs in float32.
    return explicit.nt_dot(a, b, out_sharding, preferred_element_type=out_dtype)


def _dense(w, dtype=jnp.float32) -> jax.Array:
    return explicit.dequantize(w, dtype) if isinstance(w, BlockScaledArray) else w


@dataclasses.dataclass(frozen=True)
class _Static:
    recipe: Recipe
    out_dtype: jnp.dtype
    x_dtype: jnp.dtype
    w_dtype: Optional[jnp.dtype]  # None: W is a pre-quantized BlockScaledArray (a constant)
    # On a mesh with Explicit axes, x's and W's shardings: their gradients must have them exactly.
    x_sharding: Optional[jax.sharding.NamedSharding] = None
    w_sharding: Optional[jax.sharding.NamedSharding] = None
    # W given as a Flax (K, N) kernel, not (N, K): both of its quantized layouts come out of the one
    # quantization kernel and dW comes out of the wgrad GEMM as (K, N), so no XLA transpose of the weight
    # or its gradient runs (on an H100, fp8_deepseek d4096: ~3.8 ms of transposes per step).
    w_kn: bool = False
    decoded: bool = False  # the quantizations are Decoded bf16 values (Recipe.decodes, a trained weight)


WEIGHT_NAME = "jax_blockscale.weight"
INPUT_NAME = "jax_blockscale.input"


def checkpoint_policy(*, weights: bool = True, inputs: bool = False):
    """A `jax.checkpoint` / `nn.remat` policy that saves the recipes' quantizations for the backward.

    weights: W's quantized layouts (fprop's W and dgrad's W^T), so the recomputed forward does not
    quantize the weights again: 2 bytes per weight element kept per layer, a pass over the (float32)
    weight saved. inputs: x's quantized layouts (fprop's x and wgrad's x^T) too: 2 bytes per activation
    element kept, a pass over x saved. Nothing else is saved: as `nothing_saveable` for everything the
    recipes do not name (a bf16 layer's dots are recomputed as before)."""
    names = ([WEIGHT_NAME] if weights else []) + ([INPUT_NAME] if inputs else [])
    return jax.checkpoint_policies.save_only_these_names(*names)


def _as_words(x: jax.Array) -> jax.Array:
    """(..., K) of a 1- or 2-byte dtype -> (..., K * itemsize / 4) uint32, the same bytes."""
    per = 4 // x.dtype.itemsize
    return jax.lax.bitcast_convert_type(x.reshape(*x.shape[:-1], x.shape[-1] // per, per), jnp.uint32)


def _from_words(words: jax.Array, like: jax.Array) -> jax.Array:
    """`_as_words`' inverse: the uint32 words back to `like`'s shape and dtype."""
    return jax.lax.bitcast_convert_type(words, like.dtype).reshape(like.shape)


def _named(tree, name: str):
    """`checkpoint_name` on every array of `tree`; 1- and 2-byte arrays (element codes, e8m0 scales, decoded
    bf16) are named as uint32 words where their last axis packs into whole words, else 1-byte floats as
    uint8.

    Why uint32: a saved residual of a remat'd layer under a layer scan (`nn.scan`) is stacked in a buffer
    that jax's scan fills with zeros before the loop (`_empty_array`), and XLA:GPU wrote the 1-byte buffers
    at ~0.85 TB/s (H100, fp8_deepseek step at d2048: one u8[4, 8192, 16384] fill took 0.63 ms; a fill of
    three such buffers in one fusion ran ~2.5 TB/s). Saved as words, that step's non-GEMM kernels fell from
    18.18 to 17.44 ms (benchmarks/results/session32_h100_2026-11-25.md). Why not the float dtype for 1-byte
    floats: for each saved residual, remat inserts `reduce_precision` with the dtype's finfo (jax
    `_insert_reduce_precision`), for float8_e4m3fn (4 exponent, 3 mantissa bits), and XLA applies that as an
    IEEE format with infinities: codes of 256..448 would come back as Inf. Bitcasts and reshapes cost no
    kernel."""
    def one(x):
        if not isinstance(x, jax.Array) or x.dtype.itemsize > 2 or x.dtype == jnp.bool_:
            return checkpoint_name(x, name)
        if x.ndim and x.shape[-1] % (4 // x.dtype.itemsize) == 0:
            return _from_words(checkpoint_name(_as_words(x), name), x)
        if x.dtype.itemsize != 1 or not jnp.issubdtype(x.dtype, jnp.floating):
            return checkpoint_name(x, name)
        return jax.lax.bitcast_convert_type(checkpoint_name(jax.lax.bitcast_convert_type(x, jnp.uint8), name),
                                            x.dtype)
    return jax.tree.map(one, tree)


def _swap_wgrad(r: Recipe) -> bool:
    """dW (K, N) straight from the GEMM, x^T (K, M) . dy^T (N, M), needs the operands in the other order;
    done where both sides take the same format, so the pair the kernels see is unchanged."""
    return r.wgrad[0] == r.wgrad[1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _core(x: jax.Array, w, s: _Static) -> jax.Array:
    """x (*B, M, K) x w (*B, N, K) -> (*B, M, N) with the recipe's forward; same batch dims on both."""
    r = s.recipe
    if s.w_kn:  # (K, N): the fprop operand (N, K) along K is the quantization's transposed side
        qw = _t(w) if r.fprop[1] is None else _sides(s, w, None, r.fprop[1])[1]
    elif isinstance(w, BlockScaledArray) or r.fprop[1] is None:
        qw = w
    else:
        qw = _sides(s, w, r.fprop[1], None)[0]
    qx = x if r.fprop[0] is None else _sides(s, x, r.fprop[0], None)[0]
    return _gemm(qx, qw, s.out_dtype)


def _core_fwd(x, w, s: _Static):
    r = s.recipe
    frozen = isinstance(w, BlockScaledArray)
    # Each operand is read once for both of its layouts: x along K (fprop) and x^T along M (wgrad, only
    # when W trains); W along K (fprop) and W^T along N (dgrad). The transposed quantizations are the
    # residuals, so the backward neither re-reads nor transposes x or W (quantize_sides: one kernel on a
    # GPU). Dense sides (the recipe keeps them in high precision) stay as they are.
    qx, xt = _sides(s, x, r.fprop[0], None if frozen else r.wgrad[1])
    x_res = None if frozen else (xt if r.wgrad[1] else x)
    if frozen:
        # A pre-quantized weight: W^T along N from its dequantized values (serving, fine-tuning x only).
        qw, w_res = w, (_quantize(_t(_dense(w)), r.dgrad[1], r.rounding) if r.dgrad[1] else w)
    elif s.w_kn:
        # W (K, N): along N as it lies (dgrad's (K, N) operand), along K transposed (fprop's (N, K)).
        wt, qw = _sides(s, w, r.dgrad[1], r.fprop[1])
        w_res = wt if r.dgrad[1] else w
        qw = _t(w) if qw is None else qw
    else:
        qw, wt = _sides(s, w, r.fprop[1], r.dgrad[1])
        w_res = wt if r.dgrad[1] else w
    # Names for rematerialization (`checkpoint_policy`); outside jax.checkpoint they change nothing.
    qx, x_res = _named((qx, x_res), INPUT_NAME)
    qw, w_res = _named((qw, w_res), WEIGHT_NAME)
    out = _gemm(x if qx is None else qx, w if qw is None else qw, s.out_dtype)
    return out, (x_res, w_res)


def _core_bwd(s: _Static, res, g):
    r = s.recipe
    x_res, w_res = res
    frozen = s.w_dtype is None
    # dy along N (dgrad) and dy^T along M (wgrad) from one read of dy.
    qg, gt = _sides(s, g, r.dgrad[0], None if frozen else r.wgrad[0])
    # dgrad: dx (M, K) = dy (M, N) . W^T (K, N)
    if r.dgrad[1]:
        wt = w_res
    else:
        wt = _dense(w_res, s.x_dtype) if s.w_kn else _t(_dense(w_res, s.x_dtype))
    dx = _gemm(g if qg is None else qg, wt, s.x_dtype, s.x_sharding)
    if frozen:
        return dx, None
    # wgrad: dW (N, K) = dy^T (N, M) . x^T (K, M); for a (K, N) W, dW (K, N) = x^T (K, M) . dy^T (N, M)
    xt = x_res if r.wgrad[1] else _t(x_res)
    gt = _t(g) if gt is None else gt
    if not s.w_kn:
        dw = _gemm(gt, xt, s.w_dtype, s.w_sharding)
    elif _swap_wgrad(r) or s.decoded:  # dense dots take any operand order
        dw = _gemm(xt, gt, s.w_dtype, s.w_sharding)
    else:
        # The pair differs (fp8_deepseek: 1x128 dy^T, 128x128 x^T; no kernel takes it swapped), so one side
        # is block-scaled (two dense sides swap) and the primitive writes dW^T's product transposed.
        dw = explicit.like(matmul(gt, xt, out_dtype=s.w_dtype, transpose_out=True), s.w_sharding)
    return dx, dw


_core.defvjp(_core_fwd, _core_bwd)


# ------------------------------------------------------------------------------------- public entry points


def _explain(r: Recipe, x_shape, w_shape, why: str) -> ValueError:
    return ValueError(f"recipe {r.name!r} cannot handle x {tuple(x_shape)} . w {tuple(w_shape)} "
                      f"(x (..., M, K), w (..., N, K)): {why}")


def _check(r: Recipe, x, w) -> None:
    """Trace-time checks, so a bad shape or operand fails with an explanation, not deep in a kernel."""
    if isinstance(w, BlockScaledArray):
        validation.check_block_scaled(w, "w")
    xs, ws = tuple(x.shape), tuple(w.shape)
    if isinstance(x, BlockScaledArray):
        raise _explain(r, xs, ws, "x is a BlockScaledArray; pass activations dense, the recipe quantizes them")
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, BlockScaledArray) and jnp.dtype(t.dtype) not in _DENSE_DTYPES:
            raise TypeError(f"recipe {r.name!r}: {name} must be float32, bfloat16 or float16, got {t.dtype}")
    if len(xs) < 1 or len(ws) < 2:
        raise _explain(r, xs, ws, "x needs a contraction axis and w must be at least 2-D (N, K)")
    if xs[-1] != ws[-1]:
        raise _explain(r, xs, ws, f"contraction sizes differ ({xs[-1]} vs {ws[-1]}); w is (N, K), the "
                       f"transpose of a Flax (in, out) kernel")
    if 0 in xs or 0 in ws:
        raise _explain(r, xs, ws, "an axis has size 0; block scaling needs at least one element per block "
                       "(skip the layer for empty inputs)")
    if len(ws) > 2 and len(xs) < 2:
        raise _explain(r, xs, ws, "a batched w (*B, N, K) needs x of shape (*B, M, K)")
    if isinstance(w, BlockScaledArray):
        want = r.weight_format
        if want is None or w.fmt != want:
            need = "keeps weights dense" if want is None else f"expects {want.name} weights"
            raise _explain(r, xs, ws, f"the recipe {need}, got a pre-quantized {w.fmt.name} weight; "
                           f"quantize the kernel with quantize_weight(kernel, recipe) for this recipe, or "
                           f"serve it with a recipe whose weight format is {w.fmt.name}")
        if w.axis != -1:
            raise _explain(r, xs, ws, f"the pre-quantized weight is quantized along axis {w.axis}; it must "
                           f"be (N, K) quantized along K (axis -1), as quantize_weight makes it")
        if len(ws) > 2 and ws[:-2] != xs[:-2]:
            raise _explain(r, xs, ws, "a batched pre-quantized weight needs x with the same batch dims")


def _out_dtype(x, w, out_dtype) -> jnp.dtype:
    if out_dtype is None:
        out_dtype = x.dtype if isinstance(w, BlockScaledArray) else jnp.result_type(x.dtype, w.dtype)
    out_dtype = jnp.dtype(out_dtype)
    if out_dtype not in _DENSE_DTYPES:
        raise ValueError(f"out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    return out_dtype


def recipe_matmul(x: jax.Array, w, recipe: RecipeLike, *, out_dtype=None) -> jax.Array:
    """`x (..., M, K) . w (N, K)^T -> (..., M, N)`, or batched `x (*B, M, K) . w (*B', N, K)` (B' broadcasts
    against B), with the recipe's forward and backward.

    `w` is dense (float32/bfloat16/float16: trained; gradients flow to it) or a `BlockScaledArray` (N, K)
    quantized along K in the recipe's weight format (`quantize_weight`; a constant, zero gradient). With a
    2-D w, all leading dims of x fold into M, so wgrad contracts over every token. `out_dtype` defaults to
    the promoted dtype of x and w (x's dtype with a quantized w). Shape and format errors are raised at
    trace time with the reason.
    """
    return _recipe_matmul(x, w, get_recipe(recipe), out_dtype, w_kn=False)


def _recipe_matmul(x, w, r: Recipe, out_dtype, w_kn: bool) -> jax.Array:
    """recipe_matmul; w_kn: a dense 2-D w given as (K, N) (a Flax kernel), read without a transpose."""
    x = jnp.asarray(x) if not isinstance(x, BlockScaledArray) else x
    w = w if isinstance(w, BlockScaledArray) else jnp.asarray(w)
    # The checks (and their messages) see the matmul's (N, K) view of a (K, N) kernel.
    _check(r, x, jax.ShapeDtypeStruct(w.shape[::-1], w.dtype) if w_kn else w)
    out_dtype = _out_dtype(x, w, out_dtype)
    if not r.quantizes:  # the baseline: plain autodiff of a dense dot (XLA folds a (K, N) w's transpose in)
        w = w.T if w_kn else w
        out = _gemm(x if x.ndim > 1 else x[None], w, out_dtype)
        return out if x.ndim > 1 else out[0]
    frozen = isinstance(w, BlockScaledArray)

    def core(x, w):
        s = _Static(r, out_dtype, jnp.dtype(x.dtype), None if frozen else jnp.dtype(w.dtype),
                    explicit.explicit_sharding(x), None if frozen else explicit.explicit_sharding(w), w_kn,
                    decoded=not frozen and r.decodes())
        return _core(x, w, s)

    if w.ndim == 2:
        lead, k = x.shape[:-1], x.shape[-1]
        return core(x.reshape(-1, k), w).reshape(*lead, w.shape[1] if w_kn else w.shape[0])
    batch = jnp.broadcast_shapes(x.shape[:-2], w.shape[:-2])
    # Broadcasting outside the custom_vjp lets autodiff sum dW over broadcast batch dims.
    x = jnp.broadcast_to(x, batch + x.shape[-2:])
    if not frozen:
        w = jnp.broadcast_to(w, batch + w.shape[-2:])
    return core(x, w)


def quantized_dense(x: jax.Array, w, recipe: RecipeLike, *, out_dtype=None, w_layout: str = "nk") -> jax.Array:
    """A dense layer's matmul, `x (..., K) . W -> (..., N)`, with the recipe's three GEMMs.

    `w_layout="nk"` (default): `w` is the weight in the matmul's (N, K) layout, a Flax (in, out) kernel
    transposed, or a `BlockScaledArray` from `quantize_weight` for inference. `w_layout="kn"`: `w` is the
    dense Flax (in, out) = (K, N) kernel itself, and its gradient comes back (K, N). Same values either way;
    "kn" spares XLA's transposes of the weight and of its gradient in a training step (the quantization
    kernel writes the transposed layout; the wgrad GEMM writes dW as (K, N)). The Flax layers use it.
    """
    if w_layout not in ("nk", "kn"):
        raise ValueError(f"w_layout must be 'nk' or 'kn', got {w_layout!r}")
    if w_layout == "kn" and isinstance(w, BlockScaledArray):
        raise ValueError("w_layout='kn' is for a dense (K, N) kernel; a BlockScaledArray weight is (N, K) "
                         "(quantize_weight's layout): pass it with w_layout='nk'")
    if not isinstance(w, BlockScaledArray) and jnp.ndim(w) != 2:
        raise ValueError(f"quantized_dense takes a 2-D weight ({w_layout[0].upper()}, {w_layout[1].upper()}), "
                         f"got shape {jnp.shape(w)}; use recipe_matmul for batched weights")
    x = jnp.asarray(x)
    r = get_recipe(recipe)
    if x.ndim == 1:
        return _recipe_matmul(x[None], w, r, out_dtype, w_layout == "kn")[0]
    return _recipe_matmul(x, w, r, out_dtype, w_layout == "kn")


def quantize_weight(kernel: jax.Array, recipe: RecipeLike) -> BlockScaledArray:
    """Quantizes a Flax-layout kernel `(..., K, N)` once for serving: a `BlockScaledArray` `(..., N, K)`
    quantized along K in the recipe's weight format.

    Leading dims (a scanned stack of layers) are quantized one matrix at a time, so each layer keeps its
    own nvfp4 tensor scale and slicing the stack gives each layer's weight. Raises for a recipe that keeps
    weights dense (bf16).
    """
    r = get_recipe(recipe)
    if r.weight_format is None:
        raise ValueError(f"recipe {r.name!r} keeps weights dense; there is nothing to pre-quantize")
    kernel = jnp.asarray(kernel)
    if kernel.ndim < 2:
        raise ValueError(f"a kernel is (..., K, N); got shape {kernel.shape}")
    return _quantize_weight(kernel, r)


@functools.partial(jax.jit, static_argnums=1)
def _quantize_weight(kernel: jax.Array, r: Recipe) -> BlockScaledArray:
    # jit: run eagerly, quantization would dispatch (and compile) dozens of small ops one by one.
    def one(k):
        return _quantize(k.T, r.weight_format, r.rounding)

    fn = one
    for _ in range(kernel.ndim - 2):
        fn = jax.vmap(fn)
    return fn(kernel)
