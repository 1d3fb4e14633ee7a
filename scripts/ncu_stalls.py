#!/usr/bin/env python3
"""scripts/ncu_stalls.py — where a kernel's warps wait, per SASS instruction, from Nsight Compute's source page.

    ncu --kernel-name regex:"al_flash_bwd_sm90_dkdv" --launch-skip 1 --launch-count 1 \\
        --section SourceCounters --section WarpStateStats --import-source no -o dkdv \\
        luajit scripts/flash_probe.lua --mask=causal
    ncu -i dkdv.ncu-rep --page source --csv --print-source sass > dkdv.csv
    python3 scripts/ncu_stalls.py dkdv.csv [--top=N]

For each kernel in the CSV (a '"Kernel Name","<name>"' line, then a header row with "Address", "Source" and
"Warp Stall Sampling (All Samples)", then one row per instruction) it prints the number of stall samples and
instructions, the N instructions with the most samples (share of all samples and of the not-issued ones,
address, SASS), and the samples per opcode (the mnemonic without predicate and modifiers: WARPGROUP for the
wgmma waits, SYNCS for mbarrier waits, BRA for the spin loops around them, STG for the epilogue's stores).
docs/PERFORMANCE.md (session 15) has what it showed for the Hopper backward. Standard library only.
"""
import csv
import sys

ALL = "Warp Stall Sampling (All Samples)"
NOT_ISSUED = "Warp Stall Sampling (Not-issued Samples)"


def usage(msg):
    sys.stderr.write("ncu_stalls: %s\nusage: python3 scripts/ncu_stalls.py SOURCE.csv [--top=N]\n" % msg)
    sys.exit(2)


def number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def cell(row, i):
    """column i of an instruction row as a number (0 where the column or the row's cell is missing)"""
    return number(row[i]) if i is not None and len(row) > i else 0.0


def opcode(sass):
    """the mnemonic of a SASS line: '@!P0 BRA 0x..' -> 'BRA', 'WARPGROUP.DEPBAR.LE gsb0' -> 'WARPGROUP'"""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def kernels(rows):
    """[(name, header, [instruction rows])] from the CSV's rows"""
    out, name, header, body = [], None, None, None
    for row in rows:
        if len(row) >= 2 and row[0] == "Kernel Name":
            if header is not None:
                out.append((name, header, body))
            name, header, body = row[1], None, []
        elif header is None and name is not None and "Address" in row and "Source" in row:
            header = row
        elif header is not None and row:
            body.append(row)
    if header is not None:
        out.append((name, header, body))
    return out


def report(name, header, body, top):
    for col in ("Address", "Source", ALL):
        if col not in header:
            usage("kernel %s: no column %r in the CSV's header (ncu --page source --csv --print-source sass)" % (name, col))
    ia, isrc, iall = header.index("Address"), header.index("Source"), header.index(ALL)
    ini = header.index(NOT_ISSUED) if NOT_ISSUED in header else None
    rows = [r for r in body if len(r) > max(ia, isrc, iall)]
    total = sum(cell(r, iall) for r in rows)
    total_ni = sum(cell(r, ini) for r in rows)
    print("%s: %d stall samples over %d instructions" % (name, int(total), len(rows)))
    if total <= 0:
        return
    print("  %6s %6s  %-18s %s" % ("all %", "n-i %", "address", "SASS"))
    for r in sorted(rows, key=lambda r: -cell(r, iall))[:top]:
        ni = 100.0 * cell(r, ini) / total_ni if total_ni > 0 else 0.0
        print("  %6.1f %6.1f  %-18s %s" % (100.0 * cell(r, iall) / total, ni, r[ia], " ".join(r[isrc].split())))
    by_op = {}
    for r in rows:
        op = opcode(r[isrc])
        by_op[op] = by_op.get(op, 0.0) + cell(r, iall)
    ranked = sorted(by_op.items(), key=lambda kv: -kv[1])[:top]
    print("  by opcode: " + ", ".join("%s %.1f%%" % (op or "?", 100.0 * v / total) for op, v in ranked))


def main(argv):
    path, top = None, 20
    for a in argv:
        if a.startswith("--top="):
            try:
                top = int(a[len("--top="):])
            except ValueError:
                usage("--top expects a positive integer, got %s" % a[len("--top="):])
            if top < 1:
                usage("--top expects a positive integer, got %d" % top)
        elif a.startswith("--"):
            usage("unknown option %s" % a)
        elif path is None:
            path = a
        else:
            usage("one CSV file expected, got a second: %s" % a)
    if path is None:
        usage("no CSV file given")
    try:
        with open(path, newline="") as f:
            found = kernels(list(csv.reader(f)))
    except OSError as e:
        usage("cannot read %s: %s" % (path, e.strerror))
    if not found:
        usage("%s holds no kernel's source page (expected a '\"Kernel Name\",...' line and an Address/Source header)" % path)
    for name, header, body in found:
        report(name, header, body, top)


if __name__ == "__main__":
    main(sys.argv[1:])
