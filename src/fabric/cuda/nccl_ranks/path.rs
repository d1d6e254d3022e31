//! Where K ranks of NCCL can run on this machine: the one rule the tune's NCCL measurement,
//! its channel timing and `check --nccl-audit` share, a pure function of what they read (the
//! NCCL version, the user's `NCCL_MULTI_RANK_GPU_ENABLE`, the GPU count).

/// The first NCCL that runs several ranks of one communicator on one GPU (2.30, with
/// `NCCL_MULTI_RANK_GPU_ENABLE=1`; the H200 run of 2026-12-04 ran 2 and 4 on 2.32.6).
pub const MULTI_RANK_GPU: i32 = 23000;

/// The variable that lets NCCL put several ranks on one GPU.
pub const ENV_MULTI_RANK: &str = "NCCL_MULTI_RANK_GPU_ENABLE";

/// How K ranks run, or why they cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankPath {
    /// One rank per GPU, on GPUs `0..k` of the group.
    PerGpu,
    /// Every rank on one GPU, in a process of its own, with the multi-rank variable set.
    Shared,
    /// NCCL cannot run them here: why, in words a waiver or an error ends with.
    Waived(String),
}

/// How `k` ranks of NCCL `version` (its `ncclGetVersion` code) run on `gpus` GPUs, given the
/// user's `NCCL_MULTI_RANK_GPU_ENABLE` (`multi_rank`: None where unset; a user who set it to 0
/// asked NCCL for one rank per GPU, so the tune does not override it).
pub fn path(version: i32, multi_rank: Option<&str>, gpus: usize, k: usize) -> RankPath {
    if k <= gpus {
        return RankPath::PerGpu;
    }
    let v = super::super::nccl::version_string(version);
    if version < MULTI_RANK_GPU {
        return RankPath::Waived(format!(
            "{k} ranks need {k} GPUs and this machine has {gpus}; NCCL {v} cannot put several \
             ranks on one GPU (2.30 or later can, with {ENV_MULTI_RANK}=1), so set \
             ARTUNE_NCCL_LIB to a newer libnccl.so.2"
        ));
    }
    match multi_rank.map(str::trim) {
        Some("0") => RankPath::Waived(format!(
            "{k} ranks need {k} GPUs and this machine has {gpus}; {ENV_MULTI_RANK}=0 keeps NCCL \
             {v} to one rank per GPU, so unset it"
        )),
        _ => RankPath::Shared,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enough_gpus_take_one_rank_each_whatever_the_version() {
        assert_eq!(path(21800, None, 8, 8), RankPath::PerGpu);
        assert_eq!(path(23206, Some("0"), 4, 2), RankPath::PerGpu);
    }

    #[test]
    fn fewer_gpus_share_one_from_2_30_unless_the_user_said_no() {
        assert_eq!(path(23000, None, 1, 4), RankPath::Shared);
        assert_eq!(path(23206, Some("1"), 1, 2), RankPath::Shared);
        let RankPath::Waived(w) = path(23206, Some("0"), 1, 2) else {
            panic!("a user's 0 is kept")
        };
        assert!(
            w.contains("has 1; NCCL_MULTI_RANK_GPU_ENABLE=0 keeps NCCL 2.32.6"),
            "{w}"
        );
    }

    #[test]
    fn older_nccl_cannot_share_a_gpu_and_says_why() {
        let RankPath::Waived(w) = path(22907, None, 1, 2) else {
            panic!("2.29 cannot share a GPU")
        };
        assert!(
            w.starts_with("2 ranks need 2 GPUs and this machine has 1; NCCL 2.29.7 cannot"),
            "{w}"
        );
    }
}
