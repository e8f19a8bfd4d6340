"""Instructions a kernel executed per element, by opcode, from Nsight Compute's SASS
source page (ncu -i REPORT --page source --csv --print-source sass, gzipped):
python instruction_mix.py sass-layernorm-65536.csv.gz [elements, default 2^26]."""
import collections
import csv
import gzip
import re
import sys

path = sys.argv[1]
elements = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 26
rows = list(csv.reader(gzip.open(path, "rt")))
header, body = rows[1], rows[2:]  # rows[0] names the kernel
executed = header.index("Instructions Executed")  # warp-level
source = header.index("Source")
by_opcode = collections.Counter()
by_count = collections.Counter()  # how many instructions ran each number of times
for row in body:
    warps = int(row[executed])
    if warps == 0:
        continue
    opcode = re.sub(r"^@!?U?P\w+\s+", "", row[source].strip()).split()[0].split(".")[0]
    by_opcode[opcode] += warps
    by_count[warps] += 1
total = sum(by_opcode.values())
print(rows[0][1])
print(f"warp instructions {total}, thread instructions per element {total * 32 / elements:.2f}")
print("per element: " + ", ".join(f"{op} {n * 32 / elements:.2f}" for op, n in by_opcode.most_common(20)))
print("instructions by times executed: " + ", ".join(f"{n} x {times}" for times, n in by_count.most_common(6)))
