import sys
sys.path.insert(0, ".")
from benchmarks import decode as D
V = {"fp4": [("base", {})] + [(f"P{o}", dict(persistent=True, num_sms=132 * o)) for o in (2, 4, 6, 8)],
     "fp8": [("base", {}), ("s1", dict(split_k=1))] + [(f"s1 P{o}", dict(split_k=1, persistent=True, num_sms=132 * o)) for o in (4, 8)]
            + [("n8k1024st4 P4", dict(block_n=8, block_k=1024, split_k=1, num_stages=4, persistent=True, num_sms=528))]}
D.gemv_shapes(D._torch(), formats=tuple(sys.argv[1].split(",")), variants=V)
