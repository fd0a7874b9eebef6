"""Compiles qforge's Mosaic modules with libtpu's Mosaic compiler for TPU generations, on a
machine without a TPU, and shows how a JAX program calls one (`qforge_kernel`).

Usage: python scripts/mosaic_check.py DIR [GENERATION ...]
  DIR holds KERNEL.mlir (the Mosaic module, `qforge_codegen::mosaic::MosaicModule::text`) and
  its manifest per kernel: KERNEL.json (`MosaicModule::manifest`), or KERNEL.mlir.json as
  `qforge compile --target mosaic -o DIR/KERNEL.mlir` writes it (the manifest is its `launch`). GENERATION is a deviceless topology name, by default
  v5e:1x1 and v6e:1x1. Prints one JSON line per kernel and generation:
  {"kernel", "generation", "ok", "seconds", "error"}; exits 0 once every module was tried.

Needs the venv of scripts/install-mosaic.sh (jax with libtpu); libtpu runs its whole Mosaic
pipeline here, so a module it accepts compiles for that TPU (docs/backends/mosaic.md).
"""

import json
import math
import os
import sys
import time

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
# No TPU is opened: several checks (one per generation) may run side by side.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_platforms", "cpu")

from jax._src.interpreters import mlir  # noqa: E402
from jax._src.lib import tpu  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.experimental.mosaic import as_tpu_kernel  # noqa: E402
from jax.sharding import SingleDeviceSharding  # noqa: E402
from jaxlib.mlir import ir  # noqa: E402


def array_dtype(a):
    """The dtype of array `a` in the module (`float16` buffers are held as `uint16` bits)."""
    return a.get("array_dtype", a["dtype"])


def input_params(manifest):
    """The manifest's input arrays, one per kernel parameter, in parameter order (a buffer
    that is both read per chunk element and reduced over its chunk has two arrays)."""
    seen = {}
    for a in manifest["inputs"]:
        seen.setdefault(a["index"], a)
    return [seen[i] for i in sorted(seen)]


def qforge_kernel(text, manifest):
    """A function of the kernel's flat input buffers (one per parameter, as `input_params`
    lists them) returning its written buffers (the manifest's outputs): pads and reshapes each
    buffer into its array or arrays (bitcast to its `array_dtype`), runs the Mosaic kernel and
    keeps each output's first `elements` (bitcast back to its `dtype`). A matmul's arrays
    hold the buffer's first elements as `buffer_shape` ([r, c], or 4-bit panels' [p, k, 16]),
    zero-padded on every dimension to the array's `shape` with its leading dimensions merged
    to that rank, then split as `shape`; its outputs are their top-left [r, c]."""
    ctx = mlir.make_ir_context()
    tpu.register_dialect(ctx)
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(text)
        outs = tuple(
            jax.ShapeDtypeStruct(tuple(a["shape"]), jnp.dtype(array_dtype(a)))
            for a in manifest["outputs"]
        )
        kernel = as_tpu_kernel(module, outs, kernel_name=manifest["kernel"])

    params = [a["index"] for a in input_params(manifest)]

    def call(*buffers):
        by_param = dict(zip(params, buffers))
        arrays = []
        for a in manifest["inputs"]:
            buf = by_param[a["index"]].reshape(-1)
            shape = a["shape"]
            if a.get("buffer_shape"):
                have = a["buffer_shape"]
                cut = len(shape) + 1 - len(have)
                merged = [math.prod(shape[:cut])] + shape[cut:]
                grid = buf[: math.prod(have)].reshape(have)
                array = jnp.pad(grid, [(0, m - h) for m, h in zip(merged, have)]).reshape(shape)
            else:
                size = math.prod(shape)
                array = jnp.pad(buf, (0, size - a["elements"])).reshape(shape)
            arrays.append(jax.lax.bitcast_convert_type(array, jnp.dtype(array_dtype(a))))
        results = kernel(*arrays)
        flat = []
        for r, a in zip(results, manifest["outputs"]):
            if a.get("buffer_shape"):
                rows, cols = a["buffer_shape"]
                r = r[:rows, :cols]
            flat.append(r.reshape(-1)[: a["elements"]])
        return tuple(
            jax.lax.bitcast_convert_type(f, jnp.dtype(a["dtype"]))
            for f, a in zip(flat, manifest["outputs"])
        )

    return call


def load_manifest(directory, name):
    """The Mosaic manifest of NAME.mlir: NAME.json, or the `launch` of NAME.mlir.json."""
    plain = os.path.join(directory, name + ".json")
    if os.path.exists(plain):
        with open(plain) as f:
            return json.load(f)
    artifact = os.path.join(directory, name + ".mlir.json")
    if not os.path.exists(artifact):
        raise ValueError(f"{name}.mlir has no manifest ({name}.json or {name}.mlir.json)")
    with open(artifact) as f:
        launch = json.load(f).get("launch", {})
    if launch.get("abi") != "mosaic":
        raise ValueError(f"{name}.mlir.json is not a Mosaic artifact (launch abi {launch.get('abi')!r})")
    return launch


def check(directory, generations):
    if not os.path.isdir(directory):
        sys.exit(f"mosaic_check: {directory} is not a folder of KERNEL.mlir and KERNEL.json files")
    names = sorted(f[: -len(".mlir")] for f in os.listdir(directory) if f.endswith(".mlir"))
    if not names:
        sys.exit(f"mosaic_check: no .mlir module in {directory}")
    for gen in generations:
        topo = topologies.get_topology_desc(
            platform="tpu",
            topology_name=gen,
            chip_config_name="default",
            chips_per_host_bounds=(1, 1, 1),
            num_slices=1,
        )
        sharding = SingleDeviceSharding(topo.devices[0])
        for name in names:
            start = time.time()
            error = None
            try:
                with open(os.path.join(directory, name + ".mlir")) as f:
                    text = f.read()
                manifest = load_manifest(directory, name)
                missing = [k for k in ("kernel", "inputs", "outputs") if k not in manifest]
                if missing:
                    raise ValueError(f"{name}.json: the manifest lacks {', '.join(missing)}")
                ins = [
                    jax.ShapeDtypeStruct((a["elements"],), jnp.dtype(a["dtype"]), sharding=sharding)
                    for a in input_params(manifest)
                ]
                jax.jit(qforge_kernel(text, manifest)).lower(*ins).compile()
            except Exception as e:  # noqa: BLE001 - every rejection is reported
                error = " ".join(str(e).split())[:2000]
            print(
                json.dumps(
                    {
                        "kernel": name,
                        "generation": gen,
                        "ok": error is None,
                        "seconds": round(time.time() - start, 3),
                        "error": error,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    check(sys.argv[1], sys.argv[2:] or ["v5e:1x1", "v6e:1x1"])
