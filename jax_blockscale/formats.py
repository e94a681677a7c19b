"""Format specifications: element encodings and the block-scaled formats built on them.

Every format is a frozen dataclass with a stable string name; `get_format` resolves names and aliases.
The numbers here are the OCP Microscaling (MX) v1.0 spec's (Table 1 and §5.3) and NVIDIA's nvfp4.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional, Union

import jax.numpy as jnp
import numpy as np

__all__ = [
    "ElementType",
    "MXFormat",
    "NVFP4Format",
    "BlockFP8Format",
    "Format",
    "FormatLike",
    "get_format",
    "format_for_side",
    "format_family",
    "DEEPSEEK_TILES",
    "FORMAT_NAMES",
    "E4M3",
    "E5M2",
    "E2M3",
    "E3M2",
    "E2M1",
]


@dataclasses.dataclass(frozen=True)
class ElementType:
    """A small float encoding: sign, `ebits` exponent bits, `mbits` mantissa bits.

    `has_inf`/`nan_codes` follow the OCP definitions: e5m2 is IEEE-like (Inf and NaN), e4m3 ("fn") has
    only S.1111.111 as NaN, the fp6/fp4 types have neither and always saturate.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    max_normal: float
    has_inf: bool
    jnp_dtype: object  # the ml_dtypes type, used for documentation and fp8 storage

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def emax(self) -> int:
        """Exponent of the largest normal number (OCP's emax_elem)."""
        return int(np.floor(np.log2(self.max_normal)))

    @property
    def min_normal_exp(self) -> int:
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """Largest positive finite code; encoding saturates to it."""
        return int(np.array(self.max_normal, self.jnp_dtype).view(np.uint8)) & ((1 << (self.bits - 1)) - 1)


E4M3 = ElementType("e4m3", 4, 3, 7, 448.0, False, jnp.float8_e4m3fn)
E5M2 = ElementType("e5m2", 5, 2, 15, 57344.0, True, jnp.float8_e5m2)
E2M3 = ElementType("e2m3", 2, 3, 1, 7.5, False, jnp.float6_e2m3fn)
E3M2 = ElementType("e3m2", 3, 2, 3, 28.0, False, jnp.float6_e3m2fn)
E2M1 = ElementType("e2m1", 2, 1, 1, 6.0, False, jnp.float4_e2m1fn)


@dataclasses.dataclass(frozen=True)
class MXFormat:
    """OCP MX format: `block` elements along the quantized axis share one e8m0 power-of-two scale.

    Storage of `values` (see `BlockScaledArray`): fp8 elements as `float8_e4m3fn`/`float8_e5m2`; fp6 as one
    code per `uint8` (low 6 bits, sign in bit 5), because XLA cannot compute on float6 types on every backend;
    fp4 as `uint8` holding two codes, low nibble = even element.
    """

    name: str
    element: ElementType
    block: int = 32

    @property
    def elements_per_byte(self) -> int:
        return 2 if self.element.bits == 4 else 1

    @property
    def scale_kind(self) -> str:
        return "e8m0"


@dataclasses.dataclass(frozen=True)
class NVFP4Format:
    """NVIDIA nvfp4: e2m1 elements, one e4m3 scale per 16 elements, and one fp32 scale per tensor."""

    name: str = "nvfp4"
    element: ElementType = E2M1
    block: int = 16
    scale_element: ElementType = E4M3

    @property
    def elements_per_byte(self) -> int:
        return 2

    @property
    def scale_kind(self) -> str:
        return "e4m3"


@dataclasses.dataclass(frozen=True)
class BlockFP8Format:
    """e4m3 elements with one fp32 scale per 2D tile `(rows, cols)`; `cols` runs along the quantized axis.

    `(1, 128)` is DeepSeek-V3's activation grouping, `(128, 128)` its weight blocks, `(256, 256)` the
    GridQuant default.
    """

    tile: tuple[int, int] = (256, 256)
    element: ElementType = E4M3

    @property
    def name(self) -> str:
        return "fp8_block"

    @property
    def block(self) -> int:
        return self.tile[1]

    @property
    def elements_per_byte(self) -> int:
        return 1

    @property
    def scale_kind(self) -> str:
        return "fp32"


Format = Union[MXFormat, NVFP4Format, BlockFP8Format]
FormatLike = Union[str, Format]

_MX = {
    "mxfp8_e4m3": MXFormat("mxfp8_e4m3", E4M3),
    "mxfp8_e5m2": MXFormat("mxfp8_e5m2", E5M2),
    "mxfp6_e2m3": MXFormat("mxfp6_e2m3", E2M3),
    "mxfp6_e3m2": MXFormat("mxfp6_e3m2", E3M2),
    "mxfp4": MXFormat("mxfp4", E2M1),
}
_ALIASES = {"mxfp8": "mxfp8_e4m3", "mxfp4_e2m1": "mxfp4"}
FORMAT_NAMES: tuple[str, ...] = (*_MX, "nvfp4", "fp8_block")

RoundingMode = Literal["floor", "ceil", "even", "rceil"]


def get_format(fmt: FormatLike, *, block: tuple[int, int] | None = None) -> Format:
    """Resolves a format name (or passes a spec object through).

    `block` is the `(rows, cols)` tile of `fp8_block` and is rejected for the other formats, whose block
    size the spec fixes.
    """
    if isinstance(fmt, (MXFormat, NVFP4Format, BlockFP8Format)):
        if block is not None and not (isinstance(fmt, BlockFP8Format) and tuple(block) == fmt.tile):
            raise ValueError(f"block={block} conflicts with the format object {fmt}")
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"format must be a name or a format object, got {type(fmt).__name__}")
    key = _ALIASES.get(fmt.lower(), fmt.lower())
    if key == "fp8_block":
        tile = (256, 256) if block is None else block
        if (
            len(tuple(tile)) != 2
            or not all(isinstance(t, (int, np.integer)) and t > 0 for t in tile)
        ):
            raise ValueError(f"fp8_block needs block=(rows, cols) of two positive ints, got {block!r}")
        return BlockFP8Format(tile=(int(tile[0]), int(tile[1])))
    if block is not None:
        raise ValueError(
            f"block= only applies to 'fp8_block'; {fmt!r} has a fixed block size set by its spec"
        )
    if key == "nvfp4":
        return NVFP4Format()
    if key in _MX:
        return _MX[key]
    raise ValueError(
        f"unknown format {fmt!r}; choose one of {', '.join(FORMAT_NAMES)} (aliases: mxfp8 = mxfp8_e4m3)"
    )


# DeepSeek-V3's pairing, which the block-FP8 kernels implement: 1x128 activation groups (the matmul's a
# side), 128x128 weight tiles (its b side).
DEEPSEEK_TILES = {"a": (1, 128), "b": (128, 128)}


def format_for_side(fmt: FormatLike, side: str) -> Format:
    """`get_format`, except that "fp8_block" by name means DeepSeek-V3's tile for matmul side "a" or "b"."""
    if isinstance(fmt, str) and fmt.lower() == "fp8_block":
        return get_format(fmt, block=DEEPSEEK_TILES[side])
    return get_format(fmt)


def format_family(fmt: Optional[Format]) -> str:
    """"mx", "nvfp4", "fp8_block", or "dense" for None: formats of one family share their K blocking."""
    if fmt is None:
        return "dense"
    return {MXFormat: "mx", NVFP4Format: "nvfp4", BlockFP8Format: "fp8_block"}[type(fmt)]
