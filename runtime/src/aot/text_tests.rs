//! [`TextStore`]'s choice of an embedded artifact, with PTX artifacts (no GPU needed): the
//! artifact of the kernel's content hash and the device's settings, or the policy's error or
//! fallback naming the kernel and what was wrong.

use qforge_codegen::compile::{compile, fnv1a, Artifact, Launch, Manifest, Options, Target};
use qforge_codegen::ptx::SmTarget;
use qforge_ir::Kernel;

use super::tests::scale;
use super::*;

fn leak_str(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// The record `qforge-build` would generate for `artifact`, with `code` as its code (the
/// artifact's own when `None`); the manifest's code hash is that of `code`.
pub(crate) fn embed_code(artifact: &Artifact, code: Option<Vec<u8>>) -> TextArtifact {
    let code: &'static [u8] = Box::leak(
        code.unwrap_or_else(|| artifact.code.bytes())
            .into_boxed_slice(),
    );
    let mut manifest = artifact.manifest.clone();
    manifest.code_hash = qforge_codegen::compile::hex(fnv1a(code));
    let settings: Vec<(&'static str, &'static str)> = manifest
        .settings
        .iter()
        .map(|(k, v)| (leak_str(k), leak_str(v)))
        .collect();
    let hash = |h: &str| u64::from_str_radix(h, 16).expect("hex hash");
    TextArtifact {
        name: leak_str(&manifest.kernel),
        content_hash: hash(&manifest.content_hash),
        target: leak_str(&manifest.target),
        settings: Box::leak(settings.into_boxed_slice()),
        manifest_version: manifest.manifest_version,
        code,
        code_hash: hash(&manifest.code_hash),
        manifest: leak_str(&manifest.to_json()),
    }
}

/// [`embed_code`] with the artifact's own code.
pub(crate) fn embed(artifact: &Artifact) -> TextArtifact {
    embed_code(artifact, None)
}

/// `artifact` relabelled as the artifact of `kernel` (name and content hash, in the record and
/// in its manifest): what a build of other kernel text under this name would embed.
pub(crate) fn relabel(mut artifact: Artifact, kernel: &Kernel) -> Artifact {
    artifact.manifest.kernel = kernel.name.clone();
    artifact.manifest.content_hash = qforge_codegen::compile::hex(kernel.content_hash());
    artifact
}

pub(crate) fn leak(records: Vec<TextArtifact>) -> &'static [&'static TextArtifact] {
    let refs: Vec<&'static TextArtifact> = records
        .into_iter()
        .map(|r| &*Box::leak(Box::new(r)))
        .collect();
    Box::leak(refs.into_boxed_slice())
}

fn ptx(kernel: &Kernel, sm: SmTarget) -> Artifact {
    compile(kernel, &Target::Ptx(sm), &Options::default()).expect("compiles")
}

/// The device's launch check: a PTX entry.
fn entry(m: &Manifest) -> std::result::Result<String, String> {
    match &m.launch {
        Launch::Ptx { entry, .. } => Ok(entry.clone()),
        other => Err(format!("launches as {other:?}")),
    }
}

fn chosen(store: &TextStore, kernel: &Kernel, sm: SmTarget) -> Option<&'static TextArtifact> {
    store
        .select(kernel, &Target::Ptx(sm), entry)
        .expect("selects")
        .map(|(e, _)| e.artifact)
}

fn refusal(store: &TextStore, kernel: &Kernel, sm: SmTarget) -> String {
    store
        .select(kernel, &Target::Ptx(sm), entry)
        .expect_err("refused")
        .to_string()
}

#[test]
fn the_artifact_of_the_kernels_hash_and_the_devices_sm_is_chosen() {
    let kernel = scale("scale2", 2.0);
    let text = leak(vec![
        embed(&ptx(&kernel, SmTarget::Sm80)),
        embed(&ptx(&kernel, SmTarget::Sm90)),
    ]);
    let store = TextStore::new("cuda", text, Policy::RequireAot);
    for sm in SmTarget::ALL {
        let (e, entry) = store
            .select(&kernel, &Target::Ptx(sm), entry)
            .expect("selects")
            .expect("an artifact");
        let jit = ptx(&kernel, sm);
        assert_eq!(Some(e.code), jit.code.text(), "{sm:?}");
        assert_eq!(e.manifest, jit.manifest, "{sm:?}");
        assert!(matches!(&jit.manifest.launch, Launch::Ptx { entry: e, .. } if *e == entry));
        assert_eq!(
            e.artifact.settings.iter().find(|(k, _)| *k == "sm"),
            Some(&("sm", sm.name()))
        );
    }
    // JitOnly ignores valid artifacts.
    let store = TextStore::new("cuda", text, Policy::JitOnly);
    assert!(chosen(&store, &kernel, SmTarget::Sm90).is_none());
}

#[test]
fn require_names_missing_stale_wrong_sm_and_corrupted_artifacts() {
    let kernel = scale("scale2", 2.0);
    let changed = scale("scale2", 3.0);
    let good = ptx(&kernel, SmTarget::Sm80);
    let wgsl = compile(
        &scale("only_wgsl", 2.0),
        &Target::Wgsl(Default::default()),
        &Options::default(),
    )
    .expect("compiles");
    let mut flipped = good.code.bytes();
    flipped[0] ^= 1;
    let mut corrupted = embed(&relabel(good.clone(), &scale("corrupt", 2.0)));
    corrupted.code = Box::leak(flipped.into_boxed_slice());
    // A record of `bad_manifest` whose manifest is `scale2`'s.
    let mut bad_manifest = embed(&good);
    bad_manifest.name = "bad_manifest";
    bad_manifest.content_hash = scale("bad_manifest", 2.0).content_hash();
    let mut old = embed(&relabel(good.clone(), &scale("old", 2.0)));
    old.manifest_version += 1;
    let text = leak(vec![
        embed(&good),
        embed(&wgsl),
        corrupted,
        bad_manifest,
        old,
    ]);
    let store = TextStore::new("cuda", text, Policy::RequireAot);
    let hash = |k: &Kernel| format!("{:016x}", k.content_hash());

    let e = refusal(&store, &scale("absent", 2.0), SmTarget::Sm80);
    assert!(
        e.contains("'absent'") && e.contains("no embedded ptx artifact") && e.contains("cuda"),
        "{e}"
    );
    let e = refusal(&store, &scale("only_wgsl", 2.0), SmTarget::Sm80);
    assert!(
        e.contains("'only_wgsl'") && e.contains("artifacts for wgsl only"),
        "{e}"
    );
    let e = refusal(&store, &changed, SmTarget::Sm80);
    assert!(
        e.contains("'scale2' is stale")
            && e.contains(&hash(&kernel))
            && e.contains(&hash(&changed)),
        "{e}"
    );
    let e = refusal(&store, &kernel, SmTarget::Sm90);
    assert!(
        e.contains("'scale2'") && e.contains("sm=sm_80") && e.contains("not sm=sm_90"),
        "{e}"
    );
    let e = refusal(&store, &scale("corrupt", 2.0), SmTarget::Sm80);
    assert!(
        e.contains("'corrupt'") && e.contains("corrupted: code hash"),
        "{e}"
    );
    let e = refusal(&store, &scale("bad_manifest", 2.0), SmTarget::Sm80);
    assert!(
        e.contains("'bad_manifest'") && e.contains("corrupted manifest: kernel is scale2"),
        "{e}"
    );
    let e = refusal(&store, &scale("old", 2.0), SmTarget::Sm80);
    assert!(e.contains("'old'") && e.contains("manifest version"), "{e}");
    // A launch shape the device refuses is the artifact's error too.
    let e = store
        .select(&kernel, &Target::Ptx(SmTarget::Sm80), |_| {
            Err::<(), _>("threads per block 0".to_string())
        })
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("'scale2' cannot launch here: threads per block 0"),
        "{e}"
    );
    // PreferAot falls back (None) in every one of these cases, and uses the good one.
    let store = TextStore::new("cuda", text, Policy::PreferAot);
    for k in [
        scale("absent", 2.0),
        changed,
        scale("corrupt", 2.0),
        scale("old", 2.0),
    ] {
        assert!(chosen(&store, &k, SmTarget::Sm80).is_none(), "{}", k.name);
    }
    assert!(chosen(&store, &kernel, SmTarget::Sm90).is_none());
    assert!(chosen(&store, &kernel, SmTarget::Sm80).is_some());
}
