#!/usr/bin/env bash
# The Slurm path of deploy/ for real, on this one machine: Debian's slurm-wlm and munge, a
# munged, a slurmctld and five slurmd (node names ci1..ci5 on localhost), srun tasks that each
# doctor and tune a simulated node (ci1-ci4 the same 4-GPU box, ci3 with NCCL made three times
# slower by injected faults, ci5 a 2-GPU box), then `artune fleet` over the results. It fails
# unless ci3 is named the outlier and a class profile is written per topology class. If Slurm
# does not start, it fails with the daemons' logs; it never skips. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ "$(id -u)" != 0 ]; then
    echo "error: .ci/slurm.sh installs packages and starts daemons: run it as root" >&2
    exit 1
fi

echo "== installing slurm-wlm and munge from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null

echo "== building artune"
cargo build --locked --bin artune
ARTUNE=$ROOT/target/debug/artune

WORK=$(mktemp -d /tmp/artune-slurm.XXXXXX)
chmod 755 "$WORK"
NODES=(ci1 ci2 ci3 ci4 ci5)
CTLD_PORT=26817
FIRST_PORT=27001

logs() {
    for f in "$WORK"/log/*; do
        [ -f "$f" ] || continue
        echo "---- $f"
        tail -n 40 "$f"
    done
}

stop() {
    local rc=$?
    for pid in "$WORK"/run/*.pid; do
        [ -f "$pid" ] || continue
        kill "$(cat "$pid")" 2>/dev/null || true
    done
    if [ "$rc" != 0 ]; then
        echo "FAILED (exit $rc); daemon logs:" >&2
        logs >&2
    fi
    # Give the daemons a moment to exit before their directory goes.
    sleep 1
    rm -rf "$WORK"
}
trap stop EXIT

fail() {
    echo "error: $*" >&2
    exit 1
}

mkdir -p "$WORK"/{log,run,munge,munge-run,spool,state,out,doctor}
chown munge:munge "$WORK/munge" "$WORK/munge-run" "$WORK/log"
# munged wants its key private and its socket's directory open to every client.
chmod 700 "$WORK/munge"
chmod 755 "$WORK/munge-run"

echo "== starting munged"
# A key and socket of our own: a munged the machine already runs is left alone.
dd if=/dev/urandom of="$WORK/munge/munge.key" bs=1024 count=1 status=none
chown munge:munge "$WORK/munge/munge.key"
chmod 400 "$WORK/munge/munge.key"
SOCKET=$WORK/munge-run/munge.socket
runuser -u munge -- munged \
    --key-file="$WORK/munge/munge.key" \
    --socket="$SOCKET" \
    --pid-file="$WORK/munge-run/munged.pid" \
    --seed-file="$WORK/munge/munged.seed" \
    --log-file="$WORK/log/munged.log" \
    || fail "munged did not start"
ln -s "$WORK/munge-run/munged.pid" "$WORK/run/munged.pid"
munge -S "$SOCKET" -n | unmunge -S "$SOCKET" >/dev/null || fail "munge cannot encode and decode a credential"

HOST=$(hostname)
PORTS="$FIRST_PORT-$((FIRST_PORT + ${#NODES[@]} - 1))"
cat > "$WORK/slurm.conf" <<EOF
ClusterName=artune-ci
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool/%n
SlurmctldPidFile=$WORK/run/slurmctld.pid
SlurmdPidFile=$WORK/run/slurmd-%n.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd-%n.log
NodeName=ci[1-${#NODES[@]}] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$PORTS] CPUs=1 State=UNKNOWN
PartitionName=ci Nodes=ci[1-${#NODES[@]}] Default=YES MaxTime=10 State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$WORK/slurm.conf

echo "== starting slurmctld and ${#NODES[@]} slurmd"
slurmctld -f "$SLURM_CONF" || fail "slurmctld did not start"
for n in "${NODES[@]}"; do
    slurmd -f "$SLURM_CONF" -N "$n" || fail "slurmd -N $n did not start"
done
for _ in $(seq 60); do
    idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    [ "$idle" = "${#NODES[@]}" ] && break
    sleep 1
done
sinfo -N
[ "$idle" = "${#NODES[@]}" ] || fail "only $idle of ${#NODES[@]} nodes came up idle within 60 s"

echo "== srun: doctor and tune on every node"
# What each node simulates; ci3 is the outlier.
cat > "$WORK/node.sh" <<EOF
#!/usr/bin/env bash
set -euo pipefail
case "\$SLURMD_NODENAME" in
    ci5) preset=pcie-2x ;;
    *) preset=pcie-4x-1switch ;;
esac
faults=()
[ "\$SLURMD_NODENAME" = ci3 ] && faults=(--sim-faults slow=nccl+nccl_ring_ll+nccl_ring_ll128+nccl_ring_simple+nccl_tree_ll+nccl_tree_ll128+nccl_tree_simple:3)
seed=\${SLURMD_NODENAME#ci}
"$ARTUNE" doctor --sim "\$preset" --json > "$WORK/doctor/\$SLURMD_NODENAME.json"
exec "$ARTUNE" tune --sim "\$preset" --seed "\$seed" --sizes 1K:4M --no-contention \\
    "\${faults[@]}" --out "$WORK/out/{host}.json" > /dev/null
EOF
chmod +x "$WORK/node.sh"
timeout 300 srun --nodes=${#NODES[@]} --ntasks-per-node=1 --time=5 "$WORK/node.sh" \
    || fail "srun tasks failed"
ls -l "$WORK/out"
for n in "${NODES[@]}"; do
    [ -s "$WORK/out/$n.json" ] || fail "node $n wrote no profile"
    grep -q '"id": "p2p"' "$WORK/doctor/$n.json" || fail "node $n wrote no doctor report"
done

echo "== artune fleet"
set +e
"$ARTUNE" fleet "$WORK/out" --prom "$WORK/artune.prom" > "$WORK/fleet.txt"
rc=$?
set -e
cat "$WORK/fleet.txt"
[ "$rc" = 7 ] || fail "artune fleet exited $rc, not 7 (its exit code for an outlier)"
grep -q "OUTLIER ci3" "$WORK/fleet.txt" || fail "ci3 is not named the outlier"
if grep "OUTLIER" "$WORK/fleet.txt" | grep -qv "OUTLIER ci3"; then
    fail "a healthy node was called an outlier"
fi
classes=$(ls "$WORK"/out/classes/class-*.json | wc -l)
[ "$classes" = 2 ] || fail "expected 2 class profiles, found $classes"
for c in "$WORK"/out/classes/class-*.json; do
    "$ARTUNE" show "$c" > /dev/null || fail "$c does not load"
done
grep -q '"left_out"' "$WORK"/out/classes/class-*.json || fail "no class profile leaves ci3 out"
grep -q 'artune_fleet_node_outlier{.*node="ci3"} 1' "$WORK/artune.prom" \
    || fail "the Prometheus file does not flag ci3"
echo "== ok: ci3 named the outlier, $classes class profiles written"
