//! Two hashes that say whether a profile still fits a machine.
//!
//! The topology-class hash covers the wiring only (GPU models, link generations and widths,
//! the switch tree, path classes), so identical boxes in a fleet share it. The host hash adds
//! what makes one box and its software unique: GPU UUIDs, driver, CUDA and NCCL versions.

use super::Topology;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// Per GPU: name, compute capability, GiB, PCIe generation and width, parent, active NVLinks.
type GpuView = (
    String,
    Option<String>,
    Option<u64>,
    Option<u8>,
    Option<u8>,
    usize,
    usize,
);
/// Per switch: vendor, device, uplink generation and width, parent.
type SwitchView<'a> = (
    Option<&'a str>,
    Option<&'a str>,
    Option<u8>,
    Option<u8>,
    usize,
);

#[derive(Serialize)]
struct ClassView<'a> {
    gpus: Vec<GpuView>,
    switches: Vec<SwitchView<'a>>,
    root_complex_sockets: Vec<u32>,
    sockets: usize,
    nvswitch: Option<u32>,
    pairs: Vec<(usize, usize, String)>,
}

fn hash(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    let hex: String = d.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl Topology {
    /// Hash of the wiring: same layout → same hash, whatever the UUIDs and bus ids.
    pub fn class_hash(&self) -> String {
        // Node ids are names a file or sysfs chose; positions are what identify layout.
        let node_pos = |id: &str| -> usize {
            self.switches
                .iter()
                .position(|s| s.id == id)
                .map(|p| p + 1)
                .or_else(|| {
                    self.root_complexes
                        .iter()
                        .position(|r| r.id == id)
                        .map(|p| 10_000 + p)
                })
                .unwrap_or(0)
        };
        let view = ClassView {
            gpus: self
                .gpus
                .iter()
                .map(|g| {
                    (
                        g.name.clone(),
                        g.compute_capability.map(|c| c.to_string()),
                        // GiB: drivers report slightly different totals for the same board.
                        g.memory_bytes.map(|m| m >> 30),
                        g.pcie.max_gen.or(g.pcie.gen),
                        g.pcie.max_width.or(g.pcie.width),
                        node_pos(&g.parent),
                        g.nvlinks.iter().filter(|l| l.active).count(),
                    )
                })
                .collect(),
            switches: self
                .switches
                .iter()
                .map(|s| {
                    (
                        s.vendor.as_deref(),
                        s.device.as_deref(),
                        s.uplink.max_gen.or(s.uplink.gen),
                        s.uplink.max_width.or(s.uplink.width),
                        node_pos(&s.parent),
                    )
                })
                .collect(),
            root_complex_sockets: self.root_complexes.iter().map(|r| r.socket).collect(),
            sockets: self.sockets.len(),
            nvswitch: self.nvswitch.as_ref().map(|n| n.generation),
            pairs: self
                .pairs
                .iter()
                .map(|p| (p.from, p.to, p.path.label(p.nvlinks)))
                .collect(),
        };
        hash(&serde_json::to_vec(&view).unwrap_or_default())
    }

    /// Hash of this very host: the class plus GPU UUIDs and software versions.
    pub fn host_hash(&self) -> String {
        let uuids: Vec<Option<&str>> = self.gpus.iter().map(|g| g.uuid.as_deref()).collect();
        let view = (
            self.class_hash(),
            uuids,
            &self.host.driver,
            &self.host.cuda,
            &self.host.nccl,
        );
        hash(&serde_json::to_vec(&view).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use crate::topology::presets;

    #[test]
    fn class_hash_ignores_uuids_and_bus_ids() {
        let a = presets::get("pcie-8x-2switch").unwrap();
        let mut b = a.clone();
        b.gpus[3].uuid = Some("GPU-other".into());
        b.gpus[3].bus_id = Some("0000:99:00.0".into());
        assert_eq!(a.class_hash(), b.class_hash());
        assert_ne!(a.host_hash(), b.host_hash());
    }

    #[test]
    fn class_hash_sees_wiring() {
        let a = presets::get("pcie-8x-2switch").unwrap();
        let b = presets::get("pcie-8x-direct-2socket").unwrap();
        assert_ne!(a.class_hash(), b.class_hash());
        let mut c = a.clone();
        c.gpus[0].pcie.max_width = Some(8);
        assert_ne!(a.class_hash(), c.class_hash());
        // The generation a link trained at is not wiring (idle GPUs lower it); its maximum is.
        let mut d = a.clone();
        d.gpus[0].pcie.gen = Some(4);
        assert_eq!(a.class_hash(), d.class_hash());
        d.gpus[0].pcie.max_gen = Some(4);
        assert_ne!(a.class_hash(), d.class_hash());
    }

    #[test]
    fn host_hash_sees_driver() {
        let a = presets::get("pcie-2x").unwrap();
        let mut b = a.clone();
        b.host.driver = Some("999.1".into());
        assert_eq!(a.class_hash(), b.class_hash());
        assert_ne!(a.host_hash(), b.host_hash());
    }
}
