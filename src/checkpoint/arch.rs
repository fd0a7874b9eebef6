//! Which weights are quantized, decided as transformers' bitsandbytes integration decides it
//! (transformers 5.24: `replace_with_bnb_linear` converts modules whose type is exactly
//! `nn.Linear`, or `Conv1D`, and whose name no `modules_to_not_convert` entry matches).
//!
//! A checkpoint only has tensor names, so the module type of each 2-D `*.weight` comes from a
//! table per `model_type` (from `config.json`) and, for other model types, from names that are
//! `nn.Linear` in every transformers model that uses them. A 2-D weight that neither decides is an
//! error naming it (never a guess): quantizing a non-Linear weight gives a checkpoint transformers
//! cannot load, and leaving a Linear weight unquantized without saying so makes it wrap a
//! full-precision weight in a 4-bit layer.
//!
//! The config's `llm_int8_skip_modules` then lists every Linear module kept in full precision
//! (by `--skip` or by rule, like the output head), checked against transformers' matching rule
//! ([`skip_matches`]) so that no entry matches a quantized module.

use regex::Regex;

use crate::error::{Error, Result};

/// What a 2-D `*.weight` tensor is in the transformers model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An `nn.Linear` weight `[out, in]`: quantized.
    Linear,
    /// A GPT-2 `Conv1D` weight `[in, out]`: transposed to `[out, in]`, then quantized (as
    /// transformers does before `Params4bit` / `Int8Params`).
    Conv1D,
    /// An output head (`lm_head`, ...): an `nn.Linear` kept in full precision, as transformers
    /// keeps the output embeddings and tied weights.
    Head,
    /// Not converted by transformers: embeddings, MoE routers and experts stored as parameters.
    NotLinear,
}

/// The rules of one architecture family.
struct Family {
    /// `model_type` values that use it.
    model_types: &'static [&'static str],
    /// The base-model prefix transformers strips or adds between model classes.
    prefix: &'static str,
    /// `(pattern, role)`: the pattern must match the module name up to its end, starting at a
    /// module boundary.
    rules: &'static [(&'static str, Role)],
    /// Output heads transformers keeps that may be missing from the checkpoint (tied weights).
    heads: &'static [&'static str],
}

const LLAMA_ATTN: (&str, Role) = (
    r"layers\.\d+\.self_attn\.(q_proj|k_proj|v_proj|o_proj|qkv_proj)",
    Role::Linear,
);
const LLAMA_MLP: (&str, Role) = (
    r"layers\.\d+\.mlp\.(gate_proj|up_proj|down_proj|gate_up_proj)",
    Role::Linear,
);
const EMBED: (&str, Role) = (r"embed_tokens", Role::NotLinear);
const LM_HEAD: (&str, Role) = (r"lm_head", Role::Head);
const SCORE: (&str, Role) = (r"score", Role::Head);

const BERT_ENCODER: &[(&str, Role)] = &[
    (
        r"embeddings\.(word|position|token_type)_embeddings",
        Role::NotLinear,
    ),
    (
        r"layer\.\d+\.attention\.self\.(query|key|value)",
        Role::Linear,
    ),
    (
        r"layer\.\d+\.(attention\.output|intermediate|output)\.dense",
        Role::Linear,
    ),
    (r"pooler\.dense", Role::Linear),
];

const FAMILIES: &[Family] = &[
    Family {
        model_types: &[
            "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "olmo2",
            "granite", "cohere",
        ],
        prefix: "model",
        rules: &[LLAMA_ATTN, LLAMA_MLP, EMBED, LM_HEAD, SCORE],
        heads: &["lm_head"],
    },
    Family {
        model_types: &["mixtral"],
        prefix: "model",
        rules: &[
            LLAMA_ATTN,
            EMBED,
            LM_HEAD,
            SCORE,
            // transformers 5 stores the experts as 3-D parameters and the router as a plain
            // parameter: neither is an nn.Linear, in either checkpoint layout.
            (
                r"layers\.\d+\.block_sparse_moe\.(gate|experts\.\d+\.w[123])",
                Role::NotLinear,
            ),
            (r"layers\.\d+\.mlp\.gate", Role::NotLinear),
        ],
        heads: &["lm_head"],
    },
    Family {
        model_types: &["qwen2_moe", "qwen3_moe"],
        prefix: "model",
        rules: &[
            LLAMA_ATTN,
            EMBED,
            LM_HEAD,
            SCORE,
            (r"layers\.\d+\.mlp\.gate", Role::NotLinear),
            (
                r"layers\.\d+\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)",
                Role::NotLinear,
            ),
            (
                r"layers\.\d+\.mlp\.shared_expert\.(gate_proj|up_proj|down_proj)",
                Role::Linear,
            ),
            (r"layers\.\d+\.mlp\.shared_expert_gate", Role::Linear),
            LLAMA_MLP,
        ],
        heads: &["lm_head"],
    },
    Family {
        model_types: &["gpt2"],
        prefix: "transformer",
        rules: &[
            (r"h\.\d+\.attn\.(c_attn|c_proj|q_attn)", Role::Conv1D),
            (
                r"h\.\d+\.crossattention\.(c_attn|c_proj|q_attn)",
                Role::Conv1D,
            ),
            (r"h\.\d+\.mlp\.(c_fc|c_proj)", Role::Conv1D),
            (r"wte|wpe", Role::NotLinear),
            (r"lm_head", Role::Head),
            (r"score", Role::Head),
        ],
        heads: &["lm_head"],
    },
    Family {
        model_types: &["bert"],
        prefix: "bert",
        rules: &[
            BERT_ENCODER[0],
            BERT_ENCODER[1],
            BERT_ENCODER[2],
            BERT_ENCODER[3],
            (r"cls\.predictions\.transform\.dense", Role::Linear),
            (r"cls\.predictions\.decoder", Role::Head),
            (r"cls\.seq_relationship", Role::Linear),
            (r"classifier|qa_outputs", Role::Linear),
        ],
        heads: &["cls.predictions.decoder"],
    },
    Family {
        model_types: &["roberta", "xlm-roberta"],
        prefix: "roberta",
        rules: &[
            BERT_ENCODER[0],
            BERT_ENCODER[1],
            BERT_ENCODER[2],
            BERT_ENCODER[3],
            (r"lm_head\.dense", Role::Linear),
            (r"lm_head\.decoder", Role::Head),
            (
                r"classifier\.(dense|out_proj)|classifier|qa_outputs",
                Role::Linear,
            ),
        ],
        heads: &["lm_head.decoder"],
    },
];

/// Names that are `nn.Linear` (or embeddings and heads) in every transformers model that uses
/// them: the rules for a `model_type` not in the table, or a checkpoint without `config.json`.
const GENERIC: Family = Family {
    model_types: &[],
    prefix: "model",
    rules: &[
        (
            r"layers\.\d+\.(self_attn|attention|attn)\.(q_proj|k_proj|v_proj|o_proj)",
            Role::Linear,
        ),
        (
            r"layers\.\d+\.mlp\.(gate_proj|up_proj|down_proj)",
            Role::Linear,
        ),
        (
            r"embed_tokens|word_embeddings|position_embeddings|token_type_embeddings|wte|wpe",
            Role::NotLinear,
        ),
        (r"lm_head", Role::Head),
    ],
    heads: &["lm_head"],
};

/// The module-type rules of one checkpoint.
pub struct Arch {
    model_type: Option<String>,
    family: &'static Family,
    rules: Vec<(Regex, Role)>,
    known: bool,
}

impl Arch {
    /// The rules for `model_type` (`None`: no `config.json`).
    pub fn new(model_type: Option<&str>) -> Arch {
        let family = model_type
            .and_then(|t| FAMILIES.iter().find(|f| f.model_types.contains(&t)))
            .unwrap_or(&GENERIC);
        let rules = family
            .rules
            .iter()
            .map(|(p, r)| {
                let re = Regex::new(&format!(r"(^|\.)({p})$")).expect("table patterns are valid");
                (re, *r)
            })
            .collect();
        Arch {
            model_type: model_type.map(str::to_string),
            family,
            known: !std::ptr::eq(family, &GENERIC),
            rules,
        }
    }

    /// The model type as the config names it.
    pub fn model_type(&self) -> Option<&str> {
        self.model_type.as_deref()
    }

    /// What module `module` (a 2-D weight's name without `.weight`) is.
    ///
    /// # Errors
    /// [`Error::Tensor`]-style message (the caller adds the file) when the table cannot decide.
    pub fn role(&self, module: &str) -> std::result::Result<Role, String> {
        if let Some((_, role)) = self.rules.iter().find(|(re, _)| re.is_match(module)) {
            return Ok(*role);
        }
        let arch = match (&self.model_type, self.known) {
            (Some(t), true) => format!("model_type '{t}'"),
            (Some(t), false) => format!(
                "model_type '{t}', which is not in qforge's architecture table (docs/formats.md)"
            ),
            (None, _) => "a checkpoint without config.json".to_string(),
        };
        Err(format!(
            "cannot tell whether this 2-D weight is an nn.Linear that transformers quantizes \
             ({arch}); quantizing anything else makes the checkpoint unloadable, so qforge does \
             not guess: keep it in full precision with --skip '{}'",
            regex::escape(module)
        ))
    }

    /// Output heads to list in `llm_int8_skip_modules` even when their weight is not in the
    /// checkpoint (tied to the embeddings).
    pub fn heads(&self) -> &'static [&'static str] {
        self.family.heads
    }

    /// The base-model prefix (`model`, `transformer`, `bert`, ...).
    pub fn prefix(&self) -> &'static str {
        self.family.prefix
    }
}

/// transformers' `should_convert_module` rule: does skip entry `key` keep module `name` out of
/// the conversion? `re.match(rf"(?:{key})(?:(?<=\.)|(?=\.|$))", name) or name.endswith(key)`,
/// for keys made of `[A-Za-z0-9_.-]` (where the regex is a literal with `.` matching any
/// character).
pub fn skip_matches(key: &str, name: &str) -> bool {
    if name.ends_with(key) {
        return true;
    }
    let (k, n) = (key.as_bytes(), name.as_bytes());
    if n.len() < k.len() || k.iter().zip(n).any(|(a, b)| *a != b'.' && a != b) {
        return false;
    }
    let p = k.len();
    (p > 0 && n[p - 1] == b'.') || p == n.len() || n[p] == b'.'
}

/// True for a name that transformers' regex reads literally (up to `.` matching any character).
pub fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
}

/// The `llm_int8_skip_modules` list for `kept` Linear modules (checkpoint names) and the output
/// heads of `arch`, each written without the base-model prefix so it matches whether the model is
/// loaded with or without its head class; checked to match no `quantized` module in either form.
///
/// # Errors
/// [`Error::Usage`] naming the entry and the module when an entry would also keep a quantized
/// module out of the conversion, or a name transformers would read as a regex.
pub fn skip_modules(arch: &Arch, kept: &[String], quantized: &[String]) -> Result<Vec<String>> {
    let prefix = format!("{}.", arch.prefix());
    let strip = |m: &str| m.strip_prefix(prefix.as_str()).unwrap_or(m).to_string();
    let mut entries: Vec<String> = arch.heads().iter().map(|h| h.to_string()).collect();
    for k in kept {
        let e = strip(k);
        if !entries.contains(&e) {
            entries.push(e);
        }
    }
    entries.sort();
    entries.dedup();
    for e in &entries {
        if !plain_name(e) {
            return Err(Error::Usage(format!(
                "module '{e}' must be listed in llm_int8_skip_modules but its name holds \
                 characters transformers reads as a regex"
            )));
        }
    }
    // Only keep head entries that do not collide: a head absent from this architecture's modules
    // (e.g. a base model) is harmless, one that matches a quantized module is not.
    let mut out = Vec::new();
    for e in entries {
        let mut clash = None;
        'q: for q in quantized {
            for form in [q.clone(), strip(q), format!("{prefix}{}", strip(q))] {
                if skip_matches(&e, &form) {
                    clash = Some(q.clone());
                    break 'q;
                }
            }
        }
        match clash {
            None => out.push(e),
            Some(q)
                if arch.heads().contains(&e.as_str()) && !kept.iter().any(|k| strip(k) == e) =>
            {
                let _ = q; // a head this model does not have under that name: leave it out
            }
            Some(q) => {
                return Err(Error::Usage(format!(
                    "llm_int8_skip_modules entry '{e}' (kept in full precision) would also keep \
                     the quantized module '{q}' out of transformers' 4-bit conversion; keep both \
                     with --skip, or neither"
                )))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching_follows_transformers() {
        assert!(skip_matches("layer.1", "layer.1.attn"));
        assert!(!skip_matches("layer.1", "layer.11.attn"));
        assert!(skip_matches("fc1", "model.decoder.layers.23.fc1"));
        assert!(!skip_matches("mlp.gate", "mlp.gate_proj"));
        assert!(skip_matches("lm_head", "lm_head"));
        assert!(skip_matches("lm_head", "lm_head.dense"));
        assert!(skip_matches(
            "layers.0.mlp.down_proj",
            "model.layers.0.mlp.down_proj"
        ));
        assert!(!skip_matches(
            "layers.1.mlp.down_proj",
            "model.layers.11.mlp.down_proj"
        ));
    }

    #[test]
    fn roles_by_family() {
        let gpt2 = Arch::new(Some("gpt2"));
        assert_eq!(gpt2.role("transformer.h.0.attn.c_attn"), Ok(Role::Conv1D));
        assert_eq!(gpt2.role("h.11.mlp.c_proj"), Ok(Role::Conv1D));
        assert_eq!(gpt2.role("transformer.wte"), Ok(Role::NotLinear));
        let mixtral = Arch::new(Some("mixtral"));
        assert_eq!(
            mixtral.role("model.layers.0.block_sparse_moe.gate"),
            Ok(Role::NotLinear)
        );
        assert_eq!(
            mixtral.role("model.layers.0.self_attn.q_proj"),
            Ok(Role::Linear)
        );
        let qwen = Arch::new(Some("qwen2_moe"));
        assert_eq!(
            qwen.role("model.layers.3.mlp.shared_expert_gate"),
            Ok(Role::Linear)
        );
        assert_eq!(qwen.role("model.layers.3.mlp.gate"), Ok(Role::NotLinear));
        assert_eq!(qwen.role("model.layers.3.mlp.gate_proj"), Ok(Role::Linear));
        let unknown = Arch::new(Some("t5"));
        let e = unknown
            .role("encoder.block.0.layer.0.SelfAttention.q")
            .unwrap_err();
        assert!(e.contains("not in qforge's architecture table"), "{e}");
        assert!(e.contains("--skip"), "{e}");
        assert_eq!(
            unknown.role("model.layers.0.mlp.down_proj"),
            Ok(Role::Linear)
        );
        let bert = Arch::new(Some("bert"));
        assert_eq!(bert.role("encoder.layer.5.output.dense"), Ok(Role::Linear));
        assert_eq!(bert.role("pooler.dense"), Ok(Role::Linear));
        assert_eq!(bert.role("embeddings.word_embeddings"), Ok(Role::NotLinear));
    }

    #[test]
    fn skip_list_is_checked_against_quantized_modules() {
        let llama = Arch::new(Some("llama"));
        let q = vec!["model.layers.1.mlp.down_proj".to_string()];
        let kept = vec!["model.layers.11.mlp.down_proj".to_string()];
        assert_eq!(
            skip_modules(&llama, &kept, &q).unwrap(),
            ["layers.11.mlp.down_proj", "lm_head"]
        );
        let roberta = Arch::new(Some("roberta"));
        let q = vec!["lm_head.dense".to_string()];
        assert_eq!(
            skip_modules(&roberta, &[], &q).unwrap(),
            ["lm_head.decoder"]
        );
        // A kept module whose name is a suffix of a quantized one's cannot be listed safely.
        let kept = vec!["model.layers.0.mlp.down_proj".to_string()];
        let q = vec!["model.vision.layers.0.mlp.down_proj".to_string()];
        let e = skip_modules(&llama, &kept, &q).unwrap_err().to_string();
        assert!(e.contains("would also keep"), "{e}");
    }
}
