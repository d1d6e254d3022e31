//! NCCL's variant switched per call within one start of the ranks: each rank sets the tuner's
//! measurement override (`artune_tuner_force` of the libartune.so NCCL loaded as its tuner,
//! [`crate::plugin::force`]) before a variant's calls or its graph capture, and rank 0's
//! profiler tags every call's record with the override it ran under. [`ReadBack`] says per
//! variant and size what NCCL ran: a variant NCCL did not follow is never timed as the pin.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void, CStr, CString, OsString};
use std::path::Path;

use crate::allreduce::Backend;
use crate::plugin::audit::{same_name, Summary};
use crate::plugin::force::Forced;

/// The variable naming NCCL's tuner plugin, which the ranks open too.
pub const ENV_TUNER: &str = "NCCL_TUNER_PLUGIN";
/// The override's setter in libartune.so.
const SETTER: &CStr = c"artune_tuner_force";

type SetFn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;

/// The setter of the library NCCL loads as its tuner, opened in a rank process.
pub struct Switch {
    set: SetFn,
}

impl Switch {
    /// Opens the library `NCCL_TUNER_PLUGIN` names: dlopen of a loaded file returns NCCL's
    /// handle, so the override set here is the one NCCL's tuner reads. The handle is never
    /// closed, so NCCL closing its own leaves the library loaded.
    pub fn from_env() -> Result<Switch, String> {
        let path = std::env::var_os(ENV_TUNER)
            .ok_or_else(|| format!("{ENV_TUNER} is not set, so no tuner can switch variants"))?;
        Switch::open(Path::new(&path))
    }

    pub fn open(path: &Path) -> Result<Switch, String> {
        let name = path.display();
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("{name} contains a NUL byte"))?;
        // SAFETY: loading a shared library (artune's own); it stays loaded for the process.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(format!("cannot open {name} to switch NCCL's variant"));
        }
        // SAFETY: a live handle; the symbol is looked up, not called.
        let p = unsafe { libc::dlsym(h, SETTER.as_ptr()) };
        if p.is_null() {
            return Err(format!(
                "{name} has no artune_tuner_force: it is an older libartune.so"
            ));
        }
        // SAFETY: artune_tuner_force has this signature (src/artune.h).
        let set = unsafe { std::mem::transmute::<*mut c_void, SetFn>(p) };
        Ok(Switch { set })
    }

    /// Makes NCCL's next calls run `variant` (NCCL's own choice: the override cleared), with
    /// `channels` as the call's `nChannels` where given (0 to the setter: NCCL's own).
    pub fn set(&self, variant: Backend, channels: Option<c_int>) -> Result<(), String> {
        let (a, p) = match Forced::of(variant, None) {
            Some(f) => (c_int::from(f.algo), c_int::from(f.proto)),
            None => (-1, -1),
        };
        // SAFETY: the library's exported setter, which takes any ints.
        match unsafe { (self.set)(a, p, channels.unwrap_or(0)) } {
            0 => Ok(()),
            r => Err(format!("artune_tuner_force refused {variant} ({r})")),
        }
    }
}

/// What the ranks need to switch variants: NCCL loads `lib` as its tuner, and no profile steers
/// NCCL's own choice.
pub fn env(lib: &Path) -> Vec<(String, OsString)> {
    vec![(ENV_TUNER.into(), lib.into())]
}

/// The override a call ran under (its name, None where none was set) and the call's bytes.
type Key = (Option<String>, u64);

/// What rank 0's profiler saw, per override and size: what NCCL ran and over how many channels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadBack {
    ran: BTreeMap<Key, Vec<(String, u32)>>,
}

impl ReadBack {
    /// Rank 0's summaries in `dir` (its profiler's `*.json`).
    pub fn read(dir: &Path) -> ReadBack {
        let mut out = ReadBack::default();
        let Ok(rd) = std::fs::read_dir(dir) else {
            return out;
        };
        for f in rd.flatten() {
            let is_json = f.path().extension().is_some_and(|x| x == "json");
            let s = std::fs::read(f.path())
                .ok()
                .filter(|_| is_json)
                .and_then(|t| serde_json::from_slice::<Summary>(&t).ok());
            for r in s.iter().filter(|s| s.rank == 0).flat_map(|s| &s.sizes) {
                let key = (r.forced.clone(), r.bytes);
                out.ran
                    .entry(key)
                    .or_default()
                    .push((r.ran.clone(), r.channels));
            }
        }
        out
    }

    /// The most channels `variant` ran `bytes` with, where every call made under its override
    /// ran it; Err says what ran instead, or that the profiler saw none of its calls.
    pub fn ran(&self, variant: Backend, bytes: u64) -> Result<u32, String> {
        let forced = Forced::of(variant, None).map(Forced::name);
        let Some(calls) = self.ran.get(&(forced.clone(), bytes)) else {
            return Err(format!(
                "NCCL's profiler saw no call of {variant} at {bytes} bytes"
            ));
        };
        if let Some(want) = &forced {
            if let Some((other, _)) = calls.iter().find(|(r, _)| !same_eq(r, want)) {
                return Err(format!(
                    "NCCL ran {other} at {bytes} bytes where the tuner forced {want}"
                ));
            }
        }
        Ok(calls.iter().map(|c| c.1).max().unwrap_or(0))
    }
}

/// "RING/LL" against "Ring/LL" as NCCL spelled them across versions.
fn same_eq(ran: &str, want: &str) -> bool {
    let (a, p) = ran.split_once('/').unwrap_or((ran, ""));
    let (wa, wp) = want.split_once('/').unwrap_or((want, ""));
    same_name(a, wa) && same_name(p, wp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::audit::SizeRecord;

    fn write(dir: &Path, name: &str, rank: i32, sizes: Vec<SizeRecord>) {
        let s = Summary {
            rank,
            sizes,
            ..Default::default()
        };
        std::fs::write(dir.join(name), serde_json::to_vec(&s).unwrap()).unwrap();
    }

    fn rec(forced: Option<&str>, bytes: u64, ran: &str, channels: u32) -> SizeRecord {
        SizeRecord {
            bytes,
            ran: ran.into(),
            channels,
            calls: 1,
            forced: forced.map(String::from),
            ..Default::default()
        }
    }

    /// A variant is read back per size from the calls made under its override only: followed,
    /// with its channels; another variant under it, or no call seen, is said and never
    /// taken as the pin.
    #[test]
    fn each_variant_is_read_back_from_the_calls_made_under_its_override() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "audit-1-r0.json",
            0,
            vec![
                rec(None, 1024, "RING/LL", 24),
                rec(Some("RING/LL"), 1024, "Ring/LL", 2),
                rec(Some("RING/LL"), 1024, "RING/LL", 4),
                rec(Some("TREE/SIMPLE"), 1024, "TREE/SIMPLE", 8),
                rec(Some("TREE/SIMPLE"), 4096, "RING/SIMPLE", 8),
            ],
        );
        write(
            d.path(),
            "audit-2-r1.json",
            1,
            vec![rec(Some("TREE/LL"), 1024, "TREE/LL", 2)],
        );
        let r = ReadBack::read(d.path());
        assert_eq!(r.ran(Backend::Nccl, 1024), Ok(24));
        assert_eq!(r.ran(Backend::NcclRingLl, 1024), Ok(4));
        assert_eq!(r.ran(Backend::NcclTreeSimple, 1024), Ok(8));
        assert_eq!(
            r.ran(Backend::NcclTreeSimple, 4096),
            Err("NCCL ran RING/SIMPLE at 4096 bytes where the tuner forced TREE/SIMPLE".into())
        );
        let e = r.ran(Backend::NcclTreeLl, 1024).unwrap_err();
        assert!(
            e.contains("saw no call of nccl_tree_ll"),
            "rank 1's are not read: {e}"
        );
    }

    #[test]
    fn a_library_without_the_setter_is_refused_with_why() {
        let e = Switch::open(Path::new("/nonexistent/libartune.so"))
            .err()
            .unwrap();
        assert!(
            e.starts_with("cannot open /nonexistent/libartune.so"),
            "{e}"
        );
        let libc = Path::new("libc.so.6");
        let e = Switch::open(libc).err().unwrap();
        assert!(e.contains("has no artune_tuner_force"), "{e}");
    }
}
