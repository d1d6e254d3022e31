//! The measuring environment in a profile's summary: what `tune` ran with and `check` compares.

use std::fmt::Write;

use crate::profile::Profile;
use crate::units::fmt_bytes;

/// Lines naming the NCCL/CUDA variables, NCCL library, memory budget and busy GPUs a profile
/// was measured with; nothing for a profile that predates the record.
pub fn lines(p: &Profile, out: &mut String) {
    if let Some(b) = p.settings.mem_budget_bytes {
        let _ = writeln!(
            out,
            "memory budget: {} per GPU (--mem-budget)",
            fmt_bytes(b)
        );
    }
    let Some(e) = &p.environment else { return };
    if e.variables.is_empty() {
        let _ = writeln!(
            out,
            "environment: no NCCL or CUDA variable that changes a measurement was set"
        );
    } else {
        let _ = writeln!(
            out,
            "environment: measured with {} (`artune check` names any that differ)",
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
        let who = if e.busy.is_empty() {
            "no other process was found".to_string()
        } else {
            e.busy
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        };
        let _ = writeln!(
            out,
            "BUSY GPUs allowed (--allow-busy): measured beside other work, {who}"
        );
    }
}
