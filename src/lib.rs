//! artune: a topology-aware allreduce autotuner.
//!
//! Data flows one way: [`topology`] → [`measure`] (through a [`fabric::Fabric`]) → [`decide`]
//! → [`profile`] → consumers ([`export`], [`capi`], [`plugin`], [`report`], [`fleet`]).
//! [`doctor`] checks the platform beneath the topology (ACS, IOMMU, BAR1, links).

pub mod allreduce;
pub mod cancel;
pub mod capi;
pub mod cli;
pub mod compare;
pub mod decide;
pub mod doctor;
pub mod error;
pub mod export;
pub mod fabric;
pub mod fleet;
pub mod measure;
pub mod plan;
pub mod plugin;
pub mod profile;
#[cfg(feature = "python")]
mod python;
pub mod recheck;
pub mod report;
pub mod results;
pub mod shell;
pub mod stats;
pub mod topology;
pub mod tune;
pub mod units;
pub mod workload;

pub use allreduce::{Backend, Dtype, Mode};
pub use error::{Error, Result};
pub use profile::{Profile, Query, Selection};
