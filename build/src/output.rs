//! Writing the build's files into `OUT_DIR`, each only when its content changed: artifacts
//! (`qforge/<stem>.<ext>`, `.json`, `.qir`), the build manifest (`qforge/manifest.json`), the
//! static library of the CPU objects and the generated Rust (`qforge_kernels.rs`). The
//! `qforge/` folder belongs to qforge-build: files of earlier builds that this build did not
//! produce (a changed kernel's old artifacts) are removed.

use std::path::Path;

use qforge_codegen::compile::{extension_of_kind, Code, MANIFEST_VERSION};

use crate::{generate, BuildError, Report};

/// The file stem of an artifact: kernel name, content hash and target settings, unique per
/// artifact.
pub(crate) fn stem(a: &qforge_codegen::Artifact) -> String {
    let m = &a.manifest;
    let settings: Vec<String> = m
        .settings
        .iter()
        .filter(|(k, _)| *k != "triple" && *k != "bounds_checks" && *k != "simd")
        .map(|(_, v)| v.replace(['=', '/', ' '], "_"))
        .collect();
    format!(
        "{}-{}-{}-{}",
        m.kernel,
        m.content_hash,
        m.target,
        settings.join("-")
    )
}

/// Writes `bytes` to `path` through a temporary file and a rename, unless the file already
/// holds exactly them; returns whether it wrote.
pub(crate) fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<bool, BuildError> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    let tmp = path.with_extension("qforge-tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| BuildError(format!("writing {}: {e}", path.display())))?;
    Ok(true)
}

/// The static library's name for this package (`qforge_aot_<package>`), so two crates of one
/// program never link the same library name.
fn library_name() -> String {
    let package = std::env::var("CARGO_PKG_NAME").unwrap_or_else(|_| "kernels".into());
    format!("qforge_aot_{}", package.replace('-', "_"))
}

/// Writes every file of `report`'s artifacts and, for cargo, prints the link lines.
pub(crate) fn write_all(
    out_dir: &Path,
    runtime_path: &str,
    report: &mut Report,
    cargo: bool,
) -> Result<(), BuildError> {
    let dir = out_dir.join("qforge");
    std::fs::create_dir_all(&dir)
        .map_err(|e| BuildError(format!("creating {}: {e}", dir.display())))?;
    let mut objects: Vec<(String, Vec<u8>)> = Vec::new();
    let mut manifests: Vec<String> = Vec::new();
    let mut current: Vec<String> = vec!["manifest.json".into()];
    for a in &report.artifacts {
        let stem = stem(a);
        let code_file = format!("{stem}.{}", extension_of_kind(&a.manifest.target));
        let files = [
            (code_file.clone(), a.code.bytes()),
            (format!("{stem}.json"), a.manifest.to_json().into_bytes()),
            (format!("{stem}.qir"), a.qir.clone().into_bytes()),
        ];
        for (name, bytes) in files {
            if write_if_changed(&dir.join(&name), &bytes)? {
                report.written.push(format!("qforge/{name}"));
            }
            current.push(name);
        }
        if let Code::Object(bytes) = &a.code {
            objects.push((code_file, bytes.clone()));
        }
        manifests.push(a.manifest.to_json());
    }
    let manifest = format!(
        "{{\n\"manifest_version\": {MANIFEST_VERSION},\n\"artifacts\": [\n{}\n]\n}}\n",
        manifests.join(",\n")
    );
    if write_if_changed(&dir.join("manifest.json"), manifest.as_bytes())? {
        report.written.push("qforge/manifest.json".into());
    }
    remove_obsolete(&dir, &current)?;
    let lib = library_name();
    if !objects.is_empty() {
        let archive = archive(&objects)?;
        let file = format!("lib{lib}.a");
        if write_if_changed(&out_dir.join(&file), &archive)? {
            report.written.push(file);
        }
        if cargo {
            println!("cargo:rustc-link-search=native={}", out_dir.display());
            println!("cargo:rustc-link-lib=static={lib}");
        }
    }
    let rust = generate::rust(&report.artifacts, runtime_path, |a| {
        format!("qforge/{}", stem(a))
    });
    if write_if_changed(&out_dir.join("qforge_kernels.rs"), rust.as_bytes())? {
        report.written.push("qforge_kernels.rs".into());
    }
    Ok(())
}

/// Removes every file of `dir` not named in `current` (artifacts of kernels that changed or
/// were dropped since the last build).
fn remove_obsolete(dir: &Path, current: &[String]) -> Result<(), BuildError> {
    let failed = |e: std::io::Error| BuildError(format!("cleaning {}: {e}", dir.display()));
    for entry in std::fs::read_dir(dir).map_err(failed)? {
        let path = entry.map_err(failed)?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_file() && !current.iter().any(|c| c == name) {
            std::fs::remove_file(&path).map_err(failed)?;
        }
    }
    Ok(())
}

/// A deterministic GNU `ar` archive of `objects` with its symbol index (zero timestamps and
/// ids), as linkers need for `-l static=`.
fn archive(objects: &[(String, Vec<u8>)]) -> Result<Vec<u8>, BuildError> {
    use ar_archive_writer::{write_archive_to_stream, ArchiveKind, NewArchiveMember};
    static READER: ar_archive_writer::ObjectReader = ar_archive_writer::DEFAULT_OBJECT_READER;
    let members: Vec<NewArchiveMember<'_>> = objects
        .iter()
        .map(|(name, bytes)| NewArchiveMember::new(bytes.as_slice(), &READER, name.clone()))
        .collect();
    let kind = if cfg!(target_os = "macos") {
        ArchiveKind::Darwin64
    } else {
        ArchiveKind::Gnu
    };
    let mut out = std::io::Cursor::new(Vec::new());
    write_archive_to_stream(&mut out, &members, kind, false, None)
        .map_err(|e| BuildError(format!("writing the static library: {e}")))?;
    Ok(out.into_inner())
}
