//! Walking the PCIe tree: a GPU's ancestry, the path class and NVLinks between two GPUs, and
//! the islands GPUs form under their switches.

use super::*;

impl Topology {
    /// Nodes from a GPU up to its root complex: [Gpu, Switch.., RootComplex].
    pub fn ancestry(&self, gpu: usize) -> Vec<Node<'_>> {
        let mut out = vec![Node::Gpu(gpu)];
        let Some(g) = self.gpus.get(gpu) else {
            return out;
        };
        let mut cur = g.parent.as_str();
        // Bounded by the number of switches: a cycle in a hostile file cannot loop forever.
        for _ in 0..=self.switches.len() {
            if let Some(s) = self.switch(cur) {
                out.push(Node::Switch(&s.id));
                cur = &s.parent;
            } else {
                if let Some(r) = self.root_complex(cur) {
                    out.push(Node::RootComplex(&r.id));
                }
                break;
            }
        }
        out
    }

    /// Root complex a GPU sits under.
    pub fn root_of(&self, gpu: usize) -> Option<&RootComplex> {
        match self.ancestry(gpu).last() {
            Some(Node::RootComplex(id)) => self.root_complex(id),
            _ => None,
        }
    }

    /// Socket of a GPU, through its root complex.
    pub fn socket_of(&self, gpu: usize) -> Option<u32> {
        self.root_of(gpu).map(|r| r.socket)
    }

    /// PCIe path class between two GPUs derived from the tree (ignores NVLink).
    pub fn pcie_path(&self, a: usize, b: usize) -> PathClass {
        if a == b {
            return PathClass::X;
        }
        self.path_between(&self.ancestry(a), &self.ancestry(b))
    }

    /// Path class from two GPUs' ancestries (see [`Topology::ancestry`]); callers that classify
    /// every pair compute each ancestry once.
    pub(super) fn path_between(&self, pa: &[Node<'_>], pb: &[Node<'_>]) -> PathClass {
        // Lowest common ancestor among switches.
        let common_switch = pa
            .iter()
            .skip(1)
            .position(|n| matches!(n, Node::Switch(_)) && pb.contains(n));
        if let Some(i) = common_switch {
            // Switches crossed below the common one on both sides.
            let below_a = i; // switches between GPU a and the common switch
            let below_b = pb.iter().skip(1).position(|n| *n == pa[i + 1]).unwrap_or(0);
            return if below_a + below_b == 0 {
                PathClass::PIX
            } else {
                PathClass::PXB
            };
        }
        let socket = |anc: &[Node<'_>]| match anc.last() {
            Some(Node::RootComplex(id)) => self.root_complex(id).map(|r| r.socket),
            _ => None,
        };
        match (pa.last(), pb.last()) {
            (Some(ra @ Node::RootComplex(_)), Some(rb)) if ra == rb => PathClass::PHB,
            _ => {
                if socket(pa).is_some() && socket(pa) == socket(pb) {
                    PathClass::NODE
                } else {
                    PathClass::SYS
                }
            }
        }
    }

    /// Number of active NVLinks from `a` that reach `b` (directly or through NVSwitch).
    pub fn nvlinks_between(&self, a: usize, b: usize) -> u32 {
        if a == b {
            return 0;
        }
        let Some(g) = self.gpus.get(a) else { return 0 };
        let direct = g
            .nvlinks
            .iter()
            .filter(|l| l.active && l.remote_gpu == Some(b))
            .count() as u32;
        if direct > 0 {
            return direct;
        }
        if self.nvswitch.is_some() {
            let bl = self
                .gpus
                .get(b)
                .map(|g| g.nvlinks.iter().filter(|l| l.active).count());
            let al = g
                .nvlinks
                .iter()
                .filter(|l| l.active && l.remote_gpu.is_none())
                .count();
            return al.min(bl.unwrap_or(0)) as u32;
        }
        0
    }

    /// Islands: GPUs grouped by the switch (or root port) directly above them. GPUs in one
    /// island talk without crossing an uplink.
    pub fn islands(&self) -> Vec<Vec<usize>> {
        let mut by_parent: Vec<(String, Vec<usize>)> = Vec::new();
        for g in &self.gpus {
            let key = match self.switch(&g.parent) {
                Some(s) => s.id.clone(),
                None => format!("rc:{}:{}", g.parent, g.index),
            };
            match by_parent.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(g.index),
                None => by_parent.push((key, vec![g.index])),
            }
        }
        by_parent.into_iter().map(|(_, v)| v).collect()
    }
}
