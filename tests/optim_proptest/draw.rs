//! The random cases of `optim_proptest.rs`: hyperparameters (lr log-uniform in [1e-5, 1e-1],
//! betas, eps, weight decay, AdEMAMix's beta3/alpha/schedulers, LAMB/LARS's `max_unorm`, the
//! `_gs` variants' clip and `skip_zeros`, the first step, Philox key and offset), sizes around
//! the block, and parameters and gradients mixed with edge values.

use proptest::prelude::*;

use super::STEPS;

/// Random hyperparameters and launch settings of one case (each family uses the ones it has).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Draw {
    pub(crate) lr: f64,
    pub(crate) beta1: f64,
    pub(crate) beta2: f64,
    pub(crate) beta3: f64,
    pub(crate) alpha: f64,
    pub(crate) eps: f64,
    pub(crate) weight_decay: f64,
    pub(crate) t_alpha: Option<u32>,
    pub(crate) t_beta3: Option<u32>,
    /// LAMB / LARS trust-ratio bound (small values clip most steps, large ones none).
    pub(crate) max_unorm: f64,
    /// The step number of the first of the [`STEPS`] steps (1-based).
    pub(crate) first_step: u32,
    pub(crate) seed: u64,
    pub(crate) param_id: u32,
    /// Even element offset of the Philox counter.
    pub(crate) offset: u32,
    /// `_gs` variants: the norm the gradient is clipped to, and `skip_zeros`.
    pub(crate) clip: f32,
    pub(crate) skip_zeros: bool,
}

fn log_uniform(lo: f64, hi: f64) -> impl Strategy<Value = f64> {
    (lo.log10()..=hi.log10()).prop_map(|e| 10f64.powf(e))
}

pub(crate) fn draw() -> impl Strategy<Value = Draw> {
    let betas = (
        prop_oneof![1 => prop::sample::select(vec![0.0, 0.9, 0.99]), 3 => 0.0f64..=0.99],
        prop_oneof![1 => prop::sample::select(vec![0.9, 0.999, 0.9999]), 3 => 0.9f64..=0.9999],
        0.99f64..=0.9999,
        0.0f64..=10.0,
    );
    let rates = (
        log_uniform(1e-5, 1e-1),
        log_uniform(1e-10, 1e-6),
        prop_oneof![Just(0.0), 0.0f64..=0.1],
    );
    let schedule = (
        prop::option::of(1u32..20),
        prop::option::of(1u32..20),
        prop_oneof![Just(1u32), 2u32..10_000],
    );
    let rng = (
        any::<u64>(),
        0u32..64,
        (0u32..1000).prop_map(|k| 2 * k),
        prop::sample::select(vec![0.001, 0.02, 1.0, 100.0]),
    );
    let gs = (
        prop::sample::select(vec![0.0f32, 0.5, 3.0, 1e30]),
        any::<bool>(),
    );
    (betas, rates, schedule, rng, gs).prop_map(
        |(
            (beta1, beta2, beta3, alpha),
            (lr, eps, wd),
            (ta, tb, first),
            (seed, id, off, mu),
            (clip, skip_zeros),
        )| {
            Draw {
                lr,
                beta1,
                beta2,
                beta3,
                alpha,
                eps,
                weight_decay: wd,
                t_alpha: ta,
                t_beta3: tb,
                max_unorm: mu,
                first_step: first,
                seed,
                param_id: id,
                offset: off,
                clip,
                skip_zeros,
            }
        },
    )
}

/// Edge values shared by parameters and gradients.
fn edges() -> Vec<f32> {
    vec![
        0.0,
        -0.0,
        f32::from_bits(1),
        -f32::MIN_POSITIVE / 3.0,
        f32::MIN_POSITIVE,
        1e-30,
        -1e-20,
        3.0e38,
        -3.0e38,
        1e18,
        -65504.0,
        1.0,
        -1.0,
    ]
}

/// A parameter: mostly normal-looking, sometimes an edge value (rarely non-finite). With
/// `finite_norm`, only values whose squares sum to a finite norm (no ±inf, NaN or huge values),
/// so that LAMB/LARS reach their trust-ratio clipping instead of the non-finite-norm rules.
fn param(finite_norm: bool) -> impl Strategy<Value = f32> {
    let small: Vec<f32> = edges().into_iter().filter(|p| p.abs() < 1e5).collect();
    let mut rare = edges();
    rare.extend([f32::INFINITY, f32::NAN]);
    if finite_norm {
        rare = small.clone();
    }
    prop_oneof![
        12 => -2.0f32..2.0,
        2 => prop::sample::select(if finite_norm { small } else { edges() }),
        1 => prop::sample::select(rare),
    ]
}

/// A gradient: normal values of two scales mixed with edge values (0, -0, subnormals, 1e18) and
/// ±inf, NaN (which zero their element's state). `overflow` adds finite values whose square
/// overflows (±3e38): they make a moment infinite, which turns a whole 8-bit or 4-bit block NaN
/// from then on, so only some cases have them.
fn grad(overflow: bool) -> impl Strategy<Value = f32> {
    let mut bad: Vec<f32> = edges().into_iter().filter(|g| g.abs() < 1e19).collect();
    bad.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
    if overflow {
        bad.extend([3.0e38, -3.0e38]);
    }
    prop_oneof![
        6 => -1.0f32..1.0,
        3 => -1e-3f32..1e-3,
        1 => prop::sample::select(bad),
    ]
}

/// One case: the hyperparameters, the parameters and one gradient per step.
#[derive(Clone, Debug)]
pub(crate) struct Case {
    pub(crate) draw: Draw,
    pub(crate) params: Vec<f32>,
    pub(crate) grads: Vec<Vec<f32>>,
}

/// Sizes: 1, a non-multiple of `block`, one block, and a few blocks (`3 * block`).
fn size(block: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(1usize),
        2 => (2..3 * block).prop_map(move |k| if k.is_multiple_of(block) { k + 1 } else { k }),
        1 => Just(block),
        2 => Just(3 * block),
    ]
}

pub(crate) fn case(block: usize, finite_norm: bool) -> impl Strategy<Value = Case> {
    let overflow = prop::bool::weighted(if finite_norm { 0.0 } else { 0.2 });
    (size(block), draw(), overflow).prop_flat_map(move |(n, draw, overflow)| {
        (
            prop::collection::vec(param(finite_norm), n),
            prop::collection::vec(prop::collection::vec(grad(overflow), n), STEPS),
        )
            .prop_map(move |(params, grads)| Case {
                draw,
                params,
                grads,
            })
    })
}
