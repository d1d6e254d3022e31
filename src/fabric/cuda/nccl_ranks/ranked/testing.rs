//! A loopback group's K ranks played by a script, for the fabric's tests.

use super::*;

/// A stand-in for `artune __nccl-rank` in `dir`: it logs its arguments, then rank 0 writes
/// per size `samples` distinct times (size / 1000 + sample + 0.5, 1000 more in graph mode);
/// at `wrong` bytes rank 1 reports a wrong sum, at `broken` bytes (0: in graph mode) it
/// fails otherwise.
pub fn fake_rank(dir: &std::path::Path, wrong: u64, broken: u64) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let exe = dir.join("artune");
    let log = dir.join("starts.log");
    let script = format!(
        r#"#!/bin/sh
echo "$@" >> {log}
g=0
while [ $# -gt 0 ]; do
  case $1 in
--sizes) sizes=$2; shift;; --samples) n=$2; shift;; --times) out=$2; shift;;
--rank) rank=$2; shift;; --graph) g=1000;;
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
for b in $(echo $sizes | tr , ' '); do
  line="0 $b"; i=0
  while [ $i -lt $n ]; do line="$line $((b / 1000 + i + g)).5"; i=$((i + 1)); done
  echo "$line"
done > $out
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

pub fn ranked(dir: &std::path::Path, wrong: u64, broken: u64) -> Ranked {
    let mut r = Ranked::new(fake_rank(dir, wrong, broken), 2, vec![1024, 4096]);
    r.ids = fake_id;
    r
}
