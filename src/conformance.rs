//! The conformance check of one kernel: its launch on each device against the reference
//! interpreter, bit for bit (any two NaNs equal), on fixed inputs that cover every pair of a
//! length class and an input kind. `tests/conformance.rs` runs it over the library's catalog
//! (plus random cases); a user's kernel joins by implementing
//! [`CatalogEntry`](qforge_kernels::CatalogEntry) and calling [`check_entry`] (see
//! `examples/custom-op`).

use qforge_ir::{count_mismatches, Kernel, OwnedArg};
use qforge_kernels::{maps, CatalogEntry, QuantType};
use qforge_runtime::{Device, InterpreterDevice};

/// Edge values mixed into the "edge values" inputs: signed zeros, subnormals, ±inf, NaN, huge
/// values, ±1 and ±0.5, a value near an NF4 code, and the points where `exp`, `erf`, `tanh` and
/// `sigmoid` change regime (`exp` overflows `f32` above 88.72284 and leaves the normal
/// (subnormal) range below -87.33655 (-103.97208)).
pub const EDGE_VALUES: [f32; 23] = [
    0.0,
    -0.0,
    f32::MIN_POSITIVE / 3.0,
    -f32::MIN_POSITIVE / 5.0,
    f32::from_bits(1),
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    3.0e38,
    -3.0e38,
    1.0,
    -1.0,
    0.5,
    0.8614784,
    -0.33791524,
    0.0052083335,
    1e-30,
    88.0,
    -88.0,
    88.72284,
    -87.33655,
    -103.97208,
    89.0,
];

/// Values whose scaled form lands exactly on a 4-bit decision midpoint (or a code value) when
/// the block's absmax is 1.0, which `±1.0` among them makes likely: the tie-breaking rules. The
/// NF4 and FP4 midpoints, their `f32` neighbours, the NF4 codes, `±1` and `±0`.
pub fn tie_values() -> Vec<f32> {
    let mut ties: Vec<f32> = vec![1.0, -1.0, 0.0, -0.0];
    for m in maps::nf4_midpoints()
        .into_iter()
        .chain(maps::fp4_midpoints())
    {
        ties.extend([
            m,
            -m,
            f32::from_bits(m.to_bits() + 1),
            f32::from_bits(m.to_bits() - 1),
        ]);
    }
    ties.extend(QuantType::Nf4.code());
    ties
}

/// The kinds of fixed inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// Normal data in `[-3, 3)` (6 in 8), an edge value of [`EDGE_VALUES`] (1 in 8) or any bit
    /// pattern (1 in 8).
    EdgeValues,
    /// Only [`tie_values`].
    Ties,
}

impl InputKind {
    /// Both kinds.
    pub const ALL: [InputKind; 2] = [InputKind::EdgeValues, InputKind::Ties];

    /// `edge values` or `4-bit ties`.
    pub const fn label(self) -> &'static str {
        match self {
            InputKind::EdgeValues => "edge values",
            InputKind::Ties => "4-bit ties",
        }
    }
}

/// The length classes of a kernel with `blocksize` elements per work item, with their labels:
/// 1, 3, one block minus and plus one, and several blocks (`2 * blocksize + 3`).
pub fn lengths(blocksize: usize) -> [(&'static str, usize); 5] {
    [
        ("1", 1),
        ("3", 3),
        ("block-1", blocksize.saturating_sub(1).max(1)),
        ("block+1", blocksize + 1),
        ("several blocks", 2 * blocksize + 3),
    ]
}

/// `n` values of `kind`, drawn deterministically from `seed` (splitmix64).
pub fn values(kind: InputKind, n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let ties = tie_values();
    (0..n)
        .map(|_| {
            let r = next();
            match kind {
                InputKind::Ties => ties[(r % ties.len() as u64) as usize],
                InputKind::EdgeValues => match r % 8 {
                    0 => EDGE_VALUES[((r >> 8) % EDGE_VALUES.len() as u64) as usize],
                    1 => f32::from_bits((r >> 16) as u32),
                    _ => ((r >> 40) as f64 / (1u64 << 24) as f64 * 6.0 - 3.0) as f32,
                },
            }
        })
        .collect()
}

/// The fixed inputs of a kernel called `name` with `blocksize` elements per work item: one per
/// (length class, input kind) pair, labelled, seeded by the name, length and kind.
pub fn fixed_cases(name: &str, blocksize: usize) -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    for (class, n) in lengths(blocksize) {
        for kind in InputKind::ALL {
            let label = format!("{name} n = {n} ({class}), {}", kind.label());
            // FNV-1a of the label.
            let seed = label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            });
            out.push((label, values(kind, n, seed)));
        }
    }
    out
}

/// Runs `kernel` (built from `entry`) on `values` on the interpreter and on every device;
/// `time(i, seconds)` is told how long each launch took (0: the interpreter, then the devices).
///
/// # Errors
/// The first device whose result differs from the interpreter's (kernel, device, count of
/// differing elements, length), or a launch error.
pub fn check_values(
    entry: &dyn CatalogEntry,
    kernel: &Kernel,
    devices: &[(&str, &dyn Device)],
    values: &[f32],
    time: &mut dyn FnMut(usize, f64),
) -> Result<(), String> {
    let mut reference = entry
        .example_args(values)
        .map_err(|e| format!("{}: example arguments: {e}", kernel.name))?;
    let fresh = reference.clone();
    let t = std::time::Instant::now();
    InterpreterDevice
        .launch(kernel, &mut OwnedArg::borrow_all(&mut reference))
        .map_err(|e| format!("{}: the interpreter failed: {e}", kernel.name))?;
    time(0, t.elapsed().as_secs_f64());
    for (i, (label, device)) in devices.iter().enumerate() {
        let mut args = fresh.clone();
        let t = std::time::Instant::now();
        device
            .launch(kernel, &mut OwnedArg::borrow_all(&mut args))
            .map_err(|e| format!("{} on {label}: {e}", kernel.name))?;
        time(i + 1, t.elapsed().as_secs_f64());
        let (bad, total) = count_mismatches(kernel, &reference, &args);
        if bad != 0 {
            return Err(format!(
                "{} on {label}: {bad} of {total} elements differ (n = {})",
                kernel.name,
                values.len()
            ));
        }
    }
    Ok(())
}

/// [`check_values`] on every fixed case of `entry` ([`fixed_cases`]).
///
/// # Errors
/// One line per failing case (its label first), or the kernel's build error.
pub fn check_entry(
    entry: &dyn CatalogEntry,
    devices: &[(&str, &dyn Device)],
) -> Result<(), String> {
    let kernel = entry
        .build()
        .map_err(|e| format!("{}: {e}", entry.name()))?;
    let failures: Vec<String> = fixed_cases(&kernel.name, entry.blocksize())
        .into_iter()
        .filter_map(|(label, values)| {
            check_values(entry, &kernel, devices, &values, &mut |_, _| {})
                .err()
                .map(|e| format!("{label}: {e}"))
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}
