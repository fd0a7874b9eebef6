"""Runs StableHLO modules written by qforge's StableHLO backend with the StableHLO reference
interpreter (`stablehlo.eval_module` from jaxlib's MLIR bindings: IEEE arithmetic, subnormals
kept). The runtime's `stablehlo` device starts it once and sends one JSON request per line on
stdin; it answers one line on stdout: `ok` or `error: <message>`.

Request: {"dir": D, "args": [...]}. D holds `module.mlir`; each arg is
{"file": F, "dtype": "uint8"|"uint16"|"uint32"} (raw little-endian buffer in D) or
{"value": u32} (a scalar's bits). Results are written to D as `out0.bin`, `out1.bin`, ...
"""
import json
import os
import re
import sys

# Answers go to the caller on a copy of stdout; anything else written to stdout (a library's
# print, C++ code) goes to stderr, so it is never taken for an answer.
ANSWERS = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)

import numpy as np
from jax._src.interpreters import mlir as jax_mlir
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo


# Ops the reference interpreter cannot run: it aborts the whole process on a collective.
COLLECTIVE = re.compile(
    r"\b(stablehlo\.(all_gather|all_reduce|reduce_scatter|all_to_all|collective_permute|"
    r"collective_broadcast|partition_id|replica_id|send|recv)|sdy\.manual_computation)\b"
)


def run(ctx, req):
    d = req["dir"]
    with open(os.path.join(d, "module.mlir")) as f:
        text = f.read()
    found = COLLECTIVE.search(text)
    if found:
        raise ValueError(
            "the module uses %s: the StableHLO reference interpreter cannot run collectives "
            "(run a sharded program on the XLA SPMD engine)" % found.group(1)
        )
    with ctx:
        module = ir.Module.parse(text)
        if not module.operation.verify():
            raise ValueError("the module does not verify")
        args = []
        for a in req["args"]:
            if "file" in a:
                arr = np.fromfile(os.path.join(d, a["file"]), dtype=a["dtype"])
            else:
                arr = np.array(a["value"], dtype=np.uint32)
            args.append(ir.DenseElementsAttr.get(arr, signless=False))
        results = stablehlo.eval_module(module, args)
        for k, r in enumerate(results):
            np.asarray(r).tofile(os.path.join(d, "out%d.bin" % k))


def main():
    ctx = jax_mlir.make_ir_context()
    print("ready", file=ANSWERS, flush=True)
    for line in sys.stdin:
        try:
            run(ctx, json.loads(line))
            print("ok", file=ANSWERS, flush=True)
        except Exception as e:  # reported to the caller, which names the kernel
            print("error: " + " | ".join(str(e).splitlines()), file=ANSWERS, flush=True)


main()
