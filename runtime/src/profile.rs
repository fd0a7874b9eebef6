//! [`ProfiledDevice`]: a device that runs every kernel on another device and records the wall
//! time of each launch by kernel name, so a program (`qforge finetune`) can say where its time
//! goes. The first launch of each kernel compiles it first ([`Device::compile`]), timed apart,
//! so a JIT's compile time is not charged to the kernel's launches.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use qforge_ir::{Arg, Kernel, SharedKernel};

use crate::device::{Caps, Device};
use crate::error::Result;

/// Launches of one kernel and their wall time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KernelTime {
    /// Launches (each one call of [`Device::launch`]).
    pub launches: u64,
    /// Wall time of those launches, in seconds (compilation excluded).
    pub seconds: f64,
}

/// What a [`ProfiledDevice`] recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// Launch time per kernel name.
    pub kernels: BTreeMap<String, KernelTime>,
    /// Wall time of the first-launch compilations, in seconds.
    pub compile_seconds: f64,
}

impl Profile {
    /// The launch time of all kernels, in seconds.
    pub fn kernel_seconds(&self) -> f64 {
        self.kernels.values().map(|t| t.seconds).sum()
    }
}

/// A [`Device`] that forwards every call to `inner` and times the launches (see the module
/// docs). It adds one mutex lock and two clock reads per launch.
pub struct ProfiledDevice<'d> {
    inner: &'d dyn Device,
    profile: Mutex<Profile>,
}

impl<'d> ProfiledDevice<'d> {
    /// Times the launches on `inner`.
    pub fn new(inner: &'d dyn Device) -> Self {
        ProfiledDevice {
            inner,
            profile: Mutex::new(Profile::default()),
        }
    }

    /// What was recorded so far.
    pub fn profile(&self) -> Profile {
        self.profile.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

impl ProfiledDevice<'_> {
    /// Runs `launch` (a launch of `kernel` on the inner device), first `compile` (its
    /// compilation) when `kernel` has no recorded launch yet, and records both times.
    fn timed(
        &self,
        kernel: &Kernel,
        compile: impl FnOnce() -> Result<()>,
        launch: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        // A kernel without a recorded launch has not been compiled here yet.
        let first = self
            .profile
            .lock()
            .map(|p| !p.kernels.contains_key(&kernel.name))
            .unwrap_or(false);
        if first {
            let started = Instant::now();
            compile()?;
            let seconds = started.elapsed().as_secs_f64();
            if let Ok(mut p) = self.profile.lock() {
                p.compile_seconds += seconds;
            }
        }
        let started = Instant::now();
        let result = launch();
        let seconds = started.elapsed().as_secs_f64();
        if let Ok(mut p) = self.profile.lock() {
            let t = match p.kernels.get_mut(&kernel.name) {
                Some(t) => t,
                None => p.kernels.entry(kernel.name.clone()).or_default(),
            };
            t.launches += 1;
            t.seconds += seconds;
        }
        result
    }
}

impl Device for ProfiledDevice<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn compile(&self, kernel: &Kernel) -> Result<()> {
        self.inner.compile(kernel)
    }

    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
        self.timed(
            kernel,
            || self.inner.compile(kernel),
            || self.inner.launch(kernel, args),
        )
    }

    fn compile_shared(&self, kernel: &SharedKernel) -> Result<()> {
        self.inner.compile_shared(kernel)
    }

    fn launch_shared(&self, kernel: &SharedKernel, args: &mut [Arg<'_>]) -> Result<()> {
        self.timed(
            kernel.kernel(),
            || self.inner.compile_shared(kernel),
            || self.inner.launch_shared(kernel, args),
        )
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aot::tests::scale;
    use crate::device::InterpreterDevice;
    use crate::tensor::{bytes_f32, f32_bytes};
    use qforge_ir::Scalar;

    #[test]
    fn launches_are_counted_per_kernel_and_results_pass_through() {
        let dev = ProfiledDevice::new(&InterpreterDevice);
        let (a, b) = (scale("a", 2.0), scale("b", 3.0));
        for (k, want) in [(&a, 2.0), (&a, 2.0), (&b, 3.0)] {
            let mut x = f32_bytes(&[1.0, 2.0]);
            let mut args = [Arg::Scalar(Scalar::U32(2)), Arg::Write(&mut x)];
            dev.launch(k, &mut args).expect("runs");
            assert_eq!(bytes_f32(&x), [want, 2.0 * want]);
        }
        let p = dev.profile();
        let counts: Vec<(&str, u64)> = p
            .kernels
            .iter()
            .map(|(k, t)| (k.as_str(), t.launches))
            .collect();
        assert_eq!(counts, [("a", 2), ("b", 1)]);
        assert!(p.kernels.values().all(|t| t.seconds > 0.0));
        assert!(p.kernel_seconds() >= p.kernels["a"].seconds);
        assert!(p.compile_seconds > 0.0);
        assert_eq!(dev.name(), "interpreter");
    }

    #[test]
    fn a_failed_launch_is_passed_on_and_still_counted() {
        let dev = ProfiledDevice::new(&InterpreterDevice);
        let k = scale("a", 2.0);
        let mut args = [Arg::Scalar(Scalar::U32(2))];
        assert!(dev.launch(&k, &mut args).is_err());
        assert_eq!(dev.profile().kernels["a"].launches, 1);
    }
}
