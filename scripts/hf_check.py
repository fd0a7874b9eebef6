"""Checks qforge's outputs with transformers + bitsandbytes, for tests/transformers.rs.

Reads jobs as JSON lines on stdin, prints one JSON result line per job on stdout. A job:
  {"job": name, "check": "quantized", "orig": dir, "out": dir, "kind": "causal"|"base",
   "format": "4bit"|"int8", "quant_type": "nf4", "double_quant": bool, "quant_storage": "uint8",
   "skip_modules": [...] (optional, given to bitsandbytes as llm_int8_skip_modules)}
    loads `out` with transformers (the config's quantization_config) and `orig` with bitsandbytes'
    on-the-fly quantization of the same options (transformers' defaults otherwise), and compares:
    which modules are quantized, every quantized tensor byte for byte (codes, absmax, nested
    absmax, offset; int8: CB and SCB), and the outputs (logits or last hidden state) exactly.
  {"job": name, "check": "refused", "out": dir, "kind": ...}
    expects transformers to refuse loading `out` (qforge's int8-blockwise layout).
  {"job": name, "check": "restored", "orig": dir, "restored": dir, "kind": ..., "format": ...,
   ...options as "quantized"}
    loads `restored` (qforge dequantize's output) as a plain model and compares each restored
    weight with bitsandbytes' own dequantization of the on-the-fly quantized weight (Conv1D
    weights transposed back), byte for byte; the other tensors with the original.
Result: {"job", "ok", "error"?, "modules": [differences], "tensors": {name: [differing, total]},
"outputs_equal", "max_abs_diff"}.
"""

import json
import os
import sys
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from bitsandbytes import functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoModel, AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402
from transformers.pytorch_utils import Conv1D  # noqa: E402

DTYPES = {"uint8": torch.uint8, "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def cls_of(job):
    return AutoModelForCausalLM if job["kind"] == "causal" else AutoModel


def bnb_config(job):
    if job["format"] == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=job["quant_type"],
        bnb_4bit_use_double_quant=job["double_quant"],
        bnb_4bit_compute_dtype=torch.float32,
        bnb_4bit_quant_storage=DTYPES[job["quant_storage"]],
        llm_int8_skip_modules=job.get("skip_modules"),
    )



def outputs(model):
    # bitsandbytes' AVX512-BF16 CPU path repacks 4-bit weights and asserts that the output
    # features divide its block (a [1, 64] gate does not); the plain path is used for both models.
    for m in model.modules():
        if hasattr(m, "support_avx512bf16_for_cpu"):
            m.support_avx512bf16_for_cpu = False
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def diff_count(a, b):
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.shape != b.shape or a.dtype != b.dtype:
        return [-1, a.numel(), f"{tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"]
    a8 = a.view(torch.uint8) if a.dtype != torch.uint8 else a
    b8 = b.view(torch.uint8) if b.dtype != torch.uint8 else b
    return [int((a8 != b8).sum()), a8.numel()]


def quant_modules(model):
    return {n: m for n, m in model.named_modules() if type(m).__name__ in ("Linear4bit", "Linear8bitLt")}


def fp4_zero_signs(a, b):
    """Differing nibbles of packed FP4 codes: (explained, unexplained). Explained: codes 0 vs 8
    (docs/compat.md category (b): bitsandbytes' CPU quantizer gives tiny positive values code 8 and
    -0.0 code 0; qforge, like the CUDA kernel, uses the sign bit)."""
    a8, b8 = a.contiguous().view(torch.uint8).flatten(), b.contiguous().view(torch.uint8).flatten()
    explained = unexplained = 0
    for i in torch.nonzero(a8 != b8).flatten().tolist():
        x, y = int(a8[i]), int(b8[i])
        for sx, sy in ((x >> 4, y >> 4), (x & 15, y & 15)):
            if sx != sy:
                if {sx, sy} == {0, 8}:
                    explained += 1
                else:
                    unexplained += 1
    return explained, unexplained


def lut_codes(raw_absmax, offset, nested_absmax, q_ref, q_ours):
    """Differing double-quantization codes: (explained, unexplained). Explained (docs/compat.md
    category (c): bitsandbytes' CPU 8-bit quantizer uses a 65536-entry LUT and does not always pick
    the nearest code): the codes are neighbours and qforge's is at least as near to
    (absmax - offset) / nested_absmax as bitsandbytes', or the nested block is all zeros."""
    code = F.create_dynamic_map(signed=True).double()
    x = (raw_absmax.float() - offset.float()).double()
    scale = nested_absmax.double().repeat_interleave(256)[: x.numel()]
    v = x / scale
    explained = unexplained = 0
    for i in torch.nonzero(q_ref != q_ours).flatten().tolist():
        r, o = int(q_ref[i]), int(q_ours[i])
        if scale[i] == 0:
            # A zero nested block (e.g. one 4-bit block: absmax - mean = 0): bitsandbytes' CPU
            # path gives code 0, qforge the code of 0.0; both decode to code * 0 + offset.
            explained += 1
        elif abs(r - o) == 1 and abs(code[o] - v[i]) <= abs(code[r] - v[i]):
            explained += 1
        else:
            unexplained += 1
    return explained, unexplained


def compare_states(ref, ours, orig, result):
    rm, om = quant_modules(ref), quant_modules(ours)
    result["modules"] = sorted(set(rm) ^ set(om))
    result["explained"] = {"fp4_zero_sign": 0, "lut_code": 0}
    for name in sorted(set(rm) & set(om)):
        a, b = rm[name].weight, om[name].weight
        if type(rm[name]).__name__ == "Linear8bitLt":
            result["tensors"][name + ".weight"] = diff_count(a.data, b.data)
            result["tensors"][name + ".SCB"] = diff_count(a.SCB, b.SCB)
            continue
        qa, qb = a.quant_state, b.quant_state
        d = diff_count(a.data, b.data)
        if d[0] > 0 and qa.quant_type == "fp4":
            explained, unexplained = fp4_zero_signs(a.data, b.data)
            result["explained"]["fp4_zero_sign"] += explained
            d = [unexplained, d[1]]
        result["tensors"][name + ".weight"] = d
        d = diff_count(qa.absmax, qb.absmax)
        same_offset = qa.nested and diff_count(qa.offset.reshape(1), qb.offset.reshape(1))[0] == 0
        if d[0] > 0 and same_offset:
            w = orig[name]
            if issubclass(getattr(rm[name], "source_cls", object), Conv1D):
                w = w.t()
            _, raw = F.quantize_4bit(w.contiguous(), blocksize=qa.blocksize, quant_type=qa.quant_type)
            explained, unexplained = lut_codes(raw.absmax, qb.offset, qb.state2.absmax, qa.absmax, qb.absmax)
            result["explained"]["lut_code"] += explained
            d = [unexplained, d[1]]
        result["tensors"][name + ".absmax"] = d
        if list(qa.shape) != list(qb.shape) or qa.dtype != qb.dtype:
            result["tensors"][name + ".shape"] = [1, 1, f"{qa.shape} {qa.dtype} vs {qb.shape} {qb.dtype}"]
        if qa.nested:
            result["tensors"][name + ".nested_absmax"] = diff_count(qa.state2.absmax, qb.state2.absmax)
            result["tensors"][name + ".offset"] = diff_count(qa.offset.reshape(1), qb.offset.reshape(1))


def original_weights(job):
    """The original model's weights by module name (as the model names them)."""
    model = cls_of(job).from_pretrained(job["orig"])
    return {n: m.weight.data for n, m in model.named_modules() if getattr(m, "weight", None) is not None}


def check_quantized(job, result):
    cls = cls_of(job)
    ref = cls.from_pretrained(job["orig"], quantization_config=bnb_config(job))
    ours = cls.from_pretrained(job["out"])
    compare_states(ref, ours, original_weights(job), result)
    a, b = outputs(ref), outputs(ours)
    result["outputs_equal"] = bool(torch.equal(a, b))
    result["max_abs_diff"] = float((a.float() - b.float()).abs().max())
    # A double-quantization code that differs by category (c) changes a block's scale and so the
    # outputs; no other difference may.
    result["ok"] = (
        (result["outputs_equal"] or result["explained"]["lut_code"] > 0)
        and not result["modules"]
        and all(v[0] == 0 for v in result["tensors"].values())
        and len(result["tensors"]) > 0
    )


def check_refused(job, result):
    try:
        cls_of(job).from_pretrained(job["out"])
        result["ok"] = False
        result["error"] = "transformers loaded the folder"
    except Exception as e:  # noqa: BLE001
        result["ok"] = True
        result["refusal"] = f"{type(e).__name__}: {e}"[:300]


def tensors_of(folder):
    files = [f for f in os.listdir(folder) if f.endswith(".safetensors")]
    out = {}
    for f in files:
        with safe_open(os.path.join(folder, f), "pt") as st:
            for k in st.keys():
                out[k] = st.get_tensor(k)
    return out


def check_restored(job, result):
    """qforge dequantize's output against bitsandbytes' dequantization of the same quantized
    checkpoint (qforge's, loaded by transformers), byte for byte; other tensors as the original."""
    cls = cls_of(job)
    ours = cls.from_pretrained(job["out"])
    result["explained"] = {"fp4_zero_dequant": 0}
    restored = tensors_of(job["restored"])
    original = tensors_of(job["orig"])
    names = {}
    for n, m in ours.named_modules():
        if type(m).__name__ == "Linear4bit":
            w = F.dequantize_4bit(m.weight.data, m.weight.quant_state)
        elif type(m).__name__ == "Linear8bitLt":
            w = F.int8_vectorwise_dequant(m.weight.data, m.weight.SCB)
        else:
            continue
        if issubclass(getattr(m, "source_cls", object), Conv1D):
            w = w.t()
        names[n + ".weight"] = w
    for key, want in restored.items():
        # The checkpoint may use names without the base-model prefix, the model with it.
        match = [n for n in names if n == key or n.endswith("." + key) or key.endswith("." + n)]
        if match:
            w = names[match[0]]
            if w.dtype != want.dtype:
                w = w.to(want.dtype)
            d = diff_count(w, want)
            if d[0] > 0 and job.get("quant_type") == "fp4":
                # docs/compat.md category (e): bitsandbytes' CPU dequantization reads FP4 code 8
                # as +0.0 from its Python table, qforge as -0.0 (the CUDA table). Explained when
                # both values are zeros.
                diff = w.flatten() != want.flatten()
                zeros = (w.flatten()[diff] == 0) & (want.flatten()[diff] == 0)
                result["explained"]["fp4_zero_dequant"] += int(zeros.sum())
                d = [int((~zeros).sum()), w.numel()]
            result["tensors"][key] = d
        elif key in original:
            result["tensors"][key] = diff_count(original[key], want)
        else:
            result["tensors"][key] = [1, 1, "not in the original"]
    result["modules"] = sorted(set(original) - set(restored))
    outputs(cls.from_pretrained(job["restored"]))
    result["ok"] = len(names) > 0 and not result["modules"] and all(v[0] == 0 for v in result["tensors"].values())


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        job = json.loads(line)
        result = {"job": job["job"], "ok": False, "modules": [], "tensors": {}}
        try:
            {"quantized": check_quantized, "refused": check_refused, "restored": check_restored}[job["check"]](
                job, result
            )
        except Exception as e:  # noqa: BLE001
            result["error"] = f"{type(e).__name__}: {e}"
            result["trace"] = traceback.format_exc()[-2000:]
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
