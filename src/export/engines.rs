//! How each released engine dispatches an allreduce: the one description `artune why`, the
//! exports and the engine plugins share. It lives in `python/artune/engines.json`, which the
//! Python package ships and reads as it is; Rust embeds the same file, so the two cannot drift.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

use crate::topology::ComputeCapability;

const JSON: &str = include_str!("../../python/artune/engines.json");

/// Per compute capability ("9.0"), per world size ("8"): bytes.
type Table = BTreeMap<String, BTreeMap<String, u64>>;
/// Per mode ("graph", "eager"): an inclusive byte range, or none.
type Ranges = BTreeMap<String, Option<(u64, u64)>>;

#[derive(Debug, Deserialize)]
pub struct Engines {
    pub vllm: Vllm,
    pub sglang: Sglang,
}

/// One allreduce path of an engine, in the engine's dispatch order.
#[derive(Debug, Deserialize)]
pub struct PathRow {
    pub path: String,
    pub picked_by: String,
    pub plugin: String,
}

#[derive(Debug, Deserialize)]
pub struct Vllm {
    pub read_against: String,
    pub order: Vec<PathRow>,
    pub flashinfer_world_sizes: Vec<usize>,
    /// FlashInfer's standalone allreduce takes a message up to this size (inclusive).
    flashinfer_max_bytes: Table,
    /// The fusion pass replaces allreduce+RMSNorm up to this size.
    fusion_max_bytes: Table,
    /// CUSTOM_ALL_REDUCE_MAX_SIZES, while symmetric memory is on (the default).
    custom_max_bytes: Table,
    /// SYMM_MEM_ALL_REDUCE_MAX_SIZES.
    symm_mem_max_bytes: Table,
    pub custom_default_max_bytes: u64,
    /// CustomAllreduce._SUPPORTED_WORLD_SIZES.
    pub custom_world_sizes: Vec<usize>,
    /// Per world size: its kernel runs one-stage below this size, two-stage from it
    /// (csrc/custom_all_reduce.cuh); a world size not listed always runs two-stage.
    custom_one_stage_below_bytes: BTreeMap<String, u64>,
    /// The staging buffer is as large as the largest custom all-reduce, all-gather
    /// (_DEFAULT_ALL_GATHER_MAX_SIZE) or reduce-scatter (_DEFAULT_REDUCE_SCATTER_MAX_SIZE).
    custom_all_gather_default_bytes: u64,
    custom_reduce_scatter_default_bytes: u64,
    /// The registered-pointer table (`rank_data`).
    custom_rank_data_bytes: u64,
    /// SymmMemCommunicator._WORLD_SIZES_MULTIMEM: multimem there, torch two-shot elsewhere.
    symm_mem_multimem_world_sizes: BTreeMap<String, Vec<usize>>,
}

#[derive(Debug, Deserialize)]
pub struct Sglang {
    pub read_against: String,
    pub order: Vec<PathRow>,
    pub v2_workspace_bytes: u64,
    pub v1_max_bytes: u64,
    /// FlashInfer's allreduce workspace on a tagged group holds this many tokens
    /// (FUSE_ALLREDUCE_MAX_BATCH_SIZE); a larger message goes down SGLang's order.
    pub flashinfer_max_tokens: u64,
    /// Per SGLang architecture table, world size, mode: the inclusive multicast range.
    v2_multicast: BTreeMap<String, BTreeMap<String, Ranges>>,
}

/// The embedded model. Parsing it is tested (`the_model_parses`), so a broken file fails CI
/// rather than an engine.
pub fn model() -> &'static Engines {
    static M: OnceLock<Engines> = OnceLock::new();
    M.get_or_init(|| serde_json::from_str(JSON).expect("python/artune/engines.json parses"))
}

fn key(c: ComputeCapability) -> String {
    format!("{}.{}", c.major, c.minor)
}

fn lookup(t: &Table, cap: Option<ComputeCapability>, n: usize) -> Option<u64> {
    t.get(&key(cap?))?.get(&n.to_string()).copied()
}

impl Vllm {
    /// The largest message FlashInfer's standalone allreduce takes on this capability and world
    /// size, or None where vLLM does not build it.
    pub fn flashinfer_max(&self, cap: Option<ComputeCapability>, n: usize) -> Option<u64> {
        if !self.flashinfer_world_sizes.contains(&n) {
            return None;
        }
        lookup(&self.flashinfer_max_bytes, cap, n)
    }

    /// FlashInfer's limit on its trtllm backend, which vLLM runs on one node under HiSparse
    /// (or with VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm): the fusion table, without MNNVL's
    /// tuned standalone size.
    pub fn flashinfer_max_trtllm(&self, cap: Option<ComputeCapability>, n: usize) -> Option<u64> {
        if !self.flashinfer_world_sizes.contains(&n) {
            return None;
        }
        lookup(&self.fusion_max_bytes, cap, n)
    }

    /// The largest message the fusion pass fuses, or None where vLLM does not run it.
    pub fn fusion_max(&self, cap: Option<ComputeCapability>, n: usize) -> Option<u64> {
        lookup(&self.fusion_max_bytes, cap, n)
    }

    /// Custom all-reduce's exclusive limit: the capability's table, capped by max_size.
    pub fn custom_max(&self, cap: Option<ComputeCapability>, n: usize) -> u64 {
        lookup(&self.custom_max_bytes, cap, n)
            .unwrap_or(self.custom_default_max_bytes)
            .min(self.custom_default_max_bytes)
    }

    /// Whether custom all-reduce's kernel runs one-stage for `bytes` on `n` GPUs.
    pub fn custom_one_stage(&self, n: usize, bytes: u64) -> bool {
        self.custom_one_stage_below_bytes
            .get(&n.to_string())
            .is_some_and(|&below| bytes < below)
    }

    /// Device memory custom all-reduce allocates per GPU at this message limit: metadata and
    /// scratch (the limit), the staging buffer, and the rank-data table (custom_all_reduce.py).
    pub fn custom_buffer_bytes(&self, max_size: u64) -> u64 {
        let staging = max_size
            .max(self.custom_all_gather_default_bytes)
            .max(self.custom_reduce_scatter_default_bytes);
        max_size + staging + self.custom_rank_data_bytes
    }

    /// Whether torch symmetric memory runs multimem (else two-shot) on this GPU and world size.
    pub fn symm_mem_multimem(&self, cap: Option<ComputeCapability>, n: usize) -> bool {
        cap.and_then(|c| self.symm_mem_multimem_world_sizes.get(&key(c)))
            .is_some_and(|w| w.contains(&n))
    }

    /// Symmetric memory's exclusive limit, or None without an entry.
    pub fn symm_mem_max(&self, cap: Option<ComputeCapability>, n: usize) -> Option<u64> {
        lookup(&self.symm_mem_max_bytes, cap, n)
    }
}

impl Sglang {
    /// The largest size any of v2's multicast ranges reaches: no v2 limit goes above it.
    pub fn largest_range(&self) -> u64 {
        self.v2_multicast
            .values()
            .flat_map(|w| w.values())
            .flat_map(|m| m.values())
            .filter_map(|r| r.map(|(_, hi)| hi))
            .max()
            .unwrap_or(self.v2_workspace_bytes)
    }

    /// SGLang's multicast range (inclusive) for this GPU, world size and mode.
    pub fn multicast(
        &self,
        cap: Option<ComputeCapability>,
        n: usize,
        graph: bool,
    ) -> Option<(u64, u64)> {
        let c = cap?;
        let arch = match (c.major, c.minor) {
            (9, _) => "9.0",
            (10, m) if m < 7 => "10.0",
            (10, _) => "10.7",
            _ => return None,
        };
        *self
            .v2_multicast
            .get(arch)?
            .get(&n.to_string())?
            .get(if graph { "graph" } else { "eager" })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(major: u32, minor: u32) -> Option<ComputeCapability> {
        Some(ComputeCapability { major, minor })
    }

    #[test]
    fn the_model_parses_and_holds_the_released_tables() {
        let m = model();
        assert_eq!(m.vllm.read_against, "0.34.0");
        assert_eq!(m.sglang.read_against, "0.5.23");
        // vLLM 0.34.0: FlashInfer takes up to 512 KiB on H200 TP8, 64 MiB at TP2, 128 MiB on
        // B200 TP8 (MNNVL); custom all-reduce stops at 256 KiB on H200 TP8.
        assert_eq!(m.vllm.flashinfer_max(cap(9, 0), 8), Some(512 << 10));
        assert_eq!(m.vllm.flashinfer_max(cap(9, 0), 2), Some(64 << 20));
        assert_eq!(m.vllm.flashinfer_max(cap(10, 0), 8), Some(128 << 20));
        assert_eq!(m.vllm.flashinfer_max(cap(8, 0), 8), None);
        assert_eq!(m.vllm.flashinfer_max(cap(9, 0), 6), None);
        assert_eq!(m.vllm.custom_max(cap(9, 0), 8), 256 << 10);
        assert_eq!(m.vllm.custom_max(cap(8, 0), 8), 8 << 20);
        assert_eq!(
            m.sglang.multicast(cap(9, 0), 8, true),
            Some((512 << 10, 128 << 20))
        );
        assert_eq!(m.sglang.multicast(cap(9, 0), 2, true), None);
        assert_eq!(
            m.sglang.multicast(cap(10, 3), 8, false),
            Some((0, 128 << 20))
        );
        assert_eq!(m.sglang.multicast(cap(8, 0), 8, false), None);
        assert!(m.vllm.order.iter().any(|r| r.path == "flashinfer"));
        // custom_all_reduce.cuh: one-stage on a pair, below 512 KiB on 4 GPUs, 256 KiB on 8.
        assert!(m.vllm.custom_one_stage(2, 4 << 20));
        assert!(m.vllm.custom_one_stage(4, 256 << 10) && !m.vllm.custom_one_stage(4, 512 << 10));
        assert!(!m.vllm.custom_one_stage(8, 256 << 10) && !m.vllm.custom_one_stage(16, 1024));
        // H200 TP8: max_size 256 KiB, the 16 MiB reduce-scatter staging, 8 MiB rank data.
        assert_eq!(
            m.vllm.custom_buffer_bytes(256 << 10),
            (256 << 10) + (24 << 20)
        );
        assert!(m.vllm.symm_mem_multimem(cap(9, 0), 4) && !m.vllm.symm_mem_multimem(cap(10, 0), 4));
        assert_eq!(m.sglang.largest_range(), 128 << 20);
    }
}
