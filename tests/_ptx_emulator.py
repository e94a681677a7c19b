"""A NumPy emulator of the few PTX instructions this package's inline assembly uses, so CPU tests can run it.

Instructions: mov.b32 (immediate, unpacking into two .b16 registers `{lo, hi}`, or packing two into one),
prmt.b32 (default mode), shr/shl/and/or/xor.b32, add/sub/max.u32 (register or immediate), abs/min/add.f32
(float32, subnormals kept, PTX's NaN rules), fma.rn.bf16x2, cvt.f32.f16, cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32. Registers are uint32 arrays (one lane per pack). bf16x2
arithmetic is done in float64 and rounded to bf16 (nearest-even, subnormals kept, as PTX's bf16 fma, which
has no .ftz form); the caller must run this where NumPy keeps float subnormals (not on an XLA:CPU callback
thread).

The fp8 conversions follow the PTX ISA's cvt: `cvt.rn.satfinite.e4m3x2.f32 d, a, b` puts a's code in d's
upper byte and b's in the lower; rounding is to nearest even (ml_dtypes' float32 -> float8 casts, an
implementation independent of this package's integer encoder); .satfinite turns a result beyond the
largest finite value (ml_dtypes gives NaN for e4m3fn, Inf for e5m2; also +-Inf inputs) into +-max_normal,
and a NaN input into a NaN code. Which NaN code the hardware writes the ISA does not say: `FP8_NAN_CODE`
picks it (tests set other NaN bytes, and `FP8_INF_SATURATES = False` makes Inf inputs give e5m2's Inf
code, so that code built on the conversion is checked not to depend on either).

`install()` lets Triton's interpreter run `tl.inline_asm_elementwise` through it. Which elements form a
pack is up to the compiler's layout on a GPU; here they are `pack` consecutive elements along `pack_axis`
(default -2, the axis across scale groups in the decode kernel's (rows, groups, bytes) tiles, the way
Triton packed the FMA variant's nvfp4 tile on sm_90), so an asm block that assumes more about its pack
than "element i with its own operands i" fails here too.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np

_INSTRUCTION = re.compile(r"^([a-z0-9.]+)\s+(.*)$")

_FP8 = {"e4m3x2": ml_dtypes.float8_e4m3fn, "e5m2x2": ml_dtypes.float8_e5m2}
FP8_NAN_CODE = {"e4m3x2": 0x7F, "e5m2x2": 0x7F}
FP8_INF_SATURATES = True


def _cvt_fp8(kind: str, reg: np.ndarray) -> np.ndarray:
    """cvt.rn.satfinite.<kind>.f32 of one float32 register (uint32 bits) -> the code (uint32, 0..255)."""
    x = np.asarray(reg, np.uint32).view(np.float32)
    dtype = _FP8[kind]
    with np.errstate(over="ignore", invalid="ignore"):
        code = x.astype(dtype).view(np.uint8).astype(np.uint32)
    max_code = np.uint32(np.array(float(ml_dtypes.finfo(dtype).max), dtype).view(np.uint8))
    sign = (np.asarray(reg, np.uint32) >> 31) << 7
    overflow = ~np.isnan(x) & ((code & 0x7F) > max_code)  # NaN (e4m3fn) or Inf (e5m2) from a non-NaN input
    code = np.where(overflow, sign | max_code, code)
    if not FP8_INF_SATURATES and kind == "e5m2x2":
        code = np.where(np.isinf(x), sign | 0x7C, code)
    return np.where(np.isnan(x), FP8_NAN_CODE[kind], code).astype(np.uint32)


def _f32(reg: np.ndarray) -> np.ndarray:
    return np.asarray(reg, np.uint32).view(np.float32)


def _bf16_halves(reg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo = ((reg & 0xFFFF) << 16).astype(np.uint32).view(np.float32)
    hi = (reg & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return lo.astype(np.float64), hi.astype(np.float64)


def _to_bf16_bits(x: np.ndarray) -> np.ndarray:
    return x.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)


def _prmt(a: np.ndarray, b: np.ndarray, selector: int) -> np.ndarray:
    """prmt.b32 default mode: result byte i = byte (selector nibble i & 7) of the 8-byte value {b, a}."""
    pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = np.zeros_like(a)
    for i in range(4):
        nibble = (selector >> (4 * i)) & 0xF
        if nibble & 8:
            raise NotImplementedError("prmt sign replication")
        out |= pool[nibble & 7] << (8 * i)
    return out.astype(np.uint32)


def run_ptx(asm: str, n_outputs: int, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Runs `asm` with $0..$(n_outputs-1) as outputs and $n_outputs.. bound to `inputs` (uint32 arrays)."""
    regs: dict[str, np.ndarray] = {f"${n_outputs + i}": np.asarray(x, np.uint32) for i, x in enumerate(inputs)}
    shape = np.shape(inputs[0])

    def value(token: str) -> np.ndarray:
        token = token.strip()
        if token in regs:
            return regs[token]
        if token[:2] in ("0f", "0F"):  # a float32 immediate by its bits
            return np.full(shape, int(token[2:], 16), np.uint32)
        return np.full(shape, int(token, 0), np.uint32)

    for statement in re.split(r"[;\n]", asm):
        statement = statement.strip().strip("{}").strip()
        if not statement or statement.startswith(".reg"):
            continue
        match = _INSTRUCTION.match(statement)
        if match is None:
            raise ValueError(f"cannot parse PTX statement {statement!r}")
        op, operands = match.group(1), [t.strip() for t in match.group(2).split(",")]
        dst, srcs = operands[0], operands[1:]
        if op == "mov.b32" and dst.startswith("{"):  # unpack into two 16-bit registers, low half first
            whole = value(operands[2])
            regs[operands[0][1:].strip()] = whole & 0xFFFF
            regs[operands[1].rstrip("}").strip()] = whole >> 16
            continue
        if op == "mov.b32" and srcs[0].startswith("{"):  # pack two 16-bit registers, low half first
            lo, hi = value(srcs[0].lstrip("{")), value(srcs[1].rstrip("}"))
            regs[dst] = ((lo & 0xFFFF) | ((hi & 0xFFFF) << 16)).astype(np.uint32)
            continue
        if op == "mov.b32":
            result = value(srcs[0])
        elif op == "prmt.b32":
            result = _prmt(value(srcs[0]), value(srcs[1]), int(srcs[2], 0))
        elif op == "shr.b32":
            result = value(srcs[0]) >> value(srcs[1])
        elif op == "shl.b32":
            result = value(srcs[0]) << value(srcs[1])
        elif op == "and.b32":
            result = value(srcs[0]) & value(srcs[1])
        elif op == "or.b32":
            result = value(srcs[0]) | value(srcs[1])
        elif op == "xor.b32":
            result = value(srcs[0]) ^ value(srcs[1])
        elif op == "max.u32":
            result = np.maximum(value(srcs[0]), value(srcs[1]))
        elif op == "abs.f32":  # clears the sign bit, NaN included (PTX: abs of NaN is a NaN)
            result = value(srcs[0]) & np.uint32(0x7FFFFFFF)
        elif op == "min.f32":  # PTX: one NaN operand gives the other; both NaN give a NaN; -0 < +0
            a, b = (_f32(value(t)) for t in srcs)
            with np.errstate(invalid="ignore"):
                r = np.where(np.isnan(a), b, np.where(np.isnan(b), a, np.where((a == b) & (a == 0),
                             np.where(np.signbit(a), a, b), np.minimum(a, b))))
            result = r.astype(np.float32).view(np.uint32)
        elif op in ("add.f32", "add.rn.f32"):  # float32 RNE, subnormals kept (no .ftz)
            with np.errstate(over="ignore", invalid="ignore"):
                result = (_f32(value(srcs[0])) + _f32(value(srcs[1]))).view(np.uint32)
        elif op == "add.u32":
            result = value(srcs[0]).astype(np.uint64) + value(srcs[1])
        elif op == "sub.u32":
            result = value(srcs[0]).astype(np.uint64) + (np.uint64(1 << 32) - value(srcs[1]))
        elif op in ("cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32"):
            kind = op.split(".")[3]
            result = (_cvt_fp8(kind, value(srcs[0])) << 8) | _cvt_fp8(kind, value(srcs[1]))
        elif op in ("cvt.rn.f16x2.e4m3x2", "cvt.rn.f16x2.e5m2x2"):  # exact; the low byte -> the low half
            kind = ml_dtypes.float8_e4m3fn if "e4m3" in op else ml_dtypes.float8_e5m2
            half = lambda b: (b & 0xFF).astype(np.uint8).view(kind).astype(np.float16).view(np.uint16)  # noqa: E731
            src = value(srcs[0])
            result = half(src).astype(np.uint32) | (half(src >> 8).astype(np.uint32) << 16)
        elif op == "cvt.f32.f16":  # exact (fp16 subnormals included)
            result = (value(srcs[0]) & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
        elif op == "fma.rn.bf16x2":
            (a0, a1), (b0, b1), (c0, c1) = (_bf16_halves(value(s)) for s in srcs)
            result = _to_bf16_bits(a0 * b0 + c0) | (_to_bf16_bits(a1 * b1 + c1) << 16)
        else:
            raise NotImplementedError(f"PTX instruction {op} is not emulated")
        regs[dst] = (np.asarray(result, np.uint64) & 0xFFFFFFFF).astype(np.uint32)  # 32-bit wraparound
    return [regs[f"${i}"] for i in range(n_outputs)]


def _to_registers(data: np.ndarray, pack: int, axis: int) -> np.ndarray:
    """(..., n) elements -> (lanes, registers per pack) uint32, `pack` consecutive elements along `axis`."""
    moved = np.moveaxis(data, axis, -1)
    if moved.shape[-1] % pack:
        raise ValueError(f"axis {axis} of length {moved.shape[-1]} does not split into packs of {pack}")
    lanes = np.ascontiguousarray(moved).reshape(-1, pack)
    raw = lanes.view(np.uint8).reshape(lanes.shape[0], -1)
    if raw.shape[1] % 4:
        raise ValueError("a pack must fill whole 32-bit registers")
    return raw.view(np.uint32)


def _from_registers(regs: np.ndarray, like_shape: tuple, dtype, pack: int, axis: int) -> np.ndarray:
    moved_shape = np.moveaxis(np.empty(like_shape, np.uint8), axis, -1).shape
    elements = np.ascontiguousarray(regs).view(np.uint8).view(dtype).reshape(moved_shape)
    return np.ascontiguousarray(np.moveaxis(elements, -1, axis))


def install(pack_axis: int = -2) -> None:
    """Routes the interpreter's inline assembly (constraints "=r" outputs, "r" inputs) to `run_ptx`."""
    from triton.runtime import interpreter

    def create_inline_asm(self, asm, constraints, values, types, is_pure, pack):
        del self, is_pure
        datas = [v.data for v in values]
        shape = datas[0].shape
        axis = pack_axis if len(shape) >= 2 else -1
        if pack == 1:
            axis = -1
        inputs = [_to_registers(d, pack, axis) for d in datas]
        outs_np = [interpreter._get_np_dtype(t) for t in types]
        regs_per_out = [pack * np.dtype(dt).itemsize // 4 for dt in outs_np]
        n_out = sum(regs_per_out)
        if constraints.count("=r") != n_out:
            raise ValueError(f"constraints {constraints!r} do not match {n_out} output registers")
        columns = [col for x in inputs for col in x.T]
        results = run_ptx(asm, n_out, columns)
        handles, first = [], 0
        for t, dt, count in zip(types, outs_np, regs_per_out):
            regs = np.stack(results[first:first + count], axis=-1)
            first += count
            handles.append(interpreter.TensorHandle(_from_registers(regs, shape, dt, pack, axis), t.scalar))
        return _Results(handles)

    interpreter.InterpreterBuilder.create_inline_asm = create_inline_asm


class _Results:
    def __init__(self, handles):
        self.handles = handles

    def get_result(self, i):
        return self.handles[i]
