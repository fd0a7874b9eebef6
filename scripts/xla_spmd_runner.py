"""Compiles and runs sharded StableHLO modules (qforge's XLA SPMD engine, `codegen/src/
stablehlo/spmd.rs`) with XLA's CPU compiler on D host devices, through jax (pinned by
scripts/install-stablehlo.sh). jax has no public entry point that compiles a StableHLO module
it did not trace: the private `jax._src` calls live in this file only.

Usage: python -u xla_spmd_runner.py D. It sets up XLA for D devices, prints `ready`, then reads
one request {"dir": DIR} per line of stdin and answers each with one line on stdout: `ok` or
`error: <message>` (whatever else writes to stdout is sent to stderr). DIR holds `module.mlir`
and `request.json`:
{"ranks": D, "args": [...], "results": [...]}; each arg is {"file": F, "dtype": "uint8" |
"uint16" | "uint32", "split": bool} (raw little-endian global buffer in DIR) or {"value": u32}
(a scalar's bits); each result is "split" (the devices' results concatenated in device order)
or "replicated" (every device must hold the same bytes). Results are written to DIR as
`out0.bin`, `out1.bin`, ....

XLA's CPU compiler is told not to use FMA instructions (`--xla_cpu_max_isa=AVX`, an x86 flag):
it always allows LLVM to contract a multiply and an add, which would change bits. The caller's
XLA_FLAGS come first, so they cannot undo that or the device count. It flushes subnormal
results to zero whatever its flags say (docs/distributed.md).
"""
import json
import os
import platform
import sys

# Answers go to the caller on a copy of stdout; anything else written to stdout (XLA's dumps,
# a library's print) goes to stderr, so it is never taken for an answer.
ANSWERS = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)


def setup(ranks):
    """XLA on `ranks` CPU devices; returns them."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        # Only x86 has the flag that keeps XLA from contracting multiply-adds (docstring).
        raise ValueError(
            "the XLA SPMD engine needs an x86-64 CPU (on %s XLA could contract multiply-adds, "
            "changing bits)" % platform.machine()
        )
    # The caller's XLA_FLAGS first (a dump folder, say), ours last: for a flag given twice the
    # last wins, so the device count and the instruction cap hold.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + " --xla_force_host_platform_device_count=%d --xla_cpu_max_isa=AVX" % ranks
    )
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax  # noqa: F401 (imported once, before any request)
    from jax._src import xla_bridge

    devices = xla_bridge.get_backend("cpu").devices()[:ranks]
    if len(devices) != ranks:
        raise ValueError("XLA has %d CPU devices, %d ranks asked" % (len(devices), ranks))
    return devices


def run(d, devices):
    import jax
    import numpy as np
    from jax._src import compiler, xla_bridge
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import xla_client as xc
    from jax.sharding import NamedSharding, PartitionSpec
    from jaxlib.mlir import ir

    with open(os.path.join(d, "request.json")) as f:
        req = json.load(f)
    ranks = int(req["ranks"])
    if ranks != len(devices):
        raise ValueError("a program for %d ranks sent to the runner of %d" % (ranks, len(devices)))
    backend = xla_bridge.get_backend("cpu")
    with open(os.path.join(d, "module.mlir")) as f:
        text = f.read()
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(text)
        if not module.operation.verify():
            raise ValueError("the module does not verify")
        options = compiler.get_compile_options(
            num_replicas=1,
            num_partitions=ranks,
            device_assignment=np.array(devices).reshape(1, ranks),
            backend=backend,
        )
        # Shardy's ops are lowered by Shardy's partitioner: on whatever jax's flag says.
        options.executable_build_options.use_spmd_partitioning = True
        options.executable_build_options.use_shardy_partitioner = True
        exe = backend.compile_and_load(
            module, executable_devices=xc.DeviceList(tuple(devices)), compile_options=options
        )
    mesh = jax.sharding.Mesh(np.array(devices), ("ranks",))
    args = []
    for a in req["args"]:
        if "file" in a:
            arr = np.fromfile(os.path.join(d, a["file"]), dtype=a["dtype"])
        else:
            arr = np.array(a["value"], dtype=np.uint32)
        if a.get("split"):
            if arr.shape[0] % ranks:
                raise ValueError("a split argument of %d elements over %d ranks" % (arr.shape[0], ranks))
            parts = np.split(arr, ranks)
            spec = PartitionSpec("ranks")
        else:
            parts = [arr] * ranks
            spec = PartitionSpec()
        shards = [jax.device_put(p, dev) for p, dev in zip(parts, devices)]
        args.append(
            jax.make_array_from_single_device_arrays(arr.shape, NamedSharding(mesh, spec), shards)
        )
    outs = exe.execute_sharded(args).disassemble_into_single_device_arrays()
    if len(outs) != len(req["results"]):
        raise ValueError("the module has %d results, %d expected" % (len(outs), len(req["results"])))
    for k, (per_device, how) in enumerate(zip(outs, req["results"])):
        parts = [np.asarray(p) for p in per_device]
        if how == "split":
            out = np.concatenate(parts)
        else:
            for r, p in enumerate(parts[1:], 1):
                if p.tobytes() != parts[0].tobytes():
                    raise ValueError("result %d differs between rank 0 and rank %d" % (k, r))
            out = parts[0]
        out.tofile(os.path.join(d, "out%d.bin" % k))


def answer(e):
    """The answer line for an exception."""
    if isinstance(e, ImportError):
        return "error: %s (run scripts/install-stablehlo.sh)" % e
    message = " | ".join(str(e).splitlines()) or "(no message)"
    return "error: %s: %s" % (type(e).__name__, message)


def main():
    try:
        devices = setup(int(sys.argv[1]))
    except Exception as e:  # the caller reports the last lines of stderr
        print(answer(e), file=sys.stderr, flush=True)
        sys.exit(1)
    print("ready", file=ANSWERS, flush=True)
    for line in sys.stdin:
        try:
            run(json.loads(line)["dir"], devices)
            print("ok", file=ANSWERS, flush=True)
        except Exception as e:  # reported to the caller
            print(answer(e), file=ANSWERS, flush=True)


main()
