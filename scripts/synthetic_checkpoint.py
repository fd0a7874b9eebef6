"""Writes a synthetic sharded bf16 checkpoint of a Llama-7B-class layout (hidden 4096, intermediate
11008, vocab 32000, untied head) as a Hugging Face model folder, for measuring `qforge quantize` and
`dequantize` memory on multi-GB inputs (docs/bench.md). Uses only numpy and the standard library.

Usage: python scripts/synthetic_checkpoint.py OUT_DIR [LAYERS=32] [SHARD_GB=2]
       python scripts/synthetic_checkpoint.py OUT_DIR --big ROWS COLS
The second form writes one f32 weight [ROWS, COLS] (e.g. 65536 x 32769: more than 2^31
elements) in a single-file model folder.
"""

import json
import os
import sys

import numpy as np


def bf16_chunks(rng, n):
    """n pseudo-normal bf16 values (std 0.02), as byte chunks."""
    step = 1 << 24
    for start in range(0, n, step):
        k = min(step, n - start)
        f = (rng.standard_normal(k, dtype=np.float32) * np.float32(0.02)).view(np.uint32)
        yield (f >> 16).astype(np.uint16).tobytes()


def write_shard(path, tensors):
    """tensors: list of (name, dtype, shape, nbytes, producer) written without holding them all."""
    header = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, dtype, shape, nbytes, _ in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + nbytes]}
        at += nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for _, _, _, nbytes, produce in tensors:
            written = 0
            for chunk in produce():
                f.write(chunk)
                written += len(chunk)
            assert written == nbytes


def llama(out, layers, shard_gb):
    h, inter, vocab = 4096, 11008, 32000
    rng = np.random.default_rng(0)
    specs = [("model.embed_tokens.weight", [vocab, h]), ("lm_head.weight", [vocab, h]), ("model.norm.weight", [h])]
    for l in range(layers):
        p = f"model.layers.{l}."
        specs += [
            (p + "self_attn.q_proj.weight", [h, h]),
            (p + "self_attn.k_proj.weight", [h, h]),
            (p + "self_attn.v_proj.weight", [h, h]),
            (p + "self_attn.o_proj.weight", [h, h]),
            (p + "mlp.gate_proj.weight", [inter, h]),
            (p + "mlp.up_proj.weight", [inter, h]),
            (p + "mlp.down_proj.weight", [h, inter]),
            (p + "input_layernorm.weight", [h]),
            (p + "post_attention_layernorm.weight", [h]),
        ]
    shards, cur, size = [], [], 0
    for name, shape in specs:
        n = int(np.prod(shape))
        if cur and size + 2 * n > shard_gb * 1e9:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, "BF16", shape, 2 * n, (lambda n=n: bf16_chunks(rng, n))))
        size += 2 * n
    shards.append(cur)
    os.makedirs(out, exist_ok=True)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_shard(os.path.join(out, fname), shard)
        for t in shard:
            weight_map[t[0]] = fname
            total += t[3]
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{out}: {len(shards)} shards, {total} bytes")


def big(out, rows, cols):
    os.makedirs(out, exist_ok=True)
    n = rows * cols
    rng = np.random.default_rng(1)

    def produce():
        step = 1 << 26
        for start in range(0, n, step):
            k = min(step, n - start)
            yield (rng.standard_normal(k, dtype=np.float32) * np.float32(0.02)).tobytes()

    write_shard(
        os.path.join(out, "model.safetensors"),
        [("model.layers.0.mlp.down_proj.weight", "F32", [rows, cols], 4 * n, produce)],
    )
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"model_type": "llama"}, f)
    print(f"{out}: one [{rows}, {cols}] f32 weight, {n} elements")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "--big":
        big(sys.argv[1], int(sys.argv[3]), int(sys.argv[4]))
    else:
        llama(
            sys.argv[1],
            int(sys.argv[2]) if len(sys.argv) > 2 else 32,
            float(sys.argv[3]) if len(sys.argv) > 3 else 2,
        )
