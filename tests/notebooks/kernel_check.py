"""tests/notebooks/kernel_check.py — drives the attnlab Jupyter kernel through jupyter_client, the way a
notebook front end does, and checks: values shown like the REPL, C-level stdout/stderr streamed without
breaking the protocol, figures as image/svg+xml, errors as error messages, completion, inspection,
interrupt (the child keeps its state) and restart (the state is gone).

    JUPYTER_PATH=<dir with kernels/attnlab> /usr/bin/python3 tests/notebooks/kernel_check.py

Prints one "ok - <what>" line per check and "kernel_check: N ok, N not ok" last; exits 1 on failure.
Run by tests/spec/notebooks_spec.lua.
"""
import queue
import sys
import time

from jupyter_client.manager import start_new_kernel

passed, failed = 0, 0


def check(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print("ok - " + what)
    else:
        failed += 1
        print("not ok - %s %s" % (what, detail))


def run(kc, code, timeout=60, interrupt_after=None, km=None):
    """Execute code; return (reply content, list of iopub (msg_type, content))."""
    msg_id = kc.execute(code)
    out = []
    t0 = time.monotonic()
    interrupted = False
    while True:
        # interrupt once the cell has said it started (under load a fixed delay could land before the
        # child runs the cell) and interrupt_after seconds have passed
        started = any(t == "stream" and "started" in c.get("text", "") for t, c in out)
        if interrupt_after is not None and not interrupted and started and time.monotonic() - t0 > interrupt_after:
            km.interrupt_kernel()
            interrupted = True
        try:
            msg = kc.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            if time.monotonic() - t0 > timeout:
                raise RuntimeError("timeout running %r" % code)
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        t = msg["msg_type"]
        if t == "status" and msg["content"]["execution_state"] == "idle":
            break
        if t in ("stream", "display_data", "execute_result", "error"):
            out.append((t, msg["content"]))
    while True:   # shell replies of earlier requests (kernel_info at start-up) are skipped
        m = kc.get_shell_msg(timeout=timeout)
        if m["parent_header"].get("msg_id") == msg_id:
            return m["content"], out


def shell(kc, msg_id):
    while True:
        m = kc.get_shell_msg(timeout=10)
        if m["parent_header"].get("msg_id") == msg_id:
            return m["content"]


def text_of(out, kind="execute_result"):
    return "".join(c["data"].get("text/plain", "") for t, c in out if t == kind)


def stream_of(out, name):
    return "".join(c["text"] for t, c in out if t == "stream" and c["name"] == name)


km, kc = start_new_kernel(kernel_name="attnlab", startup_timeout=60)
try:
    r, out = run(kc, "1 + 1")
    check(r["status"] == "ok" and text_of(out) == "2", "an expression's value is the cell's result", out)

    r, out = run(kc, "al.manual_seed(1)\nx = al.randn{2, 3}\nx")
    t = text_of(out)
    check("[attnlab.Tensor f32 of size 2x3 on cpu]" in t and t.startswith("[["), "a tensor prints like the REPL", t)

    r, out = run(kc, "y = 5;")
    check(r["status"] == "ok" and text_of(out) == "", "a trailing ';' hides the value", out)

    r, out = run(kc, "print('from print')\nio.stderr:write('to stderr\\n')\n"
                     "al.ffi.cdef 'int printf(const char *fmt, ...);'\nal.ffi.C.printf('C printf %s\\n', '42')\n"
                     "al.ffi.cdef 'int puts(const char *s);'\nal.ffi.C.puts('7:{\"type\":\"reply\"},')\ny * 2")
    so = stream_of(out, "stdout")
    check("from print" in so and "C printf 42" in so and '7:{"type":"reply"},' in so,
          "Lua and C stdout are streamed (frame-like text included)", repr(so))
    check("to stderr" in stream_of(out, "stderr"), "stderr is streamed", out)
    check(text_of(out) == "10", "the protocol survives C output that looks like a frame", out)

    r, out = run(kc, "al.plot.line({1, 2, 3}, {1, 4, 9}, {title = 'squares'})")
    svg = "".join(c["data"].get("image/svg+xml", "") for t, c in out if t == "execute_result")
    check(svg.startswith("<svg") and "squares" in svg, "a figure is shown as image/svg+xml", out)

    r, out = run(kc, "al.plot.bar({'a', 'b'}, {1, 2}):show()\nprint('after')")
    kinds = [t for t, c in out]
    check("display_data" in kinds and kinds.index("display_data") < len(kinds) - 1
          and "image/svg+xml" in out[kinds.index("display_data")][1]["data"],
          "fig:show() displays mid-cell, in order with later output", kinds)

    r, out = run(kc, "error('boom')")
    errs = [c for t, c in out if t == "error"]
    check(r["status"] == "error" and errs and "boom" in errs[0]["evalue"], "an error is reported as an error", out)
    r, out = run(kc, "y")
    check(text_of(out) == "5", "state survives an error", out)

    r, out = run(kc, "function f(")
    check(r["status"] == "error", "a syntax error is an error", out)

    r, out = run(kc, "%time al.matmul(al.randn{64, 64}, al.randn{64, 64}):sum():item() > -1e9")
    check(text_of(out) == "true" and "%time: wall" in stream_of(out, "stdout"), "%time prints the wall time", out)

    r, out = run(kc, "?al.randn")
    check("randn" in stream_of(out, "stdout"), "?name prints help", out)

    cr = shell(kc, kc.complete("al.plo", 6))
    check("al.plot" in cr["matches"] and cr["cursor_start"] == 0, "completion of al. names", cr)
    cr = shell(kc, kc.complete("x:tran", 6))
    check("x:transpose" in cr["matches"], "completion of tensor methods", cr)

    ir = shell(kc, kc.inspect("al.plot.heatmap", 10))
    check(ir["found"] and "heatmap" in ir["data"]["text/plain"], "inspection (shift-tab) shows help", ir)

    # interrupt: a loop that calls into Lua functions (so the interpreter sees the hook)
    r, out = run(kc, "print('started') io.stdout:flush()\n"
                     "local t = os.time() while os.time() - t < 30 do local s = tostring(os.clock()) end",
                 timeout=60, interrupt_after=1.0, km=km)
    errs = [c for t, c in out if t == "error"]
    check(r["status"] == "error" and errs and "interrupted" in errs[0]["evalue"],
          "interrupt stops a running cell", (r.get("ename"), r.get("evalue")))
    r2, out = run(kc, "y")
    check(text_of(out) == "5", "state survives an interrupt", (r, r2, out))

    km.restart_kernel(now=True)
    kc.wait_for_ready(timeout=60)
    r, out = run(kc, "y == nil")
    check(text_of(out) == "true", "restart gives a fresh state", out)
    r, out = run(kc, "2 ^ 10")
    check(text_of(out) == "1024", "the restarted kernel runs cells", out)
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)

print("kernel_check: %d ok, %d not ok" % (passed, failed))   # not "passed/failed": scripts/tally.sh reads those
sys.exit(1 if failed else 0)
