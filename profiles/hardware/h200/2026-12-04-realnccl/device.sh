# The device calls, in order, back to back (the machine is given back after about 30 s idle);
# each carries one piece (`carry`: [".carry/g48/partN"]), the last also .carry/g48/bin:
#   1..5: mkdir -p /tmp/nccl232 && cp .carry/g48/partN/part* /tmp/nccl232/ && ls -l /tmp/nccl232
#   6:    mkdir -p /tmp/nccl232 && cp .carry/g48/part6/part* /tmp/nccl232/ && bash .carry/g48/bin/run.sh
# run.sh joins the pieces and checks the checksum before anything runs.
