//! The value classes the extension module answers with: `Choice`, `Band`, `Check`. Values, so
//! they compare and hash by their fields and pickle (multiprocessing, Ray and caches move them
//! between processes); `__reduce__` rebuilds each through its constructor.

use std::hash::{Hash, Hasher};

use pyo3::prelude::*;
use pyo3::types::PyType;

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// What the profile chooses for one message.
#[pyclass(module = "artune", frozen, eq, hash, get_all)]
#[derive(Clone, PartialEq)]
pub struct Choice {
    /// Backend id as profiles write it, e.g. "nccl" or "two_stage_push".
    pub(super) backend: String,
    /// The NCCL variant to run where NCCL serves ("nccl" = NCCL's own choice).
    pub(super) nccl: String,
    /// Median time measured at the serving bucket, microseconds.
    pub(super) expected_us: f64,
    /// The serving bucket's upper bound, bytes.
    pub(super) bucket_bytes: u64,
    /// Device memory per GPU the backend's buffers need (0 for NCCL).
    pub(super) buffer_bytes: u64,
    /// True for a custom peer-to-peer kernel, False for NCCL and its variants.
    pub(super) custom: bool,
    /// What an engine without artune's kernels runs: `backend` where engines have a path of
    /// its shape, else the profile's choice among those (for an island schedule).
    pub(super) fallback: String,
    /// The GPUs of the group that answered (the profile may have several placements).
    pub(super) gpus: Vec<usize>,
}

/// Equal choices hash alike: the time by its bits, with -0.0 taken as 0.0 (they are equal).
impl Hash for Choice {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (
            &self.backend,
            &self.nccl,
            (self.expected_us + 0.0).to_bits(),
        )
            .hash(h);
        (self.bucket_bytes, self.buffer_bytes, self.custom).hash(h);
        (&self.fallback, &self.gpus).hash(h);
    }
}

type ChoiceArgs = (String, String, f64, u64, u64, bool, String, Vec<usize>);

#[pymethods]
impl Choice {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        backend: String,
        nccl: String,
        expected_us: f64,
        bucket_bytes: u64,
        buffer_bytes: u64,
        custom: bool,
        fallback: String,
        gpus: Vec<usize>,
    ) -> Self {
        Choice {
            backend,
            nccl,
            expected_us,
            bucket_bytes,
            buffer_bytes,
            custom,
            fallback,
            gpus,
        }
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> (Bound<'py, PyType>, ChoiceArgs) {
        let c = slf.get().clone();
        let args = (
            c.backend,
            c.nccl,
            c.expected_us,
            c.bucket_bytes,
            c.buffer_bytes,
            c.custom,
            c.fallback,
            c.gpus,
        );
        (slf.get_type(), args)
    }

    fn __repr__(&self) -> String {
        format!(
            "Choice(backend={:?}, nccl={:?}, expected_us={}, bucket_bytes={}, buffer_bytes={}, custom={}, fallback={:?}, gpus={:?})",
            self.backend,
            self.nccl,
            self.expected_us,
            self.bucket_bytes,
            self.buffer_bytes,
            py_bool(self.custom),
            self.fallback,
            self.gpus
        )
    }
}

/// One band of a group: sizes `from_bytes` to `up_to_bytes`. The first band starts where
/// the profile answers (1 where its smallest size is at most 4 KiB, else that size: below it
/// select has no answer); each next one just above the previous band's `up_to_bytes`.
#[pyclass(module = "artune", frozen, eq, hash, get_all)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Band {
    pub(super) from_bytes: u64,
    pub(super) up_to_bytes: u64,
    pub(super) backend: String,
    pub(super) nccl: String,
    pub(super) custom: bool,
    /// What an engine without artune's kernels runs in this band (see `Choice.fallback`).
    pub(super) fallback: String,
}

type BandArgs = (u64, u64, String, String, bool, String);

#[pymethods]
impl Band {
    #[new]
    fn new(
        from_bytes: u64,
        up_to_bytes: u64,
        backend: String,
        nccl: String,
        custom: bool,
        fallback: String,
    ) -> Self {
        Band {
            from_bytes,
            up_to_bytes,
            backend,
            nccl,
            custom,
            fallback,
        }
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> (Bound<'py, PyType>, BandArgs) {
        let b = slf.get().clone();
        let args = (
            b.from_bytes,
            b.up_to_bytes,
            b.backend,
            b.nccl,
            b.custom,
            b.fallback,
        );
        (slf.get_type(), args)
    }

    fn __repr__(&self) -> String {
        format!(
            "Band(from_bytes={}, up_to_bytes={}, backend={:?}, nccl={:?}, custom={}, fallback={:?})",
            self.from_bytes,
            self.up_to_bytes,
            self.backend,
            self.nccl,
            py_bool(self.custom),
            self.fallback
        )
    }
}

/// The validity rule's verdict on a profile for a machine (src/profile/validity/), as the
/// NCCL plugin, the C ABI and `artune check` give it.
#[pyclass(module = "artune", frozen, eq, hash, get_all)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Check {
    /// The hardware that decides is the profile's: it holds here.
    pub(super) valid: bool,
    /// Whether a consumer follows it: valid, or every reason overridden (`allow_*`).
    pub(super) followed: bool,
    /// Why it is not valid here, old → new.
    pub(super) reasons: Vec<String>,
    /// What differs but leaves it valid (driver, CUDA or NCCL version, NCCL variables,
    /// another node of the class); `verdict` says what to run for them.
    pub(super) notes: Vec<String>,
    /// What the machine does not report, so it was not compared.
    pub(super) unchecked: Vec<String>,
    /// The verdict in one phrase, as the start-up lines print it: "valid here; …",
    /// "not valid here (…): …", or "NOT valid here (…), followed because …".
    pub(super) verdict: String,
}

type CheckArgs = (bool, bool, Vec<String>, Vec<String>, Vec<String>, String);

#[pymethods]
impl Check {
    #[new]
    fn new(
        valid: bool,
        followed: bool,
        reasons: Vec<String>,
        notes: Vec<String>,
        unchecked: Vec<String>,
        verdict: String,
    ) -> Self {
        Check {
            valid,
            followed,
            reasons,
            notes,
            unchecked,
            verdict,
        }
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> (Bound<'py, PyType>, CheckArgs) {
        let c = slf.get().clone();
        let args = (
            c.valid,
            c.followed,
            c.reasons,
            c.notes,
            c.unchecked,
            c.verdict,
        );
        (slf.get_type(), args)
    }

    fn __repr__(&self) -> String {
        format!(
            "Check(valid={}, followed={}, reasons={:?}, notes={:?}, unchecked={:?})",
            py_bool(self.valid),
            py_bool(self.followed),
            self.reasons,
            self.notes,
            self.unchecked
        )
    }
}
