//! Philox4x32-10 random bits on the devices: the `random_bits` kernel
//! (`qforge::ir::routines::philox::philox_kernel`) and the `philox4x32_10_blocks` kernel run on
//! the CPU device (Cranelift; SIMD on and off, native and baseline instruction set) and on every
//! device of `qforge::devices::cpu_variants_and_available_devices()`, bit for bit against the reference
//! interpreter and against the plain-Rust `philox4x32_10_host`, including the Random123
//! known-answer vectors.

use proptest::prelude::*;
use qforge::devices::cpu_variants_and_available_devices;
use qforge::ir::routines::philox::{philox4x32_10_host, philox_blocks_kernel, philox_kernel};
use qforge::ir::{Kernel, OwnedArg, Scalar};
use qforge::runtime::{Device, InterpreterDevice};

/// Random123 `kat_vectors`, philox4x32 with 10 rounds: (counter, key, expected output).
const KAT: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
    (
        [0, 0, 0, 0],
        [0, 0],
        [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8],
    ),
    (
        [0xffff_ffff; 4],
        [0xffff_ffff; 2],
        [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
    ),
    (
        [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
        [0xa409_3822, 0x299f_31d0],
        [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
    ),
];

fn bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn words(b: &[u8]) -> Vec<u32> {
    b.chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Runs `random_bits(seed, n)` on `dev`; returns the `4n` words.
fn random_bits(dev: &dyn Device, k: &Kernel, seed: u32, n: u32) -> Vec<u32> {
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(seed)),
        OwnedArg::Scalar(Scalar::U32(n)),
        OwnedArg::Write(vec![0xA5; 16 * n as usize]),
    ];
    dev.launch(k, &mut OwnedArg::borrow_all(&mut args))
        .unwrap_or_else(|e| panic!("{}: {e}", dev.name()));
    match &args[2] {
        OwnedArg::Write(o) => words(o),
        _ => unreachable!(),
    }
}

/// Runs `philox4x32_10_blocks` on `dev` for `inputs`.
fn blocks(dev: &dyn Device, k: &Kernel, inputs: &[([u32; 4], [u32; 2])]) -> Vec<[u32; 4]> {
    let ctr: Vec<u32> = inputs.iter().flat_map(|(c, _)| *c).collect();
    let key: Vec<u32> = inputs.iter().flat_map(|(_, k)| *k).collect();
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(inputs.len() as u32)),
        OwnedArg::Read(bytes(&ctr)),
        OwnedArg::Read(bytes(&key)),
        OwnedArg::Write(vec![0xA5; 16 * inputs.len()]),
    ];
    dev.launch(k, &mut OwnedArg::borrow_all(&mut args))
        .unwrap_or_else(|e| panic!("{}: {e}", dev.name()));
    match &args[3] {
        OwnedArg::Write(o) => words(o)
            .chunks(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect(),
        _ => unreachable!(),
    }
}

#[test]
fn philox_random_bits_are_bit_identical_on_every_device() {
    let k = philox_kernel().unwrap();
    let devs = cpu_variants_and_available_devices();
    for seed in [0u32, 1, 0x9E37_79B9, u32::MAX] {
        for n in [1u32, 3, 64, 1000] {
            let want: Vec<u32> = (0..n)
                .flat_map(|i| philox4x32_10_host([i, 0, 0, 0], [seed, 0]))
                .collect();
            let interp = random_bits(&InterpreterDevice, &k, seed, n);
            assert_eq!(interp, want, "interpreter, seed {seed:#x}, n {n}");
            for dev in &devs {
                let got = random_bits(dev.as_ref(), &k, seed, n);
                assert!(
                    got == interp,
                    "{} ({}), seed {seed:#x}, n {n}: {} of {} words differ from the interpreter",
                    dev.name(),
                    dev.backend(),
                    got.iter().zip(&interp).filter(|(a, b)| a != b).count(),
                    got.len()
                );
            }
        }
    }
}

#[test]
fn philox_kat_vectors_hold_on_every_device() {
    let k = philox_blocks_kernel().unwrap();
    let inputs: Vec<_> = KAT.iter().map(|(c, k, _)| (*c, *k)).collect();
    let want: Vec<[u32; 4]> = KAT.iter().map(|(_, _, w)| *w).collect();
    assert_eq!(blocks(&InterpreterDevice, &k, &inputs), want, "interpreter");
    for dev in cpu_variants_and_available_devices() {
        assert_eq!(
            blocks(dev.as_ref(), &k, &inputs),
            want,
            "{} ({})",
            dev.name(),
            dev.backend()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    #[test]
    fn philox_blocks_match_host_and_interpreter_on_every_device(
        inputs in prop::collection::vec((any::<[u32; 4]>(), any::<[u32; 2]>()), 1..40)
    ) {
        let k = philox_blocks_kernel().unwrap();
        let want: Vec<[u32; 4]> = inputs.iter().map(|(c, key)| philox4x32_10_host(*c, *key)).collect();
        prop_assert_eq!(&blocks(&InterpreterDevice, &k, &inputs), &want);
        for dev in cpu_variants_and_available_devices() {
            prop_assert_eq!(&blocks(dev.as_ref(), &k, &inputs), &want, "{}", dev.name());
        }
    }
}
