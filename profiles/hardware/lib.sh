# What the device scripts share, sourced after they set W (results), S (start, date +%s), END
# (seconds they may run) and pack (packs $W into $OUT). Scripts written before it carry their
# own copies, as they ran.

# /usr/bin/time where the machine has it (wall, user, sys, peak memory), else bash's.
timed() {
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f "real %e s  user %U s  sys %S s  max RSS %M KiB" "$@"
  else
    time "$@"
  fi
}

# step NAME SECONDS CMD...: CMD's output and exit in $W/NAME.txt, given at most what is left of
# END (less 5 s to pack), skipped when none is; packs after each.
step() { n=$1; t=$2; shift 2; left=$((S + END - 5 - $(date +%s)))
  [ $left -lt $t ] && t=$left
  if [ $t -le 2 ]; then echo "skipped: out of time" > $W/$n.txt; pack; return; fi
  ( timed timeout -s INT -k 5 $t "$@" ) > $W/$n.txt 2>&1; echo "exit $?" >> $W/$n.txt; pack; }

# The machine and the binaries, into $W/env.txt ($A the artune binary, $C its folder).
describe() {
  { date -u; uptime; nproc; nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv
    $A --version; cat $C/commit.txt 2>/dev/null; ls -l /lib/x86_64-linux-gnu/libnccl.so*
    ls -l /usr/bin/time; } > $W/env.txt 2>&1
}
