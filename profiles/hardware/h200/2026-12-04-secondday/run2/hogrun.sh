#!/bin/bash
W=$1; A=$2; PY=/opt/torch/.venv/bin/python
cp /work/main/profiles/hardware/h200/2026-12-04-secondday/hog.py $W/hog.py 2>/dev/null || cp $(dirname $0)/hog.py $W/hog.py
$PY $W/hog.py > $W/hog.txt 2>&1; date +"tune starts at %s.%N" >> $W/hog.txt
( time $A tune --loopback 2 --tp 2 --sizes 4K:256K --out $W/settle.json ) > $W/settle.txt 2>&1
echo "exit $?" >> $W/settle.txt
