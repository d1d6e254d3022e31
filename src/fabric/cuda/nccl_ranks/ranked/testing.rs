//! A loopback group's K ranks played by a script, for the fabric's tests.

use super::*;

/// A stand-in for `artune __nccl-rank` in `dir`: it logs its arguments (and `NCCL_ALGO`),
/// then rank 0 writes per size `samples` distinct times (size / 1000 + sample + 0.5, 1000
/// more in graph mode); at `wrong` bytes rank 1 reports a wrong sum, at `broken` bytes (0: in
/// graph mode) it fails otherwise.
pub fn fake_rank(dir: &std::path::Path, wrong: u64, broken: u64) -> PathBuf {
    fake_switching_rank(dir, wrong, broken, "")
}

/// [`fake_rank`] that also runs `--variants`: per variant its lines (size / 1000 + sample +
/// 0.75), and rank 0's profiler summary saying each ran as forced over 2 channels, but for
/// `disobey`, which NCCL ran as RING/SIMPLE.
pub fn fake_switching_rank(
    dir: &std::path::Path,
    wrong: u64,
    broken: u64,
    disobey: &str,
) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let exe = dir.join("artune");
    let log = dir.join("starts.log");
    let script = format!(
        r#"#!/bin/sh
echo "$@ ${{NCCL_ALGO:+NCCL_ALGO=$NCCL_ALGO}}" >> {log}
g=0; variants=""
while [ $# -gt 0 ]; do
  case $1 in
    --sizes) sizes=$2; shift;; --samples) n=$2; shift;; --times) out=$2; shift;;
    --rank) rank=$2; shift;; --graph) g=1000;; --variants) variants=$2; shift;;
  esac
  shift
done
for b in $(echo $sizes | tr , ' '); do
  if [ $rank = 1 ] && [ $b = {wrong} ]; then
    echo "rank 1: ncclAllReduce of $b bytes: element 3 is 0, not 6" >&2; exit {code}
  fi
  if [ $rank = 1 ] && [ $b = {broken} ]; then echo "rank 1: lost" >&2; exit 4; fi
  if [ $rank = 1 ] && [ {broken} = 0 ] && [ $g = 1000 ]; then
    echo "rank 1: capturing ncclAllReduce: not supported" >&2; exit 4
  fi
done
[ $rank = 0 ] || exit 0
emit() {{
  line="$1 $2"; i=0
  while [ $i -lt $n ]; do line="$line $(($2 / 1000 + i + g)).$3"; i=$((i + 1)); done
  echo "$line" >> $out.part
}}
name() {{
  case $1 in
    nccl_ring_ll) echo RING/LL;; nccl_ring_ll128) echo RING/LL128;;
    nccl_ring_simple) echo RING/SIMPLE;; nccl_tree_ll) echo TREE/LL;;
    nccl_tree_ll128) echo TREE/LL128;; nccl_tree_simple) echo TREE/SIMPLE;; *) echo RING/LL;;
  esac
}}
: > $out.part
if [ -z "$variants" ]; then
  for b in $(echo $sizes | tr , ' '); do emit 0 $b 5; done
else
  recs=""
  for v in $(echo $variants | tr , ' '); do
    ran=$(name $v); forced=',"forced":"'$ran'"'
    [ $v = nccl ] && forced=""
    [ $v = "{disobey}" ] && ran=RING/SIMPLE
    for b in $(echo $sizes | tr , ' '); do
      emit "$v 0" $b 75
      rec='{{"bytes":'$b',"ran":"'$ran'","channels":2,"calls":1,"agreed":0'$forced'}}'
      recs="$recs${{recs:+,}}$rec"
    done
  done
  head='"profiler":"v7","rank":0,"nranks":2,"following":false,"user_pins":[]'
  tally='"tuner_calls":0,"allreduces":0,"judged":0,"agreed":0,"classes":[]'
  echo "{{$head,$tally,\"sizes\":[$recs]}}" > $ARTUNE_NCCL_AUDIT/audit-$$-r0.json
fi
mv $out.part $out
"#,
        log = log.display(),
        code = super::super::EXIT_WRONG_SUM,
    );
    std::fs::write(&exe, script).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

pub fn fake_id() -> Result<String, String> {
    Ok("00".into())
}

/// Each rank's start, as its arguments.
pub fn starts(dir: &std::path::Path) -> Vec<String> {
    let log = std::fs::read_to_string(dir.join("starts.log")).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("--rank 0"))
        .map(String::from)
        .collect()
}

/// Every NCCL variant.
pub fn variants() -> Vec<Backend> {
    Backend::ALL.into_iter().filter(|b| b.is_nccl()).collect()
}

/// The ranks of a group of 2 over 1K-4K without libartune.so: a start per variant and mode.
pub fn ranked(dir: &std::path::Path, wrong: u64, broken: u64) -> Ranked {
    let mut r = Ranked::new(
        fake_rank(dir, wrong, broken),
        2,
        vec![1024, 4096],
        variants(),
    );
    r.ids = fake_id;
    r
}

/// The same with a libartune.so beside the binary: variants switched by the tuner, NCCL
/// running all but `disobey` as forced.
pub fn switched(dir: &std::path::Path, wrong: u64, broken: u64, disobey: &str) -> Ranked {
    std::fs::write(dir.join(crate::plugin::library::FILE), b"").unwrap();
    let exe = fake_switching_rank(dir, wrong, broken, disobey);
    let mut r = Ranked::new(exe, 2, vec![1024, 4096], variants());
    assert!(r.tuner.is_some());
    r.ids = fake_id;
    r
}
