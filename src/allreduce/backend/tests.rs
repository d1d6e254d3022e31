use super::*;

#[test]
fn the_table_is_in_backend_order_and_ids_match_serde() {
    for (i, s) in TABLE.iter().enumerate() {
        assert_eq!(s.backend as usize, i, "{} is out of place", s.id);
        assert_eq!(Backend::from_id(s.id), Some(s.backend));
        assert_eq!(
            serde_json::to_string(&s.backend).unwrap(),
            format!("\"{}\"", s.id)
        );
    }
}

#[test]
fn entries_agree_with_themselves() {
    for s in &TABLE {
        let b = s.backend;
        // A kernel exactly where one SM kernel runs it, buffers exactly where not NCCL,
        // and phases exactly where not NCCL.
        assert_eq!(s.kernel.is_some(), s.executor == Executor::SmKernel, "{b}");
        assert_eq!(s.buffers.is_some(), b.is_custom(), "{b}");
        assert_eq!(b.phases().is_empty(), b.is_nccl(), "{b}");
        assert_eq!(s.plane == Plane::Nccl, b.is_nccl(), "{b}");
        // Island phases only in hierarchical schedules, and every hierarchical schedule
        // crosses between islands.
        let islands = b
            .phases()
            .iter()
            .any(|p| p.peers != Peers::All || p.part == Part::IslandShard);
        assert_eq!(islands, b.is_hierarchical(), "{b}");
        if b.is_hierarchical() {
            assert!(b.phases().iter().any(|p| p.peers == Peers::Counterparts));
            assert!(!b.engines_have(), "{b}: no engine has an island schedule");
        }
        // Every schedule ends with every GPU holding the whole sum: the last phase covers
        // the message or gathers it.
        if let Some(last) = b.phases().last() {
            assert!(last.part == Part::Message || !last.reduces, "{b}");
        }
    }
}
