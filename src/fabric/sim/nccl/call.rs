//! What a call of NCCL costs beyond its kernel, by how calls are issued.
//!
//! Calls timed in a row (nccl-tests, a `dist.all_reduce` loop, artune's eager timing) overlap
//! the host's issue of the next call with the kernel running, so an eager call costs the
//! larger of its issue and its kernel plus the gap between kernels, not their sum. On R2's box
//! four GPUs take 13.5 and 13.2 µs at 1 and 4 KB in SGLang's start-up loop (commit d39236a,
//! `find_crossover_size`: eager `dist.all_reduce`, 200 in a row, wall clock) where p2pmark's
//! CUDA graphs take 13.4 and 13.1 µs at 256 B and 4 KB on the same GPUs: the eager path adds
//! nothing there while NCCL's kernel outlasts its issue.

use crate::fabric::Mode;

/// Host issue of one eager NCCL call: our launch plus NCCL's argument and work-FIFO setup, µs.
pub const EAGER_ISSUE_US: f64 = 6.5;

/// The time per call (µs) of an NCCL kernel of `device_us` issued in `mode`, where a graph
/// replays one captured call in `graph_launch_us`.
pub fn per_call_us(device_us: f64, mode: Mode, graph_launch_us: f64) -> f64 {
    let replayed = device_us + graph_launch_us;
    match mode {
        Mode::Graph => replayed,
        Mode::Eager => replayed.max(EAGER_ISSUE_US),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eager_call_costs_its_issue_only_where_the_kernel_is_shorter() {
        // A kernel that outlasts its issue: eager costs what a replay does.
        assert_eq!(per_call_us(12.0, Mode::Eager, 1.5), 13.5);
        assert_eq!(per_call_us(12.0, Mode::Graph, 1.5), 13.5);
        // One shorter than its issue: the host sets the pace.
        assert_eq!(per_call_us(2.0, Mode::Eager, 1.5), EAGER_ISSUE_US);
        assert_eq!(per_call_us(2.0, Mode::Graph, 1.5), 3.5);
    }
}
