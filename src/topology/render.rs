//! Text rendering of a topology (in progress).
use super::Topology;

/// The `artune topo` text view.
pub fn text(t: &Topology) -> String {
    format!("{} GPUs\n", t.gpu_count())
}
