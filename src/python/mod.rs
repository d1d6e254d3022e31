//! The Python extension module `artune._artune` (built by maturin with `--features python`):
//! the same profile validation, selection and validity rules as the Rust API, for engines,
//! which are Python. The Python package (python/artune/) re-exports it and adds the engine
//! plugins. Errors become Python exceptions carrying artune's one-sentence messages.

mod allreduce;
mod eager;
mod values;

use std::path::PathBuf;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::allreduce::{Backend, Mode};
use crate::error::Error;
use crate::profile::validity::{self, Allow};
use crate::profile::{Query, Selection, Selector};
use values::{Band, Check, Choice};

create_exception!(
    artune,
    ArtuneError,
    PyException,
    "Base of every artune error."
);
create_exception!(
    artune,
    ProfileError,
    ArtuneError,
    "The profile cannot be read or is not a valid artune profile."
);
create_exception!(
    artune,
    BadInputError,
    ArtuneError,
    "An argument is out of range."
);
create_exception!(
    artune,
    HardwareError,
    ArtuneError,
    "The machine could not be read (no driver, no NVML)."
);

/// "2.28.9": dot-separated whole numbers, as NCCL versions are written.
fn is_version(v: &str) -> bool {
    !v.is_empty()
        && v.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Read { .. } | Error::Parse { .. } | Error::Profile { .. } => {
            ProfileError::new_err(msg)
        }
        Error::BadInput(_) | Error::Write { .. } => BadInputError::new_err(msg),
        Error::Hardware(_) => HardwareError::new_err(msg),
        Error::NoMachine { reason, .. } => HardwareError::new_err(format!(
            "{reason}, or check against a simulated machine with sim=PRESET or topology=FILE"
        )),
        _ => ArtuneError::new_err(msg),
    }
}

/// An integer argument as i64, or a BadInputError naming its keyword: a Python int too large
/// for 64 bits would otherwise be a bare OverflowError that names nothing. Every range error of
/// the API is a BadInputError, so `except artune.ArtuneError` catches them all.
fn int(name: &str, v: &Bound<'_, PyAny>) -> PyResult<i64> {
    v.extract::<i64>().map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(v.py()) {
            BadInputError::new_err(format!(
                "{name}={v} is too large: no allreduce has one that big; pass a value below 2**63"
            ))
        } else {
            e
        }
    })
}

/// A size or count from Python: a negative one is bad input in artune's words, not the
/// OverflowError an unsigned argument would give.
fn unsigned(name: &str, v: i64) -> PyResult<u64> {
    u64::try_from(v)
        .map_err(|_| BadInputError::new_err(format!("{name}={v} is negative; pass 0 or more")))
}

/// `Follow::steps` as Python reads it: (from, up_to, custom).
type Steps = (u64, Vec<u64>, Vec<bool>);

/// A TP size as the engine plugins ask about it (a TP1 engine too: no answer, not an error).
fn tp_size(v: &Bound<'_, PyAny>) -> PyResult<usize> {
    Ok(unsigned("tp", int("tp", v)?)? as usize)
}

/// A message size as the engine plugins ask about it (an empty tensor too).
fn size(v: &Bound<'_, PyAny>) -> PyResult<u64> {
    unsigned("nbytes", int("nbytes", v)?)
}

/// A question as `artune select` and `why` take it: a group of at least 2 GPUs, a message of
/// at least 1 byte; what they refuse (exit 2) this refuses, naming the keyword.
/// `gpus=` as a placement of `tp`: `tp` different GPUs, or None.
fn placement(tp: usize, gpus: Option<&[usize]>) -> PyResult<Option<&[usize]>> {
    let Some(g) = gpus else { return Ok(None) };
    if !crate::profile::is_placement(tp, g) {
        return Err(BadInputError::new_err(format!(
            "gpus={g:?} must name {tp} different GPUs for tp={tp}"
        )));
    }
    Ok(Some(g))
}

fn question(tp: &Bound<'_, PyAny>, nbytes: &Bound<'_, PyAny>) -> PyResult<(usize, u64)> {
    let (t, n) = (int("tp", tp)?, int("nbytes", nbytes)?);
    if t < 2 {
        return Err(BadInputError::new_err(format!(
            "tp={t}: an allreduce needs at least 2 GPUs; pass the group's size, e.g. tp=2"
        )));
    }
    if n < 1 {
        return Err(BadInputError::new_err(format!(
            "nbytes={n} is not a message; pass its size in bytes, at least 1"
        )));
    }
    Ok((t as usize, n as u64))
}

fn mode(m: &str) -> PyResult<Mode> {
    match m {
        "graph" => Ok(Mode::Graph),
        "eager" => Ok(Mode::Eager),
        other => Err(BadInputError::new_err(format!(
            "mode `{other}` is neither \"graph\" nor \"eager\"; pass one of those"
        ))),
    }
}

/// A validated profile and the selector every consumer answers through.
#[pyclass(module = "artune", frozen)]
pub struct Profile {
    profile: crate::profile::Profile,
    selector: Selector,
}

#[pymethods]
impl Profile {
    /// Reads and validates a profile file, with the same limits as `artune show`.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<Profile> {
        let profile = crate::profile::Profile::load(&path).map_err(to_py)?;
        let selector = profile.selector();
        Ok(Profile { profile, selector })
    }

    /// True when the profile was made on the simulated fabric: not a measurement.
    #[getter]
    fn simulated(&self) -> bool {
        self.profile.simulated
    }

    /// What measured it, e.g. "simulated pcie-8x-2switch".
    #[getter]
    fn fabric(&self) -> &str {
        &self.profile.fabric
    }

    #[getter]
    fn created(&self) -> &str {
        &self.profile.created
    }

    /// TP sizes the profile has, ascending.
    #[getter]
    fn tp_sizes(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.profile.groups.iter().map(|g| g.tp).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The choice for one allreduce of `nbytes` bytes on `tp` ranks, or None where the profile
    /// has no answer (keep the engine's default).
    /// `gpus`: the group's GPUs as the machine numbers them, where the profile has several
    /// placements of `tp` (the CLI's `--gpus`); None is GPUs 0..tp, or the first placement.
    #[pyo3(signature = (tp, nbytes, mode = "graph", gpus = None))]
    fn select(
        &self,
        tp: &Bound<'_, PyAny>,
        nbytes: &Bound<'_, PyAny>,
        mode: &str,
        gpus: Option<Vec<usize>>,
    ) -> PyResult<Option<Choice>> {
        let (tp, nbytes) = question(tp, nbytes)?;
        let q = Query {
            tp,
            mode: self::mode(mode)?,
            gpus: placement(tp, gpus.as_deref())?,
        };
        let Some(at) = self.selector.group(q).map(|g| g.gpus().to_vec()) else {
            return Ok(None);
        };
        Ok(match self.selector.select(q, nbytes) {
            Selection::Chosen {
                backend,
                nccl,
                fallback,
                expected_us,
                bucket_bytes,
                buffer_bytes,
            } => Some(Choice {
                backend: backend.id().into(),
                nccl: nccl.id().into(),
                expected_us,
                bucket_bytes,
                buffer_bytes,
                custom: backend.is_custom(),
                fallback: fallback.id().into(),
                gpus: at,
            }),
            Selection::Unknown(_) => None,
        })
    }

    /// Why the profile chooses what it does for one message, as `artune why` prints it: every
    /// backend's time and interval, the rule that chose, what forcing each alternative costs,
    /// and what each engine runs there. Where `select` gives None, the line `why` prints then:
    /// "no answer (keep the engine's default): " and the reason.
    #[pyo3(signature = (tp, nbytes, mode = "graph", gpus = None))]
    fn explain(
        &self,
        tp: &Bound<'_, PyAny>,
        nbytes: &Bound<'_, PyAny>,
        mode: &str,
        gpus: Option<Vec<usize>>,
    ) -> PyResult<String> {
        let (tp, nbytes) = question(tp, nbytes)?;
        let q = Query {
            tp,
            mode: self::mode(mode)?,
            gpus: placement(tp, gpus.as_deref())?,
        };
        let none = |why: String| format!("no answer (keep the engine's default): {why}");
        let Some(g) = self.profile.group(q) else {
            let why = match q.gpus {
                Some(gpus) => {
                    let gpus: Vec<String> = gpus.iter().map(|x| x.to_string()).collect();
                    format!("on GPUs {}", gpus.join(","))
                }
                None => self.profile.no_group(tp, q.mode),
            };
            return Ok(none(format!(
                "the profile has no TP{tp} {} group {why}",
                q.mode.id()
            )));
        };
        if let Selection::Unknown(why) = self.selector.select(q, nbytes) {
            return Ok(none(crate::report::outside("the profile", g, nbytes, why)));
        }
        let w = crate::export::why::explain(&self.profile, q, nbytes).map_err(to_py)?;
        Ok(crate::export::why::render(&w))
    }

    /// The group's bands, ascending: what an engine configures once at start-up.
    #[pyo3(signature = (tp, mode = "graph"))]
    fn bands(&self, tp: &Bound<'_, PyAny>, mode: &str) -> PyResult<Vec<Band>> {
        let q = Query {
            tp: tp_size(tp)?,
            mode: self::mode(mode)?,
            gpus: None,
        };
        let Some(g) = self.selector.group(q) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<Band> = Vec::new();
        let smallest = g.sizes().first().copied().unwrap_or(1);
        let first = match crate::profile::answers_below(smallest, 1) {
            true => 1,
            false => smallest,
        };
        for (&bytes, a) in g.sizes().iter().zip(g.answers()) {
            match out.last_mut() {
                Some(b)
                    if b.backend == a.backend.id()
                        && b.nccl == a.nccl.id()
                        && b.fallback == a.fallback.id() =>
                {
                    b.up_to_bytes = bytes
                }
                _ => out.push(Band {
                    from_bytes: out.last().map_or(first, |b| b.up_to_bytes + 1),
                    up_to_bytes: bytes,
                    backend: a.backend.id().into(),
                    nccl: a.nccl.id().into(),
                    custom: a.backend.is_custom(),
                    fallback: a.fallback.id().into(),
                }),
            }
        }
        Ok(out)
    }

    /// The engine plugins' rule (src/export/follow.rs, which `artune why` reports): True
    /// where the profile chose a custom kernel for `nbytes` at `tp` in `mode`, False where
    /// NCCL (no peer-to-peer path may take it), None where it has no answer.
    #[pyo3(signature = (tp, nbytes, mode = "graph"))]
    fn custom_at(
        &self,
        tp: &Bound<'_, PyAny>,
        nbytes: &Bound<'_, PyAny>,
        mode: &str,
    ) -> PyResult<Option<bool>> {
        let (tp, nbytes) = (tp_size(tp)?, size(nbytes)?);
        Ok(self.follow(tp).custom_at(nbytes, self::mode(mode)?))
    }

    /// `custom_at` at `tp` in `mode` as plain data computed once (src/export/follow.rs
    /// `Follow::steps`): None where the profile lacks the group, else (from, up_to, custom):
    /// for `from <= nbytes`, `custom[i]` of the first `i` with `nbytes <= up_to[i]`, and no
    /// answer past the last bound. The SGLang plugin decides from it inside traced code.
    #[pyo3(signature = (tp, mode = "graph"))]
    fn custom_steps(&self, tp: &Bound<'_, PyAny>, mode: &str) -> PyResult<Option<Steps>> {
        let steps = self.follow(tp_size(tp)?).steps(self::mode(mode)?);
        Ok(steps.map(|s| (s.from, s.up_to, s.custom)))
    }

    /// The largest size up to which the profile chooses custom from the smallest size, in
    /// both modes at `tp` (0: one starts with NCCL): where a fused allreduce+norm stops. None
    /// where the profile lacks a mode there: the fusion serves both, so the engine's stands.
    fn custom_prefix(&self, tp: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        Ok(self.follow(tp_size(tp)?).custom_prefix())
    }

    /// The largest message the profile routes to a custom kernel at `tp` in either mode (0:
    /// none), for a custom all-reduce serving both; None where the profile lacks a mode.
    fn largest_custom(&self, tp: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        Ok(self.follow(tp_size(tp)?).largest_custom())
    }

    /// A fused allreduce+norm the engine fuses up to `engine` bytes at `tp` (None: not
    /// at all): the size the plugins let it fuse to, None for none.
    fn fused_up_to(
        &self,
        tp: &Bound<'_, PyAny>,
        engine: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<u64>> {
        let engine = engine
            .filter(|e| !e.is_none())
            .map(|e| unsigned("engine", int("engine", e)?))
            .transpose()?;
        Ok(self.follow(tp_size(tp)?).fused_up_to(engine))
    }

    /// Device memory per GPU each backend costs an engine that follows the profile at `tp`:
    /// custom buffers sized to the largest size the profile routes to them, NCCL's communicator.
    #[pyo3(signature = (tp, mode = "graph"))]
    fn memory(
        &self,
        tp: &Bound<'_, PyAny>,
        mode: &str,
    ) -> PyResult<std::collections::BTreeMap<String, u64>> {
        let q = Query {
            tp: tp_size(tp)?,
            mode: self::mode(mode)?,
            gpus: None,
        };
        Ok(self
            .profile
            .group(q)
            .map(|g| {
                g.memory
                    .iter()
                    .filter_map(|(b, m)| Some((b.id().to_string(), m.required_bytes_per_gpu?)))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The validity rule's verdict: against a simulated preset (`sim`), a topology file
    /// (`topology`), or, with neither, this machine as NVML and sysfs read it (a machine that
    /// cannot be read is a reason: the profile is not valid there).
    ///
    /// `nccl` is the NCCL version the caller runs (e.g. from `torch.cuda.nccl.version()`);
    /// without it the NCCL version is left unchecked. `allow_simulated` and `allow_invalid`
    /// are the user's overrides (`ARTUNE_ALLOW_SIMULATED`, `ARTUNE_ALLOW_INVALID`): they make
    /// `followed` true and the verdict say what they overrode. This loads no NCCL and starts no
    /// process, so an engine can call it at start-up.
    #[pyo3(signature = (sim = None, topology = None, nccl = None, allow_simulated = false,
                        allow_invalid = false))]
    fn check(
        &self,
        sim: Option<&str>,
        topology: Option<PathBuf>,
        nccl: Option<String>,
        allow_simulated: bool,
        allow_invalid: bool,
    ) -> PyResult<Check> {
        if let Some(n) = nccl.as_deref().filter(|n| !is_version(n)) {
            return Err(BadInputError::new_err(format!(
                "nccl={n:?} is not an NCCL version; pass it as \"2.28.9\" (torch.cuda.nccl.version() joined with dots)"
            )));
        }
        // A machine given as a preset or a file runs the caller's NCCL as this one would.
        let given = |mut t: crate::topology::Topology| {
            if nccl.is_some() {
                t.host.nccl = nccl.clone();
            }
            validity::validity(&self.profile, &t)
        };
        let v = match (sim, topology) {
            (Some(_), Some(_)) => {
                return Err(BadInputError::new_err(
                    "sim and topology each name the machine to check against; pass one of them",
                ))
            }
            (Some(name), None) => given(crate::topology::presets::get(name).map_err(to_py)?),
            (None, Some(path)) => given(crate::topology::file::load(&path).map_err(to_py)?),
            (None, None) => validity::here(&self.profile, nccl),
        };
        let allow = Allow {
            simulated: allow_simulated,
            invalid: allow_invalid,
        };
        Ok(Check {
            valid: v.valid(),
            followed: v.followed(allow),
            reasons: v.reasons().map(ToString::to_string).collect(),
            notes: v.notes().map(ToString::to_string).collect(),
            unchecked: v.unchecked.iter().map(ToString::to_string).collect(),
            verdict: v.verdict(allow),
        })
    }

    /// The sizes the profile measured at `tp` in `mode`, ascending: the sizes it steers.
    #[pyo3(signature = (tp, mode = "graph"))]
    fn sizes(&self, tp: &Bound<'_, PyAny>, mode: &str) -> PyResult<Vec<u64>> {
        let q = Query {
            tp: tp_size(tp)?,
            mode: self::mode(mode)?,
            gpus: None,
        };
        Ok(self
            .selector
            .group(q)
            .map(|g| g.sizes().to_vec())
            .unwrap_or_default())
    }

    /// What artune's SGLang plugin applies to the TP group: `("v2", (push1, pull1, pull2))`
    /// limits in bytes on full NVLink, `("v1", (keep, max_bytes))` on a PCIe pair,
    /// `("nccl", reason)` where SGLang runs NCCL whatever it is told, or None without the group.
    #[pyo3(signature = (tp, mode = "graph"))]
    fn sglang_plan<'py>(
        &self,
        py: Python<'py>,
        tp: &Bound<'_, PyAny>,
        mode: &str,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        use crate::export::SglangPlan;
        let q = Query {
            tp: tp_size(tp)?,
            mode: self::mode(mode)?,
            gpus: None,
        };
        let Some(g) = self.profile.group(q) else {
            return Ok(None);
        };
        let t = match crate::export::sglang_plugin_plan(&self.profile, g) {
            SglangPlan::V2 { limits } => ("v2", (limits[0], limits[1], limits[2]))
                .into_pyobject(py)?
                .into_any(),
            SglangPlan::V1 { keep, max_bytes } => {
                ("v1", (keep, max_bytes)).into_pyobject(py)?.into_any()
            }
            SglangPlan::Nccl { because } => ("nccl", because).into_pyobject(py)?.into_any(),
        };
        Ok(Some(t))
    }

    /// What artune's SGLang plugin sets up at TP size `tp` (both modes of the default
    /// placement): `("v2", {"graph": (push1, pull1, pull2), "eager": (...)})`, a mode the
    /// profile lacks None (SGLang's own limits); `("v1", build, max_bytes)`, max_bytes None
    /// where SGLang's own max_size stands; `("nccl", reason)`; or None without the TP size.
    fn sglang_setup<'py>(
        &self,
        py: Python<'py>,
        tp: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        use crate::export::SglangSetup;
        let Some(s) = crate::export::sglang_plugin_setup(&self.profile, tp_size(tp)?) else {
            return Ok(None);
        };
        let t = match s {
            SglangSetup::V2 { graph, eager } => {
                let d = pyo3::types::PyDict::new(py);
                let lim = |l: Option<[u64; 3]>| l.map(|l| (l[0], l[1], l[2]));
                d.set_item("graph", lim(graph))?;
                d.set_item("eager", lim(eager))?;
                ("v2", d).into_pyobject(py)?.into_any()
            }
            SglangSetup::V1 { build, max_bytes } => {
                ("v1", build, max_bytes).into_pyobject(py)?.into_any()
            }
            SglangSetup::Nccl { because } => ("nccl", because).into_pyobject(py)?.into_any(),
        };
        Ok(Some(t))
    }

    fn __repr__(&self) -> String {
        format!(
            "Profile({}, created {}, TP {:?}{})",
            self.profile.fabric,
            self.profile.created,
            self.tp_sizes(),
            if self.profile.simulated {
                ", SIMULATED"
            } else {
                ""
            }
        )
    }
}

impl Profile {
    fn follow(&self, tp: usize) -> crate::export::follow::Follow<'_> {
        crate::export::follow::Follow::new(&self.selector, tp, None)
    }
}

/// Backend ids, in the order of artune's C ABI codes.
#[pyfunction]
fn backends() -> Vec<&'static str> {
    Backend::ALL.iter().map(|b| b.id()).collect()
}

#[pymodule]
fn _artune(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Profile>()?;
    m.add_class::<Choice>()?;
    m.add_class::<Band>()?;
    m.add_class::<Check>()?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    allreduce::register(m)?;
    eager::register(m)?;
    m.add("ArtuneError", m.py().get_type::<ArtuneError>())?;
    m.add("ProfileError", m.py().get_type::<ProfileError>())?;
    m.add("BadInputError", m.py().get_type::<BadInputError>())?;
    m.add("HardwareError", m.py().get_type::<HardwareError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
