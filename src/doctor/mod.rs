//! `artune doctor`: the platform settings that make peer-to-peer slow or broken, checked one by
//! one on one node, each with its evidence and what to do.
//!
//! 1. [`facts`] gathers what the node says: the topology (NVML or a model), sysfs (ACS in
//!    config space, IOMMU, BARs), NVML's BAR1 and persistence mode, the kernel command line,
//!    the environment, and (with `--measure`) links read under load and P2P verified by a transfer.
//! 2. [`checks::all`] turns those facts into [`Check`]s. Checks are pure, so fixture sysfs trees
//!    and topology files test every one of them.
//! 3. [`Report::exit_code`] maps the worst status to the README's exit-code table.

pub mod checks;
pub mod facts;
pub mod measure;

use serde::Serialize;

use crate::error::{EXIT_HARDWARE, EXIT_WARNINGS};

/// How one check came out. `Unknown` means it could not be read here (no root, no NVML, a
/// simulated machine); it never changes the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    Unknown,
    Warn,
    Fail,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Unknown => "unknown",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check: what it found (one sentence) and what to do about it (one sentence).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// Stable id for scripts, e.g. "acs".
    pub id: &'static str,
    pub status: Status,
    pub evidence: String,
    pub action: String,
}

impl Check {
    pub fn new(
        id: &'static str,
        status: Status,
        evidence: impl Into<String>,
        action: impl Into<String>,
    ) -> Check {
        Check {
            id,
            status,
            evidence: evidence.into(),
            action: action.into(),
        }
    }

    pub fn ok(id: &'static str, evidence: impl Into<String>) -> Check {
        Check::new(id, Status::Ok, evidence, "nothing to do")
    }
}

/// Every check of one run and what machine they were about.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// "this machine", "simulated preset pcie-2x", "topology file F".
    pub machine: String,
    /// True when the machine is a model: checks then describe the model, not hardware.
    pub simulated: bool,
    /// True when links were read under load and P2P verified by transfers.
    pub measured: bool,
    /// Why `--measure` measured nothing (the GPUs could not be opened), where it was asked.
    pub not_measured: Option<String>,
    pub checks: Vec<Check>,
}

impl Report {
    /// The worst status among the checks.
    pub fn worst(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Ok)
    }

    /// 0 when every check is ok or unknown, [`EXIT_WARNINGS`] for warnings only,
    /// [`EXIT_HARDWARE`] when any check failed.
    pub fn exit_code(&self) -> i32 {
        match self.worst() {
            Status::Ok | Status::Unknown => 0,
            Status::Warn => EXIT_WARNINGS,
            Status::Fail => EXIT_HARDWARE,
        }
    }

    pub fn count(&self, s: Status) -> usize {
        self.checks.iter().filter(|c| c.status == s).count()
    }

    /// The human report: one line per check, what to do under each that is not ok.
    pub fn text(&self) -> String {
        let mut out = format!(
            "artune doctor: {}{}{}\n\n",
            self.machine,
            if self.simulated {
                " (SIMULATED: the checks describe a model, not hardware)"
            } else {
                ""
            },
            match (self.measured, &self.not_measured) {
                (true, _) => ", measured".to_string(),
                (false, Some(why)) => format!(", not measured: {why}"),
                (false, None) => String::new(),
            }
        );
        for (i, c) in self.checks.iter().enumerate() {
            // A check that says what an earlier one said (a model has no PCI config space,
            // NVML could not be read) points to it rather than saying it again.
            let same = self.checks[..i]
                .iter()
                .find(|e| (e.status, &e.evidence, &e.action) == (c.status, &c.evidence, &c.action));
            if let Some(e) = same {
                out.push_str(&format!(
                    "{:<8} {:<12} as {} above\n",
                    c.status.label(),
                    c.id,
                    e.id
                ));
                continue;
            }
            out.push_str(&format!(
                "{:<8} {:<12} {}\n",
                c.status.label(),
                c.id,
                c.evidence
            ));
            if c.status != Status::Ok {
                out.push_str(&format!("{:<8} {:<12} do: {}\n", "", "", c.action));
            }
        }
        out.push_str(&format!(
            "\n{} ok, {} warn, {} fail, {} unknown\n",
            self.count(Status::Ok),
            self.count(Status::Warn),
            self.count(Status::Fail),
            self.count(Status::Unknown)
        ));
        out
    }

    /// The report for machines: every check plus the counts and the exit code.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "machine": self.machine,
            "simulated": self.simulated,
            "measured": self.measured,
            "not_measured": self.not_measured,
            "checks": self.checks,
            "summary": {
                "ok": self.count(Status::Ok),
                "warn": self.count(Status::Warn),
                "fail": self.count(Status::Fail),
                "unknown": self.count(Status::Unknown),
            },
            "exit_code": self.exit_code(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_follows_the_worst_status() {
        let r = |s: &[Status]| Report {
            machine: "m".into(),
            simulated: false,
            measured: false,
            not_measured: None,
            checks: s.iter().map(|&st| Check::new("x", st, "e", "a")).collect(),
        };
        assert_eq!(r(&[]).exit_code(), 0);
        assert_eq!(r(&[Status::Ok, Status::Unknown]).exit_code(), 0);
        assert_eq!(r(&[Status::Ok, Status::Warn]).exit_code(), EXIT_WARNINGS);
        assert_eq!(
            r(&[Status::Fail, Status::Warn, Status::Unknown]).exit_code(),
            EXIT_HARDWARE
        );
        let text = r(&[Status::Ok, Status::Warn]).text();
        assert!(text.contains("do: a"), "{text}");
        assert!(text.contains("1 ok, 1 warn, 0 fail, 0 unknown"), "{text}");
        // What an earlier check said is not said again.
        let repeated = r(&[Status::Unknown, Status::Unknown, Status::Warn]).text();
        assert_eq!(
            repeated.matches("unknown  x            e\n").count(),
            1,
            "{repeated}"
        );
        assert_eq!(repeated.matches("do: a").count(), 2, "{repeated}");
        assert!(
            repeated.contains("unknown  x            as x above\n"),
            "{repeated}"
        );
    }
}
