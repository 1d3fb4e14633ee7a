#!/usr/bin/env python3
"""bench_compare.py — the ratio table of issue 5 from two JSON-lines files written in one GPU run:
attnlab's bench/attention_gpu_bench.lua (ATTNLAB_BENCH_OUT) and scripts/peer_torch_sdpa.py (--out).

Per shape and mask, forward and backward:
  fused/torch_cudnn (separate)   target >= 0.97
  fused bs3hd / fused separate   target >= 0.97 (packed within 3%)
  torch_cudnn bs3hd / separate   (PyTorch's packed penalty)
  fused bs3hd / torch_cudnn bs3hd  target >= 1.25 (backward)
plus host overhead per call (target <= 5 us for fused). Forward ratios use PyTorch's training forward
(fwd_train_tflops: autograd on, the LSE written, as attnlab's forward always does) when the peer file has it;
"fu/tcd inf" adds the ratio to its inference forward (torch.no_grad(): no LSE, cuDNN's is_inference graph). The fused ratios measure our overhead only when both
sides ran the same cuDNN: the "env" records carry each side's version (attnlab: "cudnn=9.14.0 ...", PyTorch:
91900); the script prints both and a warning when they differ. When the attnlab file holds flash records
(bench/flash_bench.lua with ATTNLAB_BENCH_OUT), a second table for issue 6:
  flash TFLOP/s, flash/torch_flash (FA2), flash/torch_cudnn, flash bs3hd / flash separate
  with issue 6's targets marked (d = 128, s >= 4096: forward >= 550 non-causal, >= 480 causal;
  backward >= 400). Pure standard library.
Usage: python3 scripts/bench_compare.py attnlab.jsonl peer.jsonl
"""
import json
import sys


def load(path):
    recs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("JSON "):
                line = line[5:]
            if not line.startswith("{"):
                continue
            try:
                recs.append(json.loads(line))
            except ValueError:
                pass
    return recs


def cudnn_versions(recs):
    """("9.14.0", "9.19.0") from the env records (attnlab: its backend_info text; PyTorch: an integer such as
    91900 = major * 10000 + minor * 100 + patch), None where a side has none."""
    ours = peer = None
    for r in recs:
        if r.get("kind") != "env" or "cudnn" not in r:
            continue
        v = r["cudnn"]
        if r.get("source") == "attnlab" and isinstance(v, str):
            for word in v.split():
                if word.startswith("cudnn="):
                    ours = word[len("cudnn="):]
        elif r.get("source") == "torch" and isinstance(v, (int, float)) and v > 0:
            v = int(v)
            peer = "%d.%d.%d" % (v // 10000, v // 100 % 100, v % 100)
    return ours, peer


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    recs = load(sys.argv[1]) + load(sys.argv[2])
    tab = {}
    hosts = {}
    ours_cudnn, peer_cudnn = cudnn_versions(recs)
    if ours_cudnn or peer_cudnn:
        print("cuDNN: attnlab %s, PyTorch %s" % (ours_cudnn or "?", peer_cudnn or "?"))
        if ours_cudnn and peer_cudnn and ours_cudnn != peer_cudnn:
            print("WARNING: the two sides ran different cuDNN versions: fused/torch_cudnn compares two libraries, not "
                  "attnlab's overhead (run attnlab with LD_LIBRARY_PATH pointing at PyTorch's cuDNN to compare like with like)")
    for r in recs:
        if r.get("kind") == "attention" and "error" not in r:
            tab[(r["b"], r["h"], r["s"], r["d"], r["mask"], r["layout"], r["backend"])] = r
        elif r.get("kind") == "host_overhead":
            hosts[r["backend"]] = r
    shapes = sorted({k[:5] for k in tab}, key=lambda k: (k[2], k[0], k[1], k[3], k[4]))

    def ratio(a, b, field, bfield=None):
        bfield = bfield or field
        if a is None or b is None or not a.get(field) or not b.get(bfield):
            return None
        return a[field] / b[bfield]

    def peer_field(rec, field):
        """the peer's like-for-like figure: its training forward where it was measured"""
        if field == "fwd_tflops" and rec is not None and rec.get("fwd_train_tflops"):
            return "fwd_train_tflops"
        return field

    def fmt(x, target=None):
        if x is None:
            return "      -"
        mark = ""
        if target is not None:
            mark = " " if x >= target else "!"
        return "%6.3f%s" % (x, mark)

    print("ratios of TFLOP/s (! = below the issue's target)")
    hdr = "%-18s %-7s %-4s %8s %8s %8s %8s %8s %8s %8s" % (
        "b,h,s,d", "mask", "dir", "fused", "torchcd", "fu/tcd", "fu pk/sp", "tcd pk/sp", "fu/tcd pk", "fu/tcd inf")
    print(hdr)
    worst = {}
    for key in shapes:
        g = lambda layout, be: tab.get(key + (layout, be))
        for direction, field in (("fwd", "fwd_tflops"), ("bwd", "bwd_tflops")):
            fs, fp = g("separate", "fused"), g("bs3hd", "fused")
            ts, tp = g("separate", "torch_cudnn"), g("bs3hd", "torch_cudnn")
            r1 = ratio(fs, ts, field, peer_field(ts, field))
            r2 = ratio(fp, fs, field)
            r3 = ratio(tp, ts, field)
            r4 = ratio(fp, tp, field, peer_field(tp, field))
            r5 = ratio(fs, ts, field) if direction == "fwd" and peer_field(ts, field) != field else None
            for name, val in (("fused/torch_cudnn", r1), ("fused packed/separate", r2)):
                if val is not None:
                    worst[name] = min(worst.get(name, 9e9), val)
            if direction == "bwd" and r4 is not None:
                worst["fused packed/torch_cudnn packed (bwd)"] = min(worst.get("fused packed/torch_cudnn packed (bwd)", 9e9), r4)
            print("%-18s %-7s %-4s %8s %8s %s %s %s %s %s" % (
                "%d,%d,%d,%d" % key[:4], key[4], direction,
                "%8.1f" % fs[field] if fs else "       -", "%8.1f" % ts[peer_field(ts, field)] if ts else "       -",
                fmt(r1, 0.97), fmt(r2, 0.97), fmt(r3), fmt(r4, 1.25 if direction == "bwd" else None), fmt(r5)))
    print()
    print("worst cases:")
    targets = {"fused/torch_cudnn": 0.97, "fused packed/separate": 0.97,
               "fused packed/torch_cudnn packed (bwd)": 1.25}
    for name, val in sorted(worst.items()):
        print("  %-40s %.3f (target >= %.2f) %s" % (name, val, targets[name], "ok" if val >= targets[name] else "MISSED"))
    flash_table(tab, shapes, ratio, fmt, peer_field)
    print()
    print("host overhead per call (us, issued / including sync):")
    for be, r in sorted(hosts.items()):
        tgt = "  (target <= 5 us)" if be == "fused" else ""
        print("  %-16s %8.2f %8.2f%s" % (be, r["us_per_call"], r.get("us_per_call_synced", float("nan")), tgt))


def flash_target(key, direction):
    """issue 6's TFLOP/s target for a (b, h, s, d, mask) shape, or None where it names none"""
    s, d, mask = key[2], key[3], key[4]
    if d != 128:
        return None
    if direction == "bwd":
        return 400.0
    if s < 4096:
        return None
    return 480.0 if mask != "no_mask" else 550.0


def flash_table(tab, shapes, ratio, fmt, peer_field):
    keys = [k for k in shapes if (k + ("separate", "flash")) in tab]
    if not keys:
        return
    print()
    print("flash backend (issue 6; ! = below its TFLOP/s target, d = 128)")
    print("%-18s %-7s %-4s %8s %7s %8s %8s %8s %8s" % (
        "b,h,s,d", "mask", "dir", "flash", "target", "/FA2", "/cuDNN", "FA2", "cuDNN") + " %8s" % "pk/sp")
    for key in keys:
        g = lambda layout, be: tab.get(key + (layout, be))
        for direction, field in (("fwd", "fwd_tflops"), ("bwd", "bwd_tflops")):
            fl, fp = g("separate", "flash"), g("bs3hd", "flash")
            fa, cd = g("separate", "torch_flash"), g("separate", "torch_cudnn")
            tgt = flash_target(key, direction)
            val = fl.get(field) if fl else None
            mark = " " if tgt is None or (val is not None and val >= tgt) else "!"
            print("%-18s %-7s %-4s %8s %7s %s %s %8s %8s %s" % (
                "%d,%d,%d,%d" % key[:4], key[4], direction,
                ("%7.1f%s" % (val, mark)) if val is not None else "       -",
                "%7.0f" % tgt if tgt else "      -",
                fmt(ratio(fl, fa, field, peer_field(fa, field))), fmt(ratio(fl, cd, field, peer_field(cd, field))),
                "%8.1f" % fa[peer_field(fa, field)] if fa else "       -",
                "%8.1f" % cd[peer_field(cd, field)] if cd else "       -",
                fmt(ratio(fp, fl, field))))


if __name__ == "__main__":
    main()
