//! [`WgpuDevice::with_artifacts`]: embedded WGSL runs bit for bit like the JIT path, the device
//! really runs the embedded text, and a missing, stale, wrong-settings or corrupted artifact
//! gives the policy's named error or fallback. Skips with a printed reason when no wgpu
//! adapter is found.

use qforge_codegen::compile::{compile, Artifact, Options, Target};
use qforge_ir::{Access, DType, Dim, Kernel, KernelBuilder, OwnedArg, Scalar, ScalarType};

use super::*;
use crate::aot::text_tests::{embed, embed_code, leak, relabel};
use crate::InterpreterDevice;

fn device() -> Option<WgpuDevice> {
    match WgpuDevice::new() {
        Ok(d) => Some(d),
        Err(e) => {
            qforge_testkit::unavailable("wgpu", e);
            None
        }
    }
}

/// `x[i] = sqrt(|x[i]|) + x[i] / divisor` over `n` work items, named `name` (division and
/// square root: the soft-math settings change its WGSL).
fn mix(name: &str, divisor: f32) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::ReadWrite);
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let v = b.load(x, i);
    let a = b.abs(v);
    let r = b.sqrt(a);
    let d = b.const_f32(divisor);
    let q = b.div(v, d);
    let y = b.add(r, q);
    b.store(x, i, y);
    b.finish()
}

/// Edge values, then ordinary and pseudo-random ones: 67 in all.
fn inputs() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        3.0,
        0.1,
        f32::MIN_POSITIVE,
        f32::MIN_POSITIVE / 3.0,
        -f32::from_bits(1),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        -3.0e38,
        16_777_217.0,
    ];
    let mut state = 12345u32;
    while v.len() < 67 {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        v.push(if state.is_multiple_of(3) {
            f32::from_bits(state.rotate_left(7))
        } else {
            ((state >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 8.0
        });
    }
    v
}

/// The bits `kernel` leaves in `x` on `dev`.
fn run(dev: &dyn Device, kernel: &Kernel) -> Result<Vec<u32>> {
    let x = inputs();
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(x.len() as u32)),
        OwnedArg::Write(x.iter().flat_map(|v| v.to_le_bytes()).collect()),
    ];
    dev.launch(kernel, &mut OwnedArg::borrow_all(&mut args))?;
    let OwnedArg::Write(bytes) = &args[1] else {
        unreachable!("the buffer argument")
    };
    Ok(bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// `got` equals the interpreter's result for `kernel`, bit for bit (any two NaNs equal).
fn assert_interpreter_bits(kernel: &Kernel, got: &[u32]) {
    let want = run(&InterpreterDevice, kernel).expect("interpreter runs");
    let is_nan = |b: u32| f32::from_bits(b).is_nan();
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert!(
            w == g || (is_nan(*w) && is_nan(*g)),
            "'{}' element {i}: interpreter {w:08x}, wgpu {g:08x}",
            kernel.name
        );
    }
    assert_eq!(want.len(), got.len());
}

fn wgsl(kernel: &Kernel, soft_math: WgslOptions) -> Artifact {
    compile(kernel, &Target::Wgsl(soft_math), &Options::default()).expect("compiles")
}

#[test]
fn embedded_wgsl_runs_bit_identically_to_the_jit_and_is_the_code_run() {
    let Some(jit) = device() else { return };
    let Some(aot) = device() else { return };
    let soft = jit.soft_math();
    let kernel = mix("mix", 3.0);
    // `swapped` embeds the WGSL of the same-signature kernel dividing by 7 under its own name
    // and hash (its manifest's code hash recomputed): a device that runs the embedded text
    // divides by 7, one that compiled the kernel would divide by 3.
    let swapped = mix("swapped", 3.0);
    let impostor = mix("swapped", 7.0);
    let text = leak(vec![
        embed(&wgsl(&kernel, soft)),
        embed(&relabel(wgsl(&impostor, soft), &swapped)),
    ]);
    let aot = aot.with_artifacts(text, Policy::RequireAot);

    let from_artifact = run(&aot, &kernel).expect("the artifact runs");
    assert_eq!(from_artifact, run(&jit, &kernel).expect("the JIT runs"));
    assert_interpreter_bits(&kernel, &from_artifact);

    let ran = run(&aot, &swapped).expect("the impostor runs");
    assert_eq!(ran, run(&jit, &impostor).expect("the JIT runs"));
    assert_ne!(ran, run(&jit, &swapped).expect("the JIT runs"));
}

#[test]
fn require_names_what_is_wrong_and_prefer_falls_back_to_the_compiler() {
    let Some(require) = device() else { return };
    let Some(prefer) = device() else { return };
    let soft = require.soft_math();
    let mut other_soft = soft;
    other_soft.soft_div = !other_soft.soft_div;
    let good = mix("good", 3.0);
    let stale = mix("stale", 3.0);
    let settings = mix("settings", 3.0);
    let corrupt = mix("corrupt", 3.0);
    let absent = mix("absent", 3.0);
    let mut broken = wgsl(&corrupt, soft).code.bytes();
    // One character of the code changed after the build (the record keeps the old hash).
    let at = broken.len() / 2;
    broken[at] ^= 1;
    let mut corrupted = embed(&wgsl(&corrupt, soft));
    corrupted.code = Box::leak(broken.into_boxed_slice());
    let text = leak(vec![
        embed(&wgsl(&good, soft)),
        // Built from other kernel text under the same name.
        embed(&wgsl(&mix("stale", 5.0), soft)),
        embed(&wgsl(&settings, other_soft)),
        corrupted,
        // The WGSL of `x / 7` as `swapped`'s: shows which code PreferAot runs.
        embed(&relabel(
            wgsl(&mix("swapped", 7.0), soft),
            &mix("swapped", 3.0),
        )),
        // An artifact of another target is no WGSL artifact.
        embed_code(
            &compile(
                &absent,
                &Target::Ptx(Default::default()),
                &Options::default(),
            )
            .expect("compiles"),
            None,
        ),
    ]);
    let require = require.with_artifacts(text, Policy::RequireAot);
    let prefer = prefer.with_artifacts(text, Policy::PreferAot);

    assert_interpreter_bits(&good, &run(&require, &good).expect("runs"));
    let refusal = |k: &Kernel| {
        let e = run(&require, k).expect_err("refused").to_string();
        let compile_e = require.compile(k).expect_err("refused").to_string();
        assert_eq!(e, compile_e);
        assert!(e.contains(&format!("'{}'", k.name)), "{e}");
        assert!(e.contains("RequireAot"), "{e}");
        e
    };
    let e = refusal(&stale);
    assert!(
        e.contains("is stale")
            && e.contains(&format!("{:016x}", mix("stale", 5.0).content_hash()))
            && e.contains(&format!("{:016x}", stale.content_hash())),
        "{e}"
    );
    let e = refusal(&settings);
    let (built, wanted) = (other_soft.soft_div, soft.soft_div);
    assert!(
        e.contains(&format!(
            "built with soft_div={built}, not soft_div={wanted}"
        )),
        "{e}"
    );
    let e = refusal(&corrupt);
    assert!(e.contains("corrupted: code hash"), "{e}");
    let e = refusal(&absent);
    assert!(
        e.contains("no embedded wgsl artifact") && e.contains("artifacts for ptx only"),
        "{e}"
    );

    for k in [&good, &stale, &settings, &corrupt, &absent] {
        let got = run(&prefer, k).unwrap_or_else(|e| panic!("'{}' runs: {e}", k.name));
        assert_interpreter_bits(k, &got);
    }
    let swapped = run(&prefer, &mix("swapped", 3.0)).expect("runs");
    assert_interpreter_bits(&mix("swapped", 7.0), &swapped);
    // JitOnly ignores the artifacts: the corrupted one does not matter, and `swapped` is
    // compiled from its kernel.
    let Some(jit_only) = device() else { return };
    let jit_only = jit_only.with_artifacts(text, Policy::JitOnly);
    assert_interpreter_bits(&corrupt, &run(&jit_only, &corrupt).expect("runs"));
    let swapped = mix("swapped", 3.0);
    assert_interpreter_bits(&swapped, &run(&jit_only, &swapped).expect("runs"));
}
