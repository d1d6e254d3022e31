use super::*;
use crate::allreduce::Mode;
use crate::export::sample;

/// Offsets of NCCL's profiler_v5.h/v6.h descriptor (LP64): type, parentObj, rank, then the
/// union (8-aligned); in `coll`: seqNumber, func, sendBuff, recvBuff, count, root,
/// datatype, nChannels, nWarps, algo, proto, parentGroup.
#[test]
fn descriptor_layout_matches_the_headers() {
    use std::mem::offset_of;
    assert_eq!(
        (
            offset_of!(EventDescr, kind),
            offset_of!(EventDescr, parent_obj),
            offset_of!(EventDescr, rank),
            offset_of!(EventDescr, coll)
        ),
        (0, 8, 16, 24)
    );
    let c = [
        offset_of!(CollDescr, seq_number),
        offset_of!(CollDescr, func),
        offset_of!(CollDescr, send_buff),
        offset_of!(CollDescr, recv_buff),
        offset_of!(CollDescr, count),
        offset_of!(CollDescr, root),
        offset_of!(CollDescr, datatype),
        offset_of!(CollDescr, n_channels),
        offset_of!(CollDescr, n_warps),
        offset_of!(CollDescr, algo),
        offset_of!(CollDescr, proto),
        offset_of!(CollDescr, parent_group),
    ];
    assert_eq!(c, [0, 8, 16, 24, 32, 40, 48, 56, 57, 64, 72, 80]);
    assert_eq!(std::mem::size_of::<Profiler<EventDescr>>(), 6 * 8);
}

/// Offsets of NCCL's profiler_v7.h descriptor (LP64), derived from the header by hand:
/// `coll` keeps v6's members at v6's offsets, then kernelVariant (88), isSymColl (96),
/// userTag (104, 8-aligned); at 112 bytes it is the union's largest member (ceColl 96,
/// p2p and collApi 56, kernelPhase 24), so the descriptor is 24 + 112 bytes.
#[test]
fn v7_descriptor_layout_matches_the_header() {
    use std::mem::{offset_of, size_of};
    assert_eq!(
        (
            offset_of!(EventDescrV7, kind),
            offset_of!(EventDescrV7, parent_obj),
            offset_of!(EventDescrV7, rank),
            offset_of!(EventDescrV7, coll)
        ),
        (0, 8, 16, 24)
    );
    let v6 = offset_of!(CollDescrV7, v6);
    let read = [
        v6 + offset_of!(CollDescr, func),
        v6 + offset_of!(CollDescr, count),
        v6 + offset_of!(CollDescr, datatype),
        v6 + offset_of!(CollDescr, n_channels),
        v6 + offset_of!(CollDescr, algo),
        v6 + offset_of!(CollDescr, proto),
    ];
    assert_eq!(read, [8, 32, 48, 56, 64, 72], "the members the audit reads");
    let added = [
        offset_of!(CollDescrV7, kernel_variant),
        offset_of!(CollDescrV7, is_sym_coll),
        offset_of!(CollDescrV7, user_tag),
    ];
    assert_eq!(added, [88, 96, 104]);
    assert_eq!(
        (size_of::<CollDescrV7>(), size_of::<EventDescrV7>()),
        (112, 136)
    );
    assert_eq!(size_of::<Profiler<EventDescrV7>>(), 6 * 8);
}

/// A collective event written byte by byte at the offsets of NCCL's headers (LP64), not
/// through the mirrors: the union at 24; in `coll` func 8, count 32, datatype 48,
/// nChannels 56, nWarps 57, algo 64, proto 72; v7 adds userTag at 104.
struct Raw([u64; 17]);

impl Raw {
    fn coll(v7: bool, func: &CStr, count: usize, algo: &CStr, proto: &CStr, ch: u8) -> Raw {
        let mut r = Raw([0; 17]);
        r.put(0, PROFILE_COLL);
        r.put(24 + 8, func.as_ptr());
        r.put(24 + 32, count);
        r.put(24 + 48, c"ncclBfloat16".as_ptr());
        r.put(24 + 56, ch);
        r.put(24 + 57, 16u8);
        r.put(24 + 64, algo.as_ptr());
        r.put(24 + 72, proto.as_ptr());
        if v7 {
            r.put(24 + 104, 0xfeed_u64);
        }
        r
    }

    fn put<T>(&mut self, at: usize, v: T) {
        assert!(at + std::mem::size_of::<T>() <= 136);
        // SAFETY: within the 136 bytes (checked); unaligned writes of plain values.
        unsafe {
            let p = self.0.as_mut_ptr().cast::<u8>().add(at);
            p.cast::<T>().write_unaligned(v);
        }
    }
}

/// Sends the events through table `t`'s own entry points to an audit of `p`.
fn through<D: Descr>(t: &Profiler<D>, events: &mut [Raw], p: &Profile) -> Summary {
    let ctx = Box::into_raw(Box::new(audit(p))).cast::<c_void>();
    unsafe {
        for e in events.iter_mut() {
            let mut h: *mut c_void = std::ptr::dangling_mut::<c_void>();
            assert_eq!((t.start_event)(ctx, &mut h, e.0.as_mut_ptr().cast()), 0);
            assert!(h.is_null());
        }
        let s = (*(ctx as *const Audit)).summary();
        assert_eq!((t.finalize)(ctx), 0);
        Summary {
            tuner_calls: 0,
            ..s
        }
    }
}

#[test]
fn an_event_through_v7_is_audited_as_through_v6() {
    let mut p = sample::profile();
    p.groups.iter_mut().for_each(|g| g.nccl_channels = Some(4));
    let events = |v7: bool| {
        let mut phase = Raw([u64::MAX; 17]);
        phase.put(0, 1u64 << 15); // ncclProfileKernelPhase, v7's new event
        vec![
            Raw::coll(v7, c"AllReduce", 500, c"RING", c"LL", 2),
            Raw::coll(v7, c"AllReduce", 500, c"TREE", c"LL", 2),
            Raw::coll(v7, c"AllReduce", 500, c"RING", c"LL", 8),
            Raw::coll(v7, c"AllGather", 500, c"RING", c"LL", 2),
            phase,
        ]
    };
    let v6 = through(&ncclProfiler_v6, &mut events(false), &p);
    let v7 = through(&ncclProfiler_v7, &mut events(true), &p);
    assert_eq!(v7, v6);
    assert_eq!((v7.allreduces, v7.judged, v7.agreed), (3, 3, 1));
    let ran: Vec<_> = v7
        .sizes
        .iter()
        .map(|r| (r.bytes, r.ran.as_str(), r.channels))
        .collect();
    assert_eq!(
        ran,
        [
            (1000, "RING/LL", 2),
            (1000, "TREE/LL", 2),
            (1000, "RING/LL", 8)
        ]
    );
}

#[test]
fn each_table_asks_for_collectives_and_names_itself() {
    let tables: [(Init, Finalize, &str); 3] = [
        (ncclProfiler_v5.init, ncclProfiler_v5.finalize, "v5"),
        (ncclProfiler_v6.init, ncclProfiler_v6.finalize, "v6"),
        (ncclProfiler_v7.init, ncclProfiler_v7.finalize, "v7"),
    ];
    for (init, finalize, name) in tables {
        let (mut ctx, mut mask) = (std::ptr::null_mut(), 0);
        unsafe {
            assert_eq!(
                init(&mut ctx, 1, &mut mask, std::ptr::null(), 1, 2, 0, None),
                0
            );
            assert!(!ctx.is_null());
            assert_eq!(mask, PROFILE_COLL as c_int);
            assert_eq!((*(ctx as *const Audit)).summary().profiler, name);
            assert_eq!(finalize(ctx), 0);
        }
    }
}

fn audit(p: &Profile) -> Audit {
    Audit {
        expect: Context::from_profile(p, 2, 1, Mode::Graph, None).ok(),
        logger: None,
        comm_id: 7,
        dir: None,
        tally: Mutex::new(Summary::default()),
        force: &TEST_FORCE,
    }
}

/// The override the tests' audits read (the process's own is the tuner tests').
static TEST_FORCE: crate::plugin::force::Force = crate::plugin::force::Force::new();

fn coll(func: &std::ffi::CStr, count: usize, algo: &CStr, proto: &CStr, ch: u8) -> EventDescr {
    EventDescr {
        kind: PROFILE_COLL,
        parent_obj: std::ptr::null_mut(),
        rank: 0,
        coll: CollDescr {
            seq_number: 0,
            func: func.as_ptr(),
            send_buff: std::ptr::null(),
            recv_buff: std::ptr::null_mut(),
            count,
            root: 0,
            datatype: c"ncclBfloat16".as_ptr(),
            n_channels: ch,
            n_warps: 16,
            algo: algo.as_ptr(),
            proto: proto.as_ptr(),
            parent_group: std::ptr::null_mut(),
        },
    }
}

#[test]
fn events_are_judged_at_their_byte_size_and_only_allreduce() {
    let mut p = sample::profile();
    p.groups.iter_mut().for_each(|g| g.nccl_channels = Some(4));
    let a = audit(&p);
    // 1000 bytes (500 bf16): the sample pins ring LL there.
    let e = a.expected(1000);
    assert_eq!(e.pin.map(audit::pin_name).as_deref(), Some("RING/LL"));
    assert_eq!(e.channels, Some(4));
    unsafe {
        a.event(&coll(c"AllReduce", 500, c"RING", c"LL", 2));
        a.event(&coll(c"AllReduce", 500, c"TREE", c"LL", 2));
        a.event(&coll(c"AllReduce", 500, c"RING", c"LL", 8));
        a.event(&coll(c"AllGather", 500, c"TREE", c"LL", 2));
        let mut other = coll(c"AllReduce", 500, c"TREE", c"LL", 2);
        other.kind = 1; // a group event
        a.event(&other);
    }
    let s = a.summary();
    assert_eq!((s.allreduces, s.judged, s.agreed), (3, 3, 1));
    let kinds: Vec<&str> = s.classes.iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(kinds, ["variant", "channels"]);
    assert_eq!(s.sizes[0].bytes, 1000, "count x 2 bytes of bf16");
}

/// Each call's record carries the override set when NCCL ran it, so one communicator's
/// variants are read back apart.
#[test]
fn calls_are_tagged_with_the_override_they_ran_under() {
    static F: crate::plugin::force::Force = crate::plugin::force::Force::new();
    let mut a = audit(&sample::profile());
    a.force = &F;
    let ring_ll = crate::plugin::force::Forced::of(crate::allreduce::Backend::NcclRingLl, None);
    unsafe {
        a.event(&coll(c"AllReduce", 500, c"RING", c"LL", 2));
        F.set(ring_ll);
        a.event(&coll(c"AllReduce", 500, c"RING", c"LL", 2));
        a.event(&coll(c"AllReduce", 500, c"RING", c"LL", 2));
        F.set(None);
    }
    let s = a.summary();
    let got: Vec<_> = s
        .sizes
        .iter()
        .map(|r| (r.forced.as_deref(), r.calls))
        .collect();
    assert_eq!(got, [(None, 1), (Some("RING/LL"), 2)]);
}

#[test]
fn datatype_names_as_nccl_prints_them() {
    assert_eq!(datatype_size("ncclBfloat16"), Some(2));
    assert_eq!(datatype_size("ncclFloat32"), Some(4));
    assert_eq!(datatype_size("ncclUint64"), Some(8));
    assert_eq!(datatype_size("ncclInt8"), Some(1));
    assert_eq!(datatype_size("ncclSomethingNew"), None);
}

#[test]
fn entry_points_survive_null_and_hand_out_no_handle() {
    unsafe {
        let mut h: *mut c_void = std::ptr::dangling_mut::<c_void>();
        let t = &ncclProfiler_v6;
        assert_eq!(
            (t.start_event)(std::ptr::null_mut(), &mut h, std::ptr::null_mut()),
            0
        );
        assert!(h.is_null());
        assert_eq!((t.stop_event)(std::ptr::null_mut()), 0);
        assert_eq!(
            (t.record_event_state)(std::ptr::null_mut(), 0, std::ptr::null_mut()),
            0
        );
        assert_eq!((t.finalize)(std::ptr::null_mut()), 0);
        let mut mask = 0;
        let r = (t.init)(
            std::ptr::null_mut(),
            1,
            &mut mask,
            std::ptr::null(),
            1,
            2,
            0,
            None,
        );
        assert_eq!((r, mask), (0, 0));
    }
}
