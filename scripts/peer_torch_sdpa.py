#!/usr/bin/env python3
"""peer_torch_sdpa.py — PyTorch's SDPA backends on attnlab's GPU bench shapes, the peer measurement.

For (b,h,s,d) = (16,16,1024,128) (4,16,4096,128) (2,16,8192,128) (1,16,16384,128) (4,32,4096,64)
(4,16,4096,256), causal and not, bf16, each of torch.nn.attention.sdpa_kernel's FLASH_ATTENTION,
CUDNN_ATTENTION and EFFICIENT_ATTENTION backends, with
  separate: q, k, v allocated as [b,s,h,d] and transposed to [b,h,s,d] (PyTorch's layout argument)
  bs3hd:    one [b,s,3,h,d] buffer, qkv.unbind(2) views transposed to [b,h,s,d] (the packed case)
forward and backward TFLOP/s (forward 4*b*h*s*s*d, halved when causal; backward 2.5x forward), timed
with CUDA events over N calls after warm-up; plus the host overhead of one tiny SDPA call. The forward is
timed twice: under torch.no_grad() (fwd_ms: PyTorch's inference forward, which skips the log-sum-exp; for
cuDNN that is its is_inference graph) and with autograd on (fwd_train_ms: the LSE is written for the
backward, which is the work attnlab's forward always does; bench_compare.py compares against this one).
Prints a table and JSON lines (also appended to the file named by --out or ATTNLAB_PEER_OUT).
Run on the GPU machine:  python3 scripts/peer_torch_sdpa.py [--quick] [--out peer.jsonl]
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.environ.get("ATTNLAB_PEER_OUT"))
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        sys.exit("peer_torch_sdpa: PyTorch is not importable here (%s); run it on the GPU machine" % e)
    if not torch.cuda.is_available():
        sys.exit("peer_torch_sdpa: no CUDA device visible to PyTorch; run it on the GPU machine")

    out = open(args.out, "a") if args.out else None

    def emit(rec):
        rec["source"] = "torch"
        line = json.dumps(rec, sort_keys=True)
        print("JSON " + line)
        if out:
            out.write(line + "\n")
            out.flush()

    dev = torch.device("cuda")
    emit({"kind": "env", "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
          "cudnn": torch.backends.cudnn.version()})
    iters, warm = (3, 1) if args.quick else (args.iters, 3)

    def gpu_ms(fn):
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            fn()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) / iters

    shapes = [(16, 16, 1024, 128), (4, 16, 4096, 128), (2, 16, 8192, 128), (1, 16, 16384, 128),
              (4, 32, 4096, 64), (4, 16, 4096, 256)]
    if args.quick:
        shapes = shapes[:2]
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    print("%-20s %-7s %-8s %-10s %9s %9s %9s %9s  %s" % ("shape (b,h,s,d)", "mask", "layout", "backend",
                                                         "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s", "note"))
    torch.manual_seed(1234)
    for (b, h, s, d) in shapes:
        for causal in (False, True):
            mask = "causal" if causal else "no_mask"
            flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
            for layout in ("separate", "bs3hd"):
                for name, kind in backends:
                    try:
                        if layout == "separate":
                            leaves = [torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                                      for _ in range(3)]

                            def make():
                                return [t.transpose(1, 2) for t in leaves]
                        else:
                            qkv = torch.randn(b, s, 3, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                            leaves = [qkv]

                            def make():
                                return [t.transpose(1, 2) for t in qkv.unbind(2)]
                        dout = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)
                        with sdpa_kernel([kind]):
                            def fwd():
                                q, k, v = make()
                                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            with torch.no_grad():
                                tf = gpu_ms(fwd)
                            tft = gpu_ms(fwd)   # autograd on: the training forward (LSE kept)
                            o = fwd()

                            def bwd():
                                for t in leaves:
                                    t.grad = None
                                torch.autograd.backward(o, dout, retain_graph=True)
                            tb = gpu_ms(bwd)
                        rec = {"kind": "attention", "b": b, "h": h, "s": s, "d": d, "mask": mask, "layout": layout,
                               "backend": "torch_" + name, "fwd_ms": tf, "bwd_ms": tb, "fwd_train_ms": tft,
                               "fwd_tflops": flops / (tf * 1e-3) / 1e12, "bwd_tflops": 2.5 * flops / (tb * 1e-3) / 1e12,
                               "fwd_train_tflops": flops / (tft * 1e-3) / 1e12}
                        print("%-20s %-7s %-8s %-10s %9.3f %9.1f %9.3f %9.1f  training fwd %.3f ms %.1f TF/s" % (
                            "%d,%d,%d,%d" % (b, h, s, d), mask, layout, name, tf, rec["fwd_tflops"], tb,
                            rec["bwd_tflops"], tft, rec["fwd_train_tflops"]))
                        emit(rec)
                    except Exception as e:  # a backend refusing a shape is a result, not a failure
                        msg = str(e).replace("\n", " ")[:160]
                        print("%-20s %-7s %-8s %-10s %9s %9s %9s %9s  %s" % (
                            "%d,%d,%d,%d" % (b, h, s, d), mask, layout, name, "-", "-", "-", "-", msg))
                        emit({"kind": "attention", "b": b, "h": h, "s": s, "d": d, "mask": mask, "layout": layout,
                              "backend": "torch_" + name, "error": msg})
                    finally:
                        leaves = o = dout = None
                        torch.cuda.empty_cache()

    # host overhead of one tiny SDPA call (cuDNN backend, causal, like attnlab's measurement)
    q, k, v = (torch.randn(1, 2, 64, 64, device=dev, dtype=torch.bfloat16) for _ in range(3))
    for name, kind in backends:
        try:
            with sdpa_kernel([kind]), torch.no_grad():
                for _ in range(50):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.cuda.synchronize()
                n = 1000
                t0 = time.perf_counter()
                for _ in range(n):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
                host = (time.perf_counter() - t0) / n * 1e6
                torch.cuda.synchronize()
                total = (time.perf_counter() - t0) / n * 1e6
            print("host overhead, torch %s SDPA (1,2,64,64) causal, %d calls: %.2f us/call issued, %.2f incl. sync"
                  % (name, n, host, total))
            emit({"kind": "host_overhead", "backend": "torch_" + name, "us_per_call": host,
                  "us_per_call_synced": total, "calls": n})
        except Exception as e:
            print("host overhead, torch %s: %s" % (name, str(e)[:160]))
    if out:
        out.close()


if __name__ == "__main__":
    main()
