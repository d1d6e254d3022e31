//! The measuring environment in a profile's summary: what `tune` ran with and `check` compares.

use std::fmt::Write;

use crate::profile::Profile;

/// Lines naming the NCCL/CUDA variables, NCCL library and busy GPUs a profile was measured
/// with; nothing for a profile that predates the record. (The memory budget has its own line
/// in the summary.)
pub fn lines(p: &Profile, out: &mut String) {
    let Some(e) = &p.environment else { return };
    if e.variables.is_empty() {
        let _ = writeln!(
            out,
            "environment: no NCCL or CUDA variable that changes a measurement was set"
        );
    } else {
        let _ = writeln!(
            out,
            "environment: measured with {} (a later check compares them with its own)",
            e.describe()
        );
    }
    let lib = match (&e.nccl_library, &e.nccl_version) {
        (Some(l), Some(v)) if l == v => l.clone(),
        (Some(l), Some(v)) => format!("{l} ({v})"),
        (Some(l), None) => l.clone(),
        (None, Some(v)) => format!("version {v}, path unknown"),
        (None, None) => "unknown".into(),
    };
    let _ = writeln!(out, "NCCL library: {lib}");
    if e.allow_busy {
        let mut who: Vec<String> = e.busy.iter().map(ToString::to_string).collect();
        let later = p.groups.iter().filter(|g| !g.beside.is_empty()).count();
        let at_start = match who.is_empty() {
            true => "no other process at the start".to_string(),
            false => std::mem::take(&mut who).join("; "),
        };
        let since = match later {
            0 => String::new(),
            n => format!(
                "; {n} of {} measured beside other work (each group says which)",
                super::count(p.groups.len(), "group", "groups")
            ),
        };
        let _ = writeln!(
            out,
            "BUSY GPUs allowed (--allow-busy): measured beside other work, {at_start}{since}"
        );
    }
}
