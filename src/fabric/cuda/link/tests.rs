//! A worker link against small shell scripts playing the worker.

use super::*;
use crate::fabric::cuda::protocol::WireError;
use crate::fabric::FabricError;

fn sh(script: &str) -> Spawn {
    Spawn {
        program: "sh".into(),
        args: vec!["-c".into(), script.into()],
        env: Vec::new(),
    }
}

fn alive(pid: u32) -> bool {
    // A reaped child has no /proc entry (a zombie would still show, but kill reaps).
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_worker_that_exits_early_is_reported_not_waited_for() {
    let mut l = WorkerLink::start(&sh("exit 3"), "for GPU 0").unwrap();
    let t = std::time::Instant::now();
    let e = l.call(&Req::NcclId, Duration::from_secs(20)).unwrap_err();
    assert!(matches!(e, LinkError::Exited { .. }), "{e}");
    assert!(e.to_string().contains("worker for GPU 0 exited"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn garbage_on_the_pipe_is_a_clear_error() {
    let mut l =
        WorkerLink::start(&sh("read x; echo 'hello, not json' >&3; sleep 30"), "w").unwrap();
    let e = l.call(&Req::NcclId, Duration::from_secs(20)).unwrap_err();
    assert!(
        matches!(&e, LinkError::Garbage { line, .. } if line == "hello, not json"),
        "{e}"
    );
    // Given up on: the next request is refused at once, saying why (no wait on its pipe).
    let t = std::time::Instant::now();
    let again = l.send(&Req::NcclId).unwrap_err();
    assert!(t.elapsed() < Duration::from_millis(500));
    let s = again.to_string();
    assert!(
        matches!(again, LinkError::Retired { .. }) && s.contains("not a worker response"),
        "{s}"
    );
    let pid = l.pid();
    drop(l);
    assert!(!alive(pid), "the worker was left running");
}

#[test]
fn a_worker_that_never_answers_times_out_is_killed_and_never_asked_again() {
    let mut l = WorkerLink::start(&sh("sleep 60"), "for GPU 3").unwrap();
    let t = std::time::Instant::now();
    let e = l
        .call(&Req::Release, Duration::from_millis(300))
        .unwrap_err();
    assert!(matches!(e, LinkError::Silent { .. }), "{e}");
    assert!(e.to_string().contains("did not answer within 0.3 s"), "{e}");
    let again = l.call(&Req::Release, Duration::from_secs(5)).unwrap_err();
    assert!(matches!(again, LinkError::Retired { .. }), "{again}");
    // Only what happened: it missed the deadline (a link replaces nothing).
    assert!(
        again.to_string().contains("did not answer within 0.3 s"),
        "{again}"
    );
    assert!(!again.to_string().contains("replaced"), "{again}");
    let pid = l.pid();
    drop(l);
    assert!(!alive(pid));
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_missing_program_cannot_start() {
    let s = Spawn {
        program: "/nonexistent/artune".into(),
        args: Vec::new(),
        env: Vec::new(),
    };
    let e = WorkerLink::start(&s, "for GPU 0").err().unwrap();
    assert!(e.to_string().contains("/nonexistent/artune"), "{e}");
}

fn reply(id: u64, resp: &Resp) -> String {
    serde_json::to_string(&Envelope { id, body: resp }).unwrap()
}

#[test]
fn responses_round_trip_through_a_child() {
    let resp = Resp::Checked(Some("rank 1 wrong".into()));
    let line = reply(1, &resp);
    let mut l = WorkerLink::start(&sh(&format!("read x; echo '{line}' >&3")), "w").unwrap();
    assert_eq!(l.call(&Req::NcclId, Duration::from_secs(20)).unwrap(), resp);
    let oom = crate::fabric::DeviceError::OutOfMemory {
        gpu: 1,
        what: "allocating x".into(),
        bytes: Some(4096),
        free: Some(0),
    };
    let e = WireError::from_fabric(FabricError::Device(oom.clone()), true);
    let line = serde_json::to_string(&Resp::Failed(e)).unwrap();
    match serde_json::from_str::<Resp>(&line).unwrap() {
        Resp::Failed(WireError::Device { error, stuck }) => {
            assert!(stuck);
            assert_eq!(error, oom);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn log_lines_on_stdout_do_not_break_the_protocol_and_are_quoted_on_failure() {
    // As NCCL_DEBUG=INFO does: a log line on stdout before the reply, another on stderr.
    let line = reply(1, &Resp::Done);
    let script = format!(
        "read x; echo 'vm:452:452 [0] NCCL INFO Bootstrap: Using eth0'; \
         echo 'a note on stderr' >&2; echo '{line}' >&3; read y; echo 'dying words'; exit 7"
    );
    let mut l = WorkerLink::start(&sh(&script), "0 (loopback rank 0 on GPU 0)").unwrap();
    assert_eq!(
        l.call(&Req::NcclId, Duration::from_secs(20)).unwrap(),
        Resp::Done
    );
    let e = l.call(&Req::NcclId, Duration::from_secs(20)).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("exited (exit status: 7)"), "{s}");
    assert!(s.contains("NCCL INFO Bootstrap"), "{s}");
    assert!(s.contains("dying words"), "{s}");
}

#[test]
fn a_late_reply_is_dropped_not_taken_for_the_next_answer() {
    // The worker answers request 1 only after request 2 came; the reply to 2 is Done.
    let late = reply(1, &Resp::Checked(Some("late".into())));
    let now = reply(2, &Resp::Done);
    let script = format!("read x; read y; echo '{late}' >&3; echo '{now}' >&3; sleep 5");
    let mut l = WorkerLink::start(&sh(&script), "w").unwrap();
    l.send(&Req::NcclId).unwrap();
    assert_eq!(
        l.call(&Req::Disconnect, Duration::from_secs(20)).unwrap(),
        Resp::Done
    );
}

#[test]
fn the_worker_is_given_the_reply_channel() {
    let line = reply(HELLO_ID, &Resp::Done);
    let script = format!("test \"$ARTUNE_REPLY_FD\" = 3 && echo '{line}' >&3; sleep 5");
    let mut l = WorkerLink::start(&sh(&script), "w").unwrap();
    assert_eq!(l.recv(Duration::from_secs(20)).unwrap(), Resp::Done);
}

#[test]
fn colour_codes_are_taken_out_of_worker_lines() {
    assert_eq!(plain("\x1b[33m WARN\x1b[0m é x"), " WARN é x");
}

#[test]
fn clip_cuts_at_a_character_boundary() {
    let s = "é".repeat(200);
    let c = clip(&s, 199);
    assert!(c.ends_with("..."));
    assert_eq!(c.len(), 198 + 3);
    assert_eq!(clip("short", 10), "short");
}

#[test]
fn shutdown_says_when_each_worker_exited_a_killed_one_only_past_the_limit() {
    // Each exits at the end of its input, the second 0.3 s later; the third never does.
    let mut a = WorkerLink::start(&sh("cat >/dev/null"), "a").unwrap();
    let mut b = WorkerLink::start(&sh("cat >/dev/null; sleep 0.3"), "b").unwrap();
    let mut c = WorkerLink::start(&sh("trap '' TERM; sleep 30"), "c").unwrap();
    let pid = c.pid();
    let at = shutdown_all(&mut [&mut a, &mut b, &mut c], Duration::from_millis(800));
    let secs: Vec<Option<f64>> = at.iter().map(|d| d.map(|d| d.as_secs_f64())).collect();
    assert!(secs[0].is_some_and(|s| s < 0.25), "{secs:?}");
    assert!(secs[1].is_some_and(|s| (0.3..0.8).contains(&s)), "{secs:?}");
    assert!(!alive(pid), "the worker was left running");
    assert!(secs[2].is_none_or(|s| s >= 0.8), "{secs:?}");
}
