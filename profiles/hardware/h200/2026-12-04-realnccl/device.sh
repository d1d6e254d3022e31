# The device calls, in order, back to back (the machine is given back after about 30 s idle);
# each carries one piece (`carry`: [".carry/g48/partN"]), the last also .carry/g48/bin:
#   1..6: mkdir -p /tmp/nccl232 && cp .carry/g48/partN/part* /tmp/nccl232/ && ls -l /tmp/nccl232
#   7:    mkdir -p /tmp/nccl232 && cp .carry/g48/part7/part* /tmp/nccl232/ && bash .carry/g48/bin/run.sh
# (seven pieces since 2026-12-05, when the tracked files had grown to 32.1 MiB; six before).
# run.sh joins the pieces and checks the checksum before anything runs.
# One call instead of seven (written 2026-12-05, not yet run on a GPU): carry-sm90.sh prunes the
# library to sm_90's device code, 9.8 MiB with xz; the call that carries .carry/n90 unpacks it:
#   mkdir -p /tmp/nccl232 && xz -dc .carry/n90/libnccl.so.2.xz > /tmp/nccl232/libnccl.so.2
# and the scripts check it against .carry/n90/libnccl.sha256 (put it in their C folder).
