# The device calls, in order, back to back (the machine is given back after about 30 s idle);
# each carries one piece (`carry`: [".carry/g48/partN"]), the last also .carry/g48/bin:
#   1..6: mkdir -p /tmp/nccl232 && cp .carry/g48/partN/part* /tmp/nccl232/ && ls -l /tmp/nccl232
#   7:    mkdir -p /tmp/nccl232 && cp .carry/g48/part7/part* /tmp/nccl232/ && bash .carry/g48/bin/run.sh
# (seven pieces since 2026-12-05, when the tracked files had grown to 32.1 MiB; six before).
# run.sh joins the pieces and checks the checksum before anything runs.
