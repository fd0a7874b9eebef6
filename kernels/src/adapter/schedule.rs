//! Activation Function Annealing schedules (AFA-LoRA, arXiv 2512.22455): the weight `beta` of
//! the nonlinearity in `act_beta(z) = beta * act(z) + (1 - beta) * z` falls from 1 to 0 over the
//! first `anneal_fraction` of training, after which the adapter is linear and can be merged.

/// How `beta` falls over the annealing window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfaShape {
    /// `beta = max(0, 1 - t)`, `t = step / (total_steps * anneal_fraction)`.
    Linear,
    /// `beta = (1 + cos(pi * min(t, 1))) / 2`: the same end points, flat at both ends.
    Cosine,
}

/// An annealing schedule; `beta(step)` is computed in `f64` and rounded once to `f32`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AfaSchedule {
    /// Steps of the whole run.
    pub total_steps: u64,
    /// Fraction of the run over which `beta` falls to 0 (the paper's default 0.3).
    pub anneal_fraction: f64,
    /// Linear (the paper's) or cosine.
    pub shape: AfaShape,
}

impl AfaSchedule {
    /// The linear schedule over the first 30% of `total_steps`.
    pub fn new(total_steps: u64) -> AfaSchedule {
        AfaSchedule {
            total_steps,
            anneal_fraction: 0.3,
            shape: AfaShape::Linear,
        }
    }

    /// `beta` at `step` (0-based): 1 at step 0, 0 from the end of the window on. A window of
    /// zero steps (`total_steps * anneal_fraction <= 0`, or a non-finite fraction) is 0 from
    /// the start: a linear adapter.
    pub fn beta(&self, step: u64) -> f32 {
        let window = self.total_steps as f64 * self.anneal_fraction;
        if window.is_nan() || window <= 0.0 {
            return 0.0;
        }
        let t = (step as f64 / window).min(1.0);
        let beta = match self.shape {
            AfaShape::Linear => 1.0 - t,
            AfaShape::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * t).cos()),
        };
        beta.clamp(0.0, 1.0) as f32
    }

    /// The first step at which `beta` is 0 (when the adapter may be merged).
    pub fn linear_from(&self) -> u64 {
        let window = self.total_steps as f64 * self.anneal_fraction;
        if window.is_nan() || window <= 0.0 {
            0
        } else {
            window.ceil() as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_and_cosine_fall_from_one_to_zero_over_the_window() {
        let s = AfaSchedule::new(100);
        assert_eq!(s.beta(0), 1.0);
        assert_eq!(s.beta(15), 0.5);
        assert_eq!(s.beta(30), 0.0);
        assert_eq!(s.beta(99), 0.0);
        assert_eq!(s.linear_from(), 30);
        let c = AfaSchedule {
            shape: AfaShape::Cosine,
            ..s
        };
        assert_eq!(c.beta(0), 1.0);
        assert!((c.beta(15) - 0.5).abs() < 1e-7);
        assert!(c.beta(5) > s.beta(5), "cosine stays higher early");
        assert_eq!(c.beta(30), 0.0);
        let none = AfaSchedule {
            anneal_fraction: 0.0,
            ..s
        };
        assert_eq!((none.beta(0), none.linear_from()), (0.0, 0));
        for step in 0..40 {
            assert!(s.beta(step + 1) <= s.beta(step) && c.beta(step + 1) <= c.beta(step));
        }
    }
}
