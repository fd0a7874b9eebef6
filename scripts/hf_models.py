"""Builds tiny transformers models with random weights and saves them as Hugging Face model
folders, for tests/transformers.rs: GPT-2 (Conv1D, tied head), Llama untied (bf16, sharded with a
small max_shard_size), Llama tied (f16), BERT (base model, f32) and two MoE layouts (Qwen2-MoE with a
shared expert, Mixtral). Each folder also gets a tokenizer-like file and generation_config.json,
which `qforge quantize` must copy.

Usage: python scripts/hf_models.py OUT_DIR
Prints one JSON line per model: {"name", "path", "kind" (causal | base), "model_type"}.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModel, AutoModelForCausalLM  # noqa: E402

SMALL = dict(vocab_size=128, max_position_embeddings=64)


def models():
    llama = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **SMALL,
    )
    return [
        (
            "gpt2",
            transformers.GPT2Config(
                n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0
            ),
            AutoModelForCausalLM,
            "causal",
            torch.float32,
            None,
        ),
        (
            "llama-untied",
            transformers.LlamaConfig(tie_word_embeddings=False, **llama),
            AutoModelForCausalLM,
            "causal",
            torch.bfloat16,
            "60KB",
        ),
        (
            "llama-tied",
            transformers.LlamaConfig(tie_word_embeddings=True, **llama),
            AutoModelForCausalLM,
            "causal",
            torch.float16,
            None,
        ),
        (
            "bert",
            transformers.BertConfig(
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=128,
                vocab_size=128,
                max_position_embeddings=64,
            ),
            AutoModel,
            "base",
            torch.float32,
            None,
        ),
        (
            "qwen2-moe",
            transformers.Qwen2MoeConfig(
                moe_intermediate_size=64,
                shared_expert_intermediate_size=64,
                num_experts=4,
                num_experts_per_tok=2,
                **llama,
            ),
            AutoModelForCausalLM,
            "causal",
            torch.float32,
            None,
        ),
        (
            "mixtral",
            transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **llama),
            AutoModelForCausalLM,
            "causal",
            torch.float32,
            None,
        ),
    ]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for i, (name, config, cls, kind, dtype, shard) in enumerate(models()):
        torch.manual_seed(1000 + i)
        model = cls.from_config(config).to(dtype)
        # transformers' init leaves some weights at exact zeros/ones; spread every float tensor so
        # each block has its own absmax.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        path = os.path.join(out, name)
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(path, **kwargs)
        with open(os.path.join(path, "tokenizer.json"), "w") as f:
            json.dump({"model": {"type": "test", "vocab": {str(t): t for t in range(8)}}}, f)
        print(json.dumps({"name": name, "path": path, "kind": kind, "model_type": config.model_type}))


if __name__ == "__main__":
    main()
