//! `qforge compile`, `qforge list-kernels` and `--device auto`, through the built binary: every
//! target kind writes its code, a manifest that describes the kernel (name, content hash,
//! parameters) and a `.qir` that parses back to the same kernel, byte-identically on a second
//! run; bad input (a syntax or verification error in a `.qir` file, an unknown kernel, target or
//! level) is a one-line error naming what was wrong.

use std::path::Path;

use qforge::codegen::compile::Manifest;
use qforge::ir::{Kernel, ParamKind};

/// The library kernel these tests compile.
const KERNEL: &str = "dequantize_4bit_nf4_bs64_f32";

/// Every `--target` kind and whether its code is binary.
const TARGETS: [(&str, bool); 8] = [
    ("cpu-obj", true),
    ("clif", false),
    ("llvm-ir", false),
    ("ptx", false),
    ("wgsl", false),
    ("spirv", true),
    ("stablehlo", false),
    ("mosaic", false),
];

fn qforge(args: &[&str]) -> (i32, String, String) {
    qforge_testkit::run(env!("CARGO_BIN_EXE_qforge"), args)
}

fn library_kernel(name: &str) -> Kernel {
    qforge::kernels::KernelSpec::from_name(name)
        .expect("a library kernel")
        .build()
        .expect("it builds")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn with_ext(path: &Path, ext: &str) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    s.into()
}

/// Runs a command that must fail with a one-line error containing every one of `needles`.
fn fails(args: &[&str], needles: &[&str]) -> String {
    let (code, stdout, err) = qforge(args);
    assert_ne!(code, 0, "{args:?} should fail: {stdout}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: want '{n}' in: {err}");
    }
    err
}

/// Compiles [`KERNEL`] for `target` into `dir` and returns the code, manifest and `.qir` paths.
fn compile_into(dir: &Path, target: &str) -> [std::path::PathBuf; 3] {
    let out = dir.join(format!("{KERNEL}.{target}"));
    let o = out.to_str().expect("utf-8 path");
    let (code, stdout, stderr) =
        qforge(&["compile", "--kernel", KERNEL, "--target", target, "-o", o]);
    assert_eq!(code, 0, "{target}: {stderr}");
    assert!(stdout.contains(KERNEL) && stdout.contains(o), "{stdout}");
    [out.clone(), with_ext(&out, "json"), with_ext(&out, "qir")]
}

#[test]
fn every_target_writes_code_a_manifest_of_the_kernel_and_its_qir_deterministically() {
    let kernel = library_kernel(KERNEL);
    let first = tempfile::tempdir().expect("temp dir");
    let second = tempfile::tempdir().expect("temp dir");
    for (target, binary) in TARGETS {
        let [code, manifest, qir] = compile_into(first.path(), target);
        let code_bytes = read(&code);
        assert!(!code_bytes.is_empty(), "{target}");
        let text = String::from_utf8(read(&manifest)).expect("the manifest is UTF-8");
        let m = Manifest::from_json(&text).unwrap_or_else(|e| panic!("{target}: {e}\n{text}"));
        assert_eq!(m.kernel, KERNEL, "{target}");
        assert_eq!(m.target, target);
        assert_eq!(
            m.content_hash,
            format!("{:016x}", kernel.content_hash()),
            "{target}"
        );
        m.check_code(&code_bytes)
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        let params: Vec<(String, String, String)> = kernel
            .params
            .iter()
            .map(|(_, p)| match &p.kind {
                ParamKind::Buffer { dtype, .. } => {
                    (p.name.clone(), "buffer".into(), dtype.to_string())
                }
                ParamKind::Scalar(ty) => (p.name.clone(), "scalar".into(), ty.to_string()),
            })
            .collect();
        let recorded: Vec<(String, String, String)> = m
            .params
            .iter()
            .map(|p| (p.name.clone(), p.kind.clone(), p.dtype.clone()))
            .collect();
        assert_eq!(recorded, params, "{target}");
        // The raw JSON carries the same fields under the documented names.
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["kernel"], KERNEL);
        assert_eq!(v["params"].as_array().map(Vec::len), Some(params.len()));
        let qir_text = String::from_utf8(read(&qir)).expect("the .qir is UTF-8");
        let parsed = qforge::ir::text::parse(&qir_text).unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!(
            parsed, kernel,
            "{target}: the .qir parses back to another kernel"
        );
        if matches!(target, "cpu-obj" | "clif") {
            // Without --feature-level: this machine's best level.
            let host = qforge::cli::compile::host_level().expect("an x86-64 or aarch64 host");
            assert_eq!(m.settings["level"], host.name(), "{target}");
        }
        if target == "cpu-obj" && cfg!(target_os = "linux") {
            assert_eq!(&code_bytes[..4], b"\x7fELF", "not an ELF object");
        }
        if binary {
            // Binary code is refused on stdout.
            fails(
                &["compile", "--kernel", KERNEL, "--target", target],
                &[target, "-o"],
            );
        } else {
            // Text code goes to stdout without -o, the same bytes as the file.
            let (rc, stdout, stderr) = qforge(&["compile", "--kernel", KERNEL, "--target", target]);
            assert_eq!(rc, 0, "{stderr}");
            assert_eq!(
                stdout.as_bytes(),
                &code_bytes[..],
                "{target}: stdout differs from the file"
            );
        }
        // A second run writes byte-identical files.
        let again = compile_into(second.path(), target);
        for (a, b) in [code, manifest, qir].iter().zip(&again) {
            assert!(
                read(a) == read(b),
                "{target}: {} and {} differ",
                a.display(),
                b.display()
            );
        }
    }
}

#[test]
fn target_options_reach_the_manifest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("k");
    let o = out.to_str().expect("utf-8 path");
    let manifest = || {
        let text = String::from_utf8(read(&with_ext(&out, "json"))).expect("UTF-8");
        Manifest::from_json(&text).expect("a manifest")
    };
    let run = |extra: &[&str]| {
        let mut args = vec!["compile", "--kernel", KERNEL, "-o", o];
        args.extend_from_slice(extra);
        let (rc, _, stderr) = qforge(&args);
        assert_eq!(rc, 0, "{args:?}: {stderr}");
    };
    run(&[
        "--target",
        "cpu-obj",
        "--feature-level",
        "x86-64",
        "--no-bounds-checks",
    ]);
    let m = manifest();
    assert_eq!(m.settings["level"], "x86-64");
    assert_eq!(m.settings["bounds_checks"], "false");
    run(&["--target", "ptx", "--sm", "90"]);
    assert_eq!(manifest().settings["sm"], "sm_90");
    run(&["--target", "wgsl", "--soft-math"]);
    assert_eq!(manifest().settings["soft_fma"], "true");
    run(&["--target", "stablehlo", "--dim", "7"]);
    assert_eq!(manifest().settings["dim"], "7");
    // A Mosaic module's manifest says how its arrays hold the buffers: 7 packed bytes of 32
    // per work item, 14 outputs interleaved two per byte.
    run(&["--target", "mosaic", "--dim", "7"]);
    let m = manifest();
    assert_eq!(m.settings["dim"], "7");
    let qforge::codegen::compile::Launch::Mosaic(layout) = &m.launch else {
        panic!("not a Mosaic launch: {:?}", m.launch);
    };
    let arrays: Vec<(&str, Vec<u32>, usize)> = layout
        .inputs
        .iter()
        .chain(&layout.outputs)
        .map(|a| (a.param.as_str(), a.shape.clone(), a.elements))
        .collect();
    assert_eq!(
        arrays,
        [
            ("packed", vec![32, 32], 7),
            ("absmax", vec![32, 1], 7),
            ("out", vec![32, 64], 7)
        ]
    );
}

/// An array of a Mosaic manifest: its parameter, shape and buffer shape.
type Array<'a> = (&'a str, [u32; 2], Option<[u32; 2]>);

/// A matmul's Mosaic module is specialized to its launch: `--scalar` gives its dimensions
/// and work items, which reach the manifest (the grid of output tiles and reduction steps,
/// each array's buffer shape); a launch whose work items do not cover the output, an unknown
/// name and a malformed value are errors naming them.
#[test]
fn a_matmul_compiles_for_mosaic_at_the_launch_its_scalars_give() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("mm.mlir");
    let o = out.to_str().expect("utf-8 path");
    let kernel = "matmul_4bit_nf4_bs64_bf16_bias_t4x1";
    // M = 40, N = 300, K = 512: tiles of 16 x 128 outputs (bf16), 256 elements.
    let scalars = |n_items: &'static str| {
        [
            "m=40",
            "n=300",
            "k=512",
            n_items,
            "n_tiles=300",
            "n_packed=76800",
            "n_blocks=2400",
        ]
        .iter()
        .flat_map(|s| ["--scalar", *s])
        .collect::<Vec<_>>()
    };
    let mut args = vec!["compile", "--kernel", kernel, "--target", "mosaic", "-o", o];
    args.extend(scalars("n_items=3000"));
    let (rc, _, stderr) = qforge(&args);
    assert_eq!(rc, 0, "{args:?}: {stderr}");
    let text = String::from_utf8(read(&with_ext(&out, "json"))).expect("UTF-8");
    let m = Manifest::from_json(&text).expect("a manifest");
    assert_eq!(
        m.settings["scalars"],
        "m=40,n=300,k=512,n_items=3000,n_tiles=300,n_packed=76800,n_blocks=2400"
    );
    let qforge::codegen::compile::Launch::Mosaic(layout) = &m.launch else {
        panic!("not a Mosaic launch: {:?}", m.launch);
    };
    assert_eq!(layout.grid, [3, 3, 2]);
    let arrays: Vec<Array> = layout
        .inputs
        .iter()
        .chain(&layout.outputs)
        .map(|a| {
            let two = |d: &[u32]| <[u32; 2]>::try_from(d).expect("a 2-D array");
            (
                a.param.as_str(),
                two(&a.shape),
                a.buffer_shape.as_deref().map(two),
            )
        })
        .collect();
    assert_eq!(
        arrays,
        [
            ("x", [48, 512], Some([40, 512])),
            ("packed", [384, 256], Some([300, 256])),
            ("absmax", [384, 8], Some([300, 8])),
            ("bias", [1, 384], Some([1, 300])),
            ("y", [48, 384], Some([40, 300])),
        ]
    );
    let mut args = vec!["compile", "--kernel", kernel, "--target", "mosaic", "-o", o];
    args.extend(scalars("n_items=2999"));
    fails(
        &args,
        &[
            kernel,
            "2999 work items of 4 accumulators, fewer than its 40 x 300 outputs",
        ],
    );
    let mut args = vec!["compile", "--kernel", kernel, "--target", "mosaic", "-o", o];
    args.extend(scalars("n_items=3000"));
    *args.iter_mut().find(|a| **a == "n_tiles=300").unwrap() = "n_tiles=299";
    fails(&args, &[kernel, "stores no y[299]"]);
    fails(
        &[
            "compile", "--kernel", kernel, "--target", "mosaic", "--scalar", "q=1", "-o", o,
        ],
        &[
            "--scalar q",
            "has no integer parameter q (it has m, n, k, n_items",
        ],
    );
    // Without --dim every integer parameter is named, each once.
    fails(
        &[
            "compile", "--kernel", kernel, "--target", "mosaic", "--scalar", "m=40", "-o", o,
        ],
        &[
            "--scalar gives no n, k, n_items, n_tiles, n_packed, n_blocks",
            "--dim",
        ],
    );
    fails(
        &[
            "compile", "--kernel", kernel, "--target", "mosaic", "--scalar", "m=40", "--scalar",
            "m=41", "-o", o,
        ],
        &["--scalar m given twice"],
    );
    fails(
        &[
            "compile", "--kernel", kernel, "--target", "mosaic", "--scalar", "m=-1", "-o", o,
        ],
        &["--scalar m=-1", "NAME=VALUE"],
    );
    fails(
        &[
            "compile", "--kernel", kernel, "--target", "ptx", "--scalar", "m=1", "-o", o,
        ],
        &["--scalar", "mosaic"],
    );
}

#[test]
fn a_kernel_the_mosaic_backend_does_not_lower_is_a_named_error() {
    fails(
        &[
            "compile",
            "--kernel",
            "grad_sqnorm_f32",
            "--target",
            "mosaic",
        ],
        &["grad_sqnorm_f32", "mosaic", "`accumulate`"],
    );
    fails(
        &[
            "compile", "--kernel", KERNEL, "--target", "ptx", "--dim", "3",
        ],
        &["--dim", "stablehlo or mosaic"],
    );
}

#[test]
fn a_qir_file_is_compiled_and_its_errors_name_the_file_and_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let kernel = library_kernel(KERNEL);
    let text = qforge::ir::text::print(&kernel);
    let good = dir.path().join("k.qir");
    std::fs::write(&good, &text).expect("write");
    let out = dir.path().join("k.wgsl");
    let (rc, _, stderr) = qforge(&[
        "compile",
        good.to_str().unwrap(),
        "--target",
        "wgsl",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(rc, 0, "{stderr}");
    let m = Manifest::from_json(&String::from_utf8(read(&with_ext(&out, "json"))).unwrap())
        .expect("a manifest");
    assert_eq!(m.content_hash, format!("{:016x}", kernel.content_hash()));

    // A syntax error: an unknown op on a known line.
    let (line, _) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains("= mul "))
        .expect("the kernel multiplies");
    let broken = text.replacen("= mul ", "= mulx ", 1);
    let bad = dir.path().join("bad.qir");
    std::fs::write(&bad, broken).expect("write");
    let at = format!("{}:{}:", bad.display(), line + 1);
    fails(
        &["compile", bad.to_str().unwrap(), "--target", "ptx"],
        &[&at, "mulx"],
    );

    // A verification error: a value recorded with the wrong type.
    let (line, l) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains(": f32 = mul "))
        .expect("an f32 product");
    let wrong = text.replacen(l, &l.replace(": f32 = mul ", ": u32 = mul "), 1);
    let unverified = dir.path().join("unverified.qir");
    std::fs::write(&unverified, wrong).expect("write");
    let at = format!("{}:{}:", unverified.display(), line + 1);
    let kernel_named = format!("kernel '{KERNEL}'");
    fails(
        &["compile", unverified.to_str().unwrap(), "--target", "ptx"],
        &[&at, &kernel_named, "failed verification"],
    );

    // A verification error at a statement (no value named): a store into a read-only buffer,
    // located by the statement's own line.
    let read_only = kernel
        .params
        .iter()
        .find(|(_, p)| {
            matches!(
                p.kind,
                ParamKind::Buffer {
                    access: qforge::ir::Access::Read,
                    ..
                }
            )
        })
        .expect("a read-only buffer")
        .1
        .name
        .clone();
    let (line, l) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.trim_start().starts_with("store "))
        .expect("a store");
    let target = l.trim_start()["store ".len()..]
        .split('[')
        .next()
        .expect("the stored buffer")
        .to_string();
    let stored = l.replacen(
        &format!("store {target}["),
        &format!("store {read_only}["),
        1,
    );
    let into_read = dir.path().join("into_read.qir");
    std::fs::write(&into_read, text.replacen(l, &stored, 1)).expect("write");
    let at = format!("{}:{}:", into_read.display(), line + 1);
    let why = format!("store to read-only buffer '{read_only}'");
    fails(
        &["compile", into_read.to_str().unwrap(), "--target", "ptx"],
        &[&at, &why],
    );

    // A missing file is named.
    let missing = dir.path().join("missing.qir");
    fails(
        &["compile", missing.to_str().unwrap(), "--target", "ptx"],
        &[missing.to_str().unwrap()],
    );
}

#[test]
fn unknown_kernels_targets_and_levels_are_named_errors() {
    let err = fails(
        &[
            "compile",
            "--kernel",
            "quantize_4bit_nf4_bs65_f32",
            "--target",
            "ptx",
        ],
        &["'quantize_4bit_nf4_bs65_f32'", "qforge list-kernels"],
    );
    assert!(
        err.contains("quantize_4bit_nf4_bs64_f32"),
        "no close match: {err}"
    );
    fails(
        &[
            "compile",
            "--kernel",
            KERNEL,
            "--target",
            "stablehlo",
            "--dim",
            "0",
        ],
        &["--dim 0"],
    );
    fails(
        &["compile", "--kernel", KERNEL, "--target", "gpu"],
        &["'gpu'", "cpu-obj", "stablehlo"],
    );
    fails(
        &[
            "compile",
            "--kernel",
            KERNEL,
            "--target",
            "clif",
            "--feature-level",
            "x86-64-v9",
        ],
        &["'x86-64-v9'", "x86-64-v3", "aarch64"],
    );
    fails(
        &[
            "compile", "--kernel", KERNEL, "--target", "ptx", "--sm", "75",
        ],
        &["'75'", "80", "90"],
    );
    fails(
        &[
            "compile", "--kernel", KERNEL, "--target", "wgsl", "--sm", "90",
        ],
        &["--sm", "ptx"],
    );
}

#[test]
fn list_kernels_prints_the_library_names() {
    let (rc, stdout, stderr) = qforge(&["list-kernels"]);
    assert_eq!(rc, 0, "{stderr}");
    let names: Vec<&str> = stdout.lines().collect();
    assert!(names.len() >= 450, "{} names", names.len());
    assert!(names.contains(&KERNEL), "{KERNEL} missing");
    let catalog: Vec<String> = qforge::kernels::catalog()
        .iter()
        .map(|s| s.name())
        .collect();
    assert_eq!(names, catalog, "not the catalog's names in its order");

    let (rc, stdout, stderr) = qforge(&["list-kernels", "--json", "--filter", "nf4_bs64_f32"]);
    assert_eq!(rc, 0, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON array");
    let items = v.as_array().expect("an array");
    assert!(
        items
            .iter()
            .any(|i| i["name"] == KERNEL && i["family"] == "quant4"),
        "{stdout}"
    );
    assert!(items.iter().all(|i| i["name"]
        .as_str()
        .is_some_and(|n| n.contains("nf4_bs64_f32"))));
    fails(
        &["list-kernels", "--filter", "no_such_kernel"],
        &["no_such_kernel"],
    );
}

#[test]
fn device_auto_is_the_fastest_cpu_device_and_says_so_on_stderr() {
    let want = if cfg!(feature = "llvm") {
        "cpu-llvm"
    } else {
        "cpu"
    };
    assert_eq!(qforge::devices::AUTO_ORDER[0], want);
    let (rc, stdout, stderr) = qforge(&["check", "--device", "auto", "--json", "--filter", KERNEL]);
    assert_eq!(rc, 0, "{stderr}");
    assert_eq!(stderr.trim_end(), format!("device: {want} (auto)"));
    let backend = if cfg!(feature = "llvm") {
        "llvm"
    } else {
        "cranelift"
    };
    assert!(
        stdout
            .lines()
            .any(|l| l.contains(&format!("\"backend\":\"{backend}\"")) && l.contains("\"exact\"")),
        "{stdout}"
    );
    // quantize and dequantize report it as the first line of stdout (their stderr holds only an
    // error), and only the error when the input is bad.
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.safetensors");
    let out = dir.path().join("out.safetensors");
    fails(
        &[
            "quantize",
            missing.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
        &["missing.safetensors"],
    );
    let input = dir.path().join("in.safetensors");
    let w: Vec<u8> = (0..8 * 64)
        .flat_map(|i| (((i * 37 % 101) as f32 - 50.0) / 25.0).to_le_bytes())
        .collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![8, 64], &w)
        .expect("a tensor");
    safetensors::serialize_to_file(
        [("model.layers.0.mlp.down_proj.weight", view)],
        &None,
        &input,
    )
    .expect("write the input");
    let (rc, stdout, stderr) = qforge(&[
        "quantize",
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(rc, 0, "{stderr}");
    assert_eq!(
        stdout.lines().next(),
        Some(&*format!("device: {want} (auto)")),
        "{stdout}"
    );
}
