"""What benchmarks/sass_count.py and benchmarks/sass_quant.py share: the H100 figures their bounds use, the
disassembly (and register count) of a cubin with the tools Triton ships, and the bytes one lane of a
load/store moves."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

# H100 SXM: SMs, warp schedulers per SM, lanes per warp, boost clock, shared-memory bytes per SM and clock
# (32 banks x 4 bytes).
SM_COUNT, SCHEDULERS, LANES, CLOCK_HZ = 132, 4, 32, 1.755e9
SMEM_BYTES_PER_CLOCK = 128

_BIN = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin")


def _run(tool: str, args: list[str], cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([os.path.join(_BIN, tool), *args, f.name], check=True, capture_output=True,
                              text=True).stdout


def disassemble(cubin: bytes, tool: str = "nvdisasm") -> str:
    """SASS text of `cubin`: nvdisasm (`-c`: with branch labels, which sass_count's loop finder needs) or
    cuobjdump (`-sass`: call targets as addresses, which sass_quant's slow-path split needs)."""
    return _run(tool, {"nvdisasm": ["-c"], "cuobjdump": ["-sass"]}[tool], cubin)


def registers(cubin: bytes) -> int:
    """Registers per thread of the (one) kernel in `cubin` (cuobjdump's resource usage)."""
    usage = _run("cuobjdump", ["--dump-resource-usage"], cubin)
    return int(re.search(r"REG:(\d+)", usage).group(1))


def access_bytes(opcode: str) -> int:
    """Bytes one lane of a load/store moves, from its width suffix: .U8/.S8 1, .U16/.S16 2, .64 8, .128 16,
    else 4."""
    for part, n in (("128", 16), ("64", 8), ("U16", 2), ("S16", 2), ("U8", 1), ("S8", 1)):
        if part in opcode.split(".")[1:]:
            return n
    return 4
