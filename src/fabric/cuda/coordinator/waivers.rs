//! Backends a group cannot run whatever the workers say: pinned LL128 where NCCL would not
//! enable it, and custom kernels on GPUs that cannot share one launch plan.

use crate::fabric::cuda::driver::DeviceFacts;
use crate::fabric::{Backend, NcclProto};
use crate::topology::Topology;

/// Set to 1 to measure NCCL's LL128 protocol on groups where NCCL would not enable it itself.
const ENV_NCCL_LL128: &str = "ARTUNE_NCCL_LL128";

/// LL128 relies on 128-byte stores arriving whole, which NCCL only trusts on NVLink between
/// Volta, Ampere and Hopper GPUs: it enables the protocol by default only there, and forcing it
/// elsewhere can corrupt data. A pinned LL128 backend is waived on other groups, unless
/// `ARTUNE_NCCL_LL128=1` asks for it.
pub(super) fn ll128_waiver(b: Backend, t: &Topology, gpus: &[usize]) -> Option<String> {
    if b.nccl_pin().map(|p| p.1) != Some(NcclProto::LL128)
        || std::env::var(ENV_NCCL_LL128).is_ok_and(|v| v == "1")
    {
        return None;
    }
    ll128_unsafe(t, gpus).map(|why| {
        format!("NCCL enables LL128 only on NVLink between sm_70/80/90 GPUs and {why}; set {ENV_NCCL_LL128}=1 to measure it anyway")
    })
}

/// Why NCCL would not enable LL128 on `gpus` of `t`, or None when it would.
fn ll128_unsafe(t: &Topology, gpus: &[usize]) -> Option<String> {
    for &g in gpus {
        let cc = t.gpus.get(g)?.compute_capability.as_ref();
        if !cc.is_some_and(|c| c.minor == 0 && (7..=9).contains(&c.major)) {
            return Some(format!("GPU {g} is not sm_70/80/90"));
        }
    }
    for &a in gpus {
        for &b in gpus {
            if a != b && t.pair(a, b).is_none_or(|p| p.nvlinks == 0) {
                return Some(format!("GPUs {a} and {b} are not joined by NVLink"));
            }
        }
    }
    None
}

/// The one-plan rule: every rank of a group must launch the same grid (the kernels' barriers
/// pair blocks across ranks), and each worker sizes its grid from its GPU's multiprocessors and
/// compute capability. Groups whose launching GPUs differ in either waive the custom kernels.
pub(super) fn unlike(gpus: &[&DeviceFacts]) -> Option<String> {
    let first = gpus.first()?;
    let other = gpus
        .iter()
        .find(|g| g.sms != first.sms || g.cc != first.cc || g.name != first.name)?;
    Some(format!(
        "the group mixes unlike GPUs ({}, {} SMs, sm_{}{} and {}, {} SMs, sm_{}{}); custom kernels need one launch plan, the same grid on every rank",
        first.name, first.sms, first.cc.0, first.cc.1, other.name, other.sms, other.cc.0, other.cc.1
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(name: &str, sms: u32, cc: (u32, u32)) -> DeviceFacts {
        DeviceFacts {
            ordinal: 0,
            name: name.into(),
            cc,
            sms,
            total_mem: 1 << 30,
            bus_id: "0000:00:06.0".into(),
        }
    }

    #[test]
    fn ll128_only_where_nccl_would_enable_it() {
        use crate::topology::ComputeCapability;
        let mut t = crate::topology::presets::get("pcie-8x-2switch").unwrap();
        for g in &mut t.gpus {
            g.compute_capability = Some(ComputeCapability { major: 9, minor: 0 });
        }
        let why = ll128_unsafe(&t, &[0, 1]).unwrap();
        assert!(
            why.contains("GPUs 0 and 1 are not joined by NVLink"),
            "{why}"
        );
        for p in &mut t.pairs {
            p.nvlinks = 4;
        }
        assert_eq!(ll128_unsafe(&t, &[0, 1]), None);
        t.gpus[1].compute_capability = Some(ComputeCapability { major: 8, minor: 9 });
        assert!(ll128_unsafe(&t, &[0, 1])
            .unwrap()
            .contains("GPU 1 is not sm_70/80/90"));
        assert_eq!(ll128_waiver(Backend::NcclRingLl, &t, &[0, 1]), None);
        let w = ll128_waiver(Backend::NcclTreeLl128, &t, &[0, 1]).unwrap();
        assert!(w.contains("ARTUNE_NCCL_LL128=1"), "{w}");
    }

    #[test]
    fn unlike_gpus_get_no_custom_kernels() {
        let h200 = gpu("NVIDIA H200", 132, (9, 0));
        let h100 = gpu("NVIDIA H100 PCIe", 114, (9, 0));
        assert_eq!(unlike(&[&h200, &h200.clone()]), None);
        assert_eq!(unlike(&[]), None);
        let why = unlike(&[&h200, &h200, &h100]).unwrap();
        assert!(
            why.contains("NVIDIA H200, 132 SMs, sm_90 and NVIDIA H100 PCIe, 114 SMs, sm_90"),
            "{why}"
        );
        assert!(why.contains("one launch plan"), "{why}");
        let l40 = gpu("NVIDIA H200", 132, (8, 9));
        assert!(unlike(&[&h200, &l40]).is_some());
    }
}
