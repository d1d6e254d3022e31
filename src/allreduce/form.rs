//! Which form of a custom kernel a mode runs: staged (the kernel copies the caller's tensors
//! through its shared buffers) or registered (graph mode, peers read and write the caller's
//! own tensors, mapped once after capture). The profile records it per group and mode, so an
//! engine knows what the times it follows assume.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Backend, Mode};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// Staged through the shared buffers inside the kernel: what every eager call runs.
    Staged,
    /// The registered form: nothing staged; an engine calls `register_graph_buffers()` after
    /// capturing, and a replay before it returns NaN.
    Registered,
}

impl Form {
    /// The form artune's CUDA kernels run for `backend` in `mode`: registered in graph mode
    /// where the backend has that form, staged otherwise; None for NCCL.
    pub fn runs(backend: Backend, mode: Mode) -> Option<Form> {
        match (backend.is_custom(), mode) {
            (false, _) => None,
            (true, Mode::Graph) if backend.has_registered_form() => Some(Form::Registered),
            (true, _) => Some(Form::Staged),
        }
    }

    pub fn id(self) -> &'static str {
        match self {
            Form::Staged => "staged",
            Form::Registered => "registered",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eager_calls_stage_and_graph_mode_runs_the_registered_form_where_there_is_one() {
        for b in Backend::ALL {
            let eager = Form::runs(b, Mode::Eager);
            let graph = Form::runs(b, Mode::Graph);
            match b.is_custom() {
                false => assert_eq!((eager, graph), (None, None), "{b}"),
                true => {
                    assert_eq!(eager, Some(Form::Staged), "{b}");
                    let want = match b.has_registered_form() {
                        true => Form::Registered,
                        false => Form::Staged,
                    };
                    assert_eq!(graph, Some(want), "{b}");
                }
            }
        }
        // The island kernels too: the tune times their registered form in graph mode.
        for b in [
            Backend::OneStagePull,
            Backend::IslandTwoShot,
            Backend::IslandOneShot,
        ] {
            assert_eq!(Form::runs(b, Mode::Graph), Some(Form::Registered), "{b}");
            assert_eq!(Form::runs(b, Mode::Eager), Some(Form::Staged), "{b}");
        }
    }
}
