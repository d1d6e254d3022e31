use super::*;

#[test]
fn the_mps_server_is_not_a_neighbour_but_its_clients_are() {
    let p = |pid: u32, name: &str| Process {
        pid,
        name: name.into(),
        memory_bytes: Some(66 << 20),
    };
    // As NVML lists them under MPS: the server's context, then the clients apart (one
    // also in the first list).
    let listed = [
        p(693, "nvidia-cuda-mps"),
        p(900, "python3"),
        p(900, "python3"),
        p(901, "/usr/bin/nvidia-cuda-mps-server"),
    ];
    let got: Vec<u32> = neighbours(listed).iter().map(|p| p.pid).collect();
    assert_eq!(got, vec![900]);
    assert!(neighbours([p(693, "nvidia-cuda-mps")]).is_empty());
    assert!(!is_mps_server("nvidia-smi"));
}

fn gpu(util: u32, free_gib: u64, process: bool) -> GpuReading {
    GpuReading {
        index: 0,
        utilization_pct: Some(util),
        free_bytes: Some(free_gib << 30),
        total_bytes: Some(141 << 30),
        processes: match process {
            true => vec![Process {
                pid: 7,
                name: "vllm".into(),
                memory_bytes: None,
            }],
            false => Vec::new(),
        },
        ..Default::default()
    }
}

fn reading(g: GpuReading) -> Reading {
    Reading { gpus: vec![g] }
}

/// A GPU busy with no process named is read again (the driver releasing an exited
/// process), for at most the limit; a process NVML names is in use at once.
#[test]
fn a_settling_gpu_is_waited_for_and_one_in_use_refused() {
    let settling = reading(gpu(100, 1, false));
    let Settle::Wait(what) = settle(std::slice::from_ref(&settling)) else {
        panic!("not waited for")
    };
    assert!(
        what.starts_with("waiting up to 10 s for the GPUs to settle (GPU 0 100% utilized")
            && what.contains("1.0 GiB of 141.0 GiB free"),
        "{what}"
    );
    let settled = [
        settling.clone(),
        reading(gpu(40, 90, false)),
        reading(gpu(0, 140, false)),
    ];
    assert!(matches!(settle(&settled[..2]), Settle::Wait(_)));
    assert_eq!(settle(&settled), Settle::Free);
    assert_eq!(settle(&[reading(gpu(100, 1, true))]), Settle::Busy);
    let stays = vec![settling; 11];
    assert!(matches!(settle(&stays[..10]), Settle::Wait(_)));
    assert_eq!(settle(&stays), Settle::Busy);
    assert_eq!(settle(&[]), Settle::Free);
}

/// Readings a poll apart: the limit is the time they span, not their count.
#[test]
fn readings_closer_than_a_sample_wait_the_same_limit() {
    use std::time::Duration;
    let poll = crate::topology::samples::POLL;
    let stays = vec![reading(gpu(100, 1, false)); 15];
    assert!(matches!(settle_after(&stays, poll * 14), Settle::Wait(_)));
    assert_eq!(settle_after(&stays, SETTLE_LIMIT), Settle::Busy);
    assert!(matches!(
        settle_after(&stays[..2], SETTLE_LIMIT - Duration::from_millis(1)),
        Settle::Wait(_)
    ));
    let mut quiet = stays.clone();
    quiet.push(reading(gpu(0, 140, false)));
    assert_eq!(settle_after(&quiet, poll * 15), Settle::Free);
    // A named process is in use at the first reading, however soon.
    assert_eq!(
        settle_after(&[reading(gpu(0, 1, true))], Duration::ZERO),
        Settle::Busy
    );
}

fn neighbour() -> Reading {
    Reading {
        gpus: vec![GpuReading {
            index: 0,
            processes: vec![Process {
                pid: 4242,
                name: "python3".into(),
                memory_bytes: Some(140 << 30),
            }],
            utilization_pct: Some(97),
            free_bytes: Some(1 << 30),
            total_bytes: Some(141 << 30),
            ..Default::default()
        }],
    }
}

#[test]
fn a_neighbour_is_named_with_its_memory_and_what_is_free() {
    let r = neighbour();
    let msg = r.refusal("tune").unwrap();
    assert!(
        msg.contains("GPU 0: pid 4242 (python3) holding 140.0 GiB"),
        "{msg}"
    );
    assert!(msg.contains("97% utilized"), "{msg}");
    assert!(msg.contains("1.0 GiB of 141.0 GiB free"), "{msg}");
    assert!(msg.contains("--allow-busy"), "{msg}");
    assert_eq!(r.busy().len(), 1);
}

#[test]
fn an_idle_gpu_passes_and_unexplained_load_does_not() {
    let mut r = neighbour();
    r.gpus[0].processes.clear();
    r.gpus[0].utilization_pct = Some(0);
    assert_eq!(r.refusal("tune"), None);
    r.gpus[0].utilization_pct = Some(60);
    assert!(r.refusal("tune").unwrap().contains("does not name"));
}

#[test]
fn a_neighbour_arriving_mid_run_is_named_once_and_stops_the_run_unless_allowed() {
    let idle = Reading {
        gpus: vec![GpuReading {
            index: 0,
            ..Default::default()
        }],
    };
    let readings = vec![idle.clone(), idle, neighbour()];
    let watch = Neighbours::script(readings.clone(), 1, "tune", true);
    assert_eq!(watch.look("before GPUs 0,1", 0).unwrap(), Looked::default());
    let first = watch.look("after probes", 0).unwrap();
    assert_eq!(first.new.len(), 1);
    assert_eq!(first.now[0].pid, 4242);
    let again = watch.look("later", 0).unwrap();
    assert_eq!((again.now.len(), again.new.len()), (1, 0));
    let strict = Neighbours::script(readings, 1, "tune", false);
    strict.look("before GPUs 0,1", 0).unwrap();
    let e = strict.look("while measuring GPUs 0,1", 0).unwrap_err();
    assert!(
        e.contains("during tune (GPU 0: pid 4242 (python3) holding 140.0 GiB, first seen while measuring GPUs 0,1)")
            && e.contains("--allow-busy"),
        "{e}"
    );
    assert!(Neighbours::default().look("x", 0).unwrap().now.is_empty());
}

#[test]
fn this_process_and_its_children_are_not_neighbours() {
    let me = std::process::id();
    let child = std::process::Command::new("sleep")
        .arg("5")
        .spawn()
        .unwrap();
    assert_eq!(parent_of(child.id()), Some(me));
    let mut child = child;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(parent_of(u32::MAX), None);
}

#[test]
fn visible_devices_pick_the_gpus() {
    let uuids = [(0, "GPU-aaa".to_string()), (1, "GPU-bbb".to_string())];
    assert_eq!(cuda_indices(None, &uuids, false), None);
    assert_eq!(cuda_indices(None, &uuids, true), Some(vec![0]));
    assert_eq!(cuda_indices(Some("1,0"), &uuids, true), Some(vec![1]));
    assert_eq!(cuda_indices(Some("GPU-bbb"), &uuids, false), Some(vec![1]));
}
