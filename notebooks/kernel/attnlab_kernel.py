"""attnlab_kernel — a Jupyter kernel for attnlab: a Python wrapper kernel (Debian's python3-ipykernel)
that drives a LuaJIT child process running lua/attnlab/kernel_child.lua.

    /usr/bin/python3 notebooks/kernel/attnlab_kernel.py -f {connection_file}     (kernel.json's argv)

The protocol with the child runs over two pipes of its own (their fd numbers passed to the child in
ATTNLAB_KERNEL_FDS), as netstrings of JSON, so whatever C, CUDA or Lua prints on the child's stdout
and stderr cannot corrupt it: those two are read separately and streamed to the notebook as they
arrive. Requests: execute, complete, inspect. While a cell runs the child may send display frames
(figures: image/svg+xml; al.display(v)), each acknowledged so that output keeps its order, then one
reply frame.

Interrupt (kernel.json: "interrupt_mode": "signal"): Jupyter sends SIGINT to this process;
ipykernel raises KeyboardInterrupt inside do_execute, and the kernel forwards SIGINT to the child
(which runs in its own session, so it never gets the signal twice). LuaJIT raises "interrupted!" in
the running cell and the child keeps its state. A JIT-compiled loop never checks for the signal: if
the child has not answered within INTERRUPT_GRACE seconds it is killed and restarted, and the cell
says that the state was lost. Restart (Jupyter's restart) kills the child with the kernel.

Environment: ATTNLAB_ROOT (the repository; default: two folders up from this file), ATTNLAB_LIBDIR
(where libattnlab.so is; default ROOT/lib), LUAJIT (the interpreter; default luajit).
"""

import codecs
import json
import os
import select
import signal
import subprocess
import sys
import time

from ipykernel.kernelbase import Kernel

__version__ = "0.1.0"

INTERRUPT_GRACE = float(os.environ.get("ATTNLAB_INTERRUPT_GRACE", "5"))
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("ATTNLAB_ROOT") or os.path.normpath(os.path.join(HERE, "..", ".."))


class ChildDied(Exception):
    pass


class LuaChild:
    """The luajit process, its two protocol pipes and its stdout/stderr pipes."""

    def __init__(self, on_stream):
        self.on_stream = on_stream
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        env = dict(os.environ)
        lua_dir = os.path.join(ROOT, "lua")
        env["LUA_PATH"] = "%s/?.lua;%s/?/init.lua;%s" % (lua_dir, lua_dir, env.get("LUA_PATH", ";"))
        if "ATTNLAB_LIBDIR" not in env and os.path.exists(os.path.join(ROOT, "lib", "libattnlab.so")):
            env["ATTNLAB_LIBDIR"] = os.path.join(ROOT, "lib")
        env["ATTNLAB_KERNEL_FDS"] = "%d,%d" % (req_r, rep_w)
        env["ATTNLAB_PROGRESS"] = env.get("ATTNLAB_PROGRESS", "plain")   # no \r bars in a notebook
        env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen(
            [os.environ.get("LUAJIT", "luajit"), os.path.join(lua_dir, "attnlab", "kernel_child.lua")],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(req_r, rep_w), env=env, cwd=os.getcwd(), start_new_session=True)
        os.close(req_r)
        os.close(rep_w)
        self.req = req_w
        self.rep = rep_r
        self.buf = b""
        self.decoders = {
            self.proc.stdout.fileno(): ("stdout", codecs.getincrementaldecoder("utf-8")("replace")),
            self.proc.stderr.fileno(): ("stderr", codecs.getincrementaldecoder("utf-8")("replace")),
        }
        self.open_streams = set(self.decoders)
        hello = self.wait_reply(timeout=60, kind="ready")
        self.info = hello

    # -- framing ---------------------------------------------------------------------------------
    def send(self, msg):
        data = json.dumps(msg).encode("utf-8")
        frame = str(len(data)).encode() + b":" + data + b","
        try:
            while frame:
                n = os.write(self.req, frame)
                frame = frame[n:]
        except (BrokenPipeError, OSError) as e:
            raise ChildDied("cannot write to the LuaJIT child: %s" % e)

    def _frames(self):
        out = []
        while True:
            colon = self.buf.find(b":")
            if colon < 0:
                break
            n = int(self.buf[:colon])
            end = colon + 1 + n
            if len(self.buf) < end + 1:
                break
            out.append(json.loads(self.buf[colon + 1:end].decode("utf-8", "replace")))
            self.buf = self.buf[end + 1:]
        return out

    def _drain_streams(self, timeout):
        """Read whatever stdout/stderr hold (waiting up to timeout for the first bytes)."""
        fds = list(self.open_streams)
        while fds:
            ready, _, _ = select.select(fds, [], [], timeout)
            if not ready:
                return
            timeout = 0
            for fd in ready:
                data = os.read(fd, 65536)
                name, dec = self.decoders[fd]
                if not data:
                    self.open_streams.discard(fd)
                    fds.remove(fd)
                    text = dec.decode(b"", final=True)
                else:
                    text = dec.decode(data)
                if text:
                    self.on_stream(name, text)

    def wait_reply(self, timeout=None, kind="reply", on_frame=None, on_interrupt=None):
        """Stream output and pass display frames to on_frame until a frame of type `kind` arrives."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for f in self._frames():
                if f.get("type") == kind:
                    self._drain_streams(0)
                    return f
                if f.get("type") == "display":
                    # the child waits for our ack: what it wrote before the frame is all in the
                    # stdout/stderr pipes now, and nothing after it yet
                    self._drain_streams(0)
                    if on_frame:
                        on_frame(f)
                    self.send({"type": "ack"})
                elif on_frame:
                    on_frame(f)
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if on_interrupt and on_interrupt.pending_deadline is not None:
                left = max(0.0, on_interrupt.pending_deadline - time.monotonic())
                wait = left if wait is None else min(wait, left)
            try:
                ready, _, _ = select.select(list(self.open_streams) + [self.rep], [], [], wait)
            except KeyboardInterrupt:
                if on_interrupt is None:
                    raise
                on_interrupt()
                continue
            # stdout/stderr first: bytes written before a frame are already in their pipes
            if any(fd in self.open_streams for fd in ready):
                self._drain_streams(0)
            if self.rep in ready:
                data = os.read(self.rep, 1 << 20)
                if not data:
                    self._drain_streams(0.2)
                    code = self.proc.wait()
                    raise ChildDied("the LuaJIT child exited (status %s)" % code)
                self.buf += data
            if not ready:
                if on_interrupt and on_interrupt.pending_deadline is not None \
                        and time.monotonic() >= on_interrupt.pending_deadline:
                    raise ChildDied("interrupted: the LuaJIT child did not stop within %g s (a JIT-compiled "
                                    "loop does not see Ctrl-C), so it was restarted" % INTERRUPT_GRACE)
                if deadline is not None and time.monotonic() >= deadline:
                    raise ChildDied("the LuaJIT child did not answer within %g s" % timeout)

    def request(self, msg, **kw):
        self.send(msg)
        return self.wait_reply(**kw)

    def interrupt(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
            self.proc.wait()
        for fd in (self.req, self.rep):
            try:
                os.close(fd)
            except OSError:
                pass


class AttnlabKernel(Kernel):
    implementation = "attnlab"
    implementation_version = __version__
    language = "lua"
    language_version = "5.1"
    language_info = {
        "name": "lua",
        "version": "5.1",
        "mimetype": "text/x-lua",
        "file_extension": ".lua",
        "pygments_lexer": "lua",
        "codemirror_mode": "lua",
    }
    banner = "attnlab: LuaJIT with `al = require \"attnlab\"` loaded (?name for help, %time code)"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.child = None
        self._start_child()

    def _stream(self, name, text):
        self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})

    def _start_child(self):
        self.child = LuaChild(self._stream)
        info = self.child.info or {}
        self.banner = "attnlab %s on %s" % (info.get("version", "?"), info.get("jit", "LuaJIT"))

    def _restart_child(self, why):
        if self.child is not None:
            self.child.kill()
        self._stream("stderr", "[attnlab kernel] %s; a fresh LuaJIT child was started: "
                               "variables from earlier cells are gone.\n" % why)
        self._start_child()

    def _on_frame(self, frame):
        if frame.get("type") == "display":
            self.send_response(self.iopub_socket, "display_data",
                               {"data": frame.get("data") or {}, "metadata": {}})

    def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False):
        if not code.strip():
            return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}
        child = self.child

        def on_interrupt():
            if on_interrupt.pending_deadline is None:
                on_interrupt.pending_deadline = time.monotonic() + INTERRUPT_GRACE
            child.interrupt()
        on_interrupt.pending_deadline = None

        try:
            reply = child.request({"type": "execute", "code": code}, on_frame=self._on_frame,
                                  on_interrupt=on_interrupt)
        except ChildDied as e:
            self._restart_child(str(e))
            return self._error("KernelRestarted", str(e), [str(e)], silent)
        except KeyboardInterrupt:
            self._restart_child("interrupted while starting the cell")
            return self._error("KeyboardInterrupt", "interrupted", ["interrupted"], silent)
        if reply.get("status") == "ok":
            data = reply.get("data")
            if data and not silent:
                self.send_response(self.iopub_socket, "execute_result",
                                   {"execution_count": self.execution_count, "data": data, "metadata": {}})
            return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}
        tb = reply.get("traceback")
        if not isinstance(tb, list):
            tb = [reply.get("evalue", "")]
        return self._error(reply.get("ename", "LuaError"), reply.get("evalue", ""), tb, silent)

    def _error(self, ename, evalue, traceback, silent):
        content = {"ename": ename, "evalue": evalue, "traceback": traceback}
        if not silent:
            self.send_response(self.iopub_socket, "error", content)
        content.update({"status": "error", "execution_count": self.execution_count})
        return content

    def do_complete(self, code, cursor_pos):
        try:
            r = self.child.request({"type": "complete", "code": code, "cursor_pos": cursor_pos}, timeout=10)
        except ChildDied as e:
            self._restart_child(str(e))
            r = {}
        matches = r.get("matches")
        return {"status": "ok", "matches": matches if isinstance(matches, list) else [],
                "cursor_start": r.get("cursor_start", cursor_pos), "cursor_end": r.get("cursor_end", cursor_pos),
                "metadata": {}}

    def do_inspect(self, code, cursor_pos, detail_level=0, omit_sections=()):
        try:
            r = self.child.request({"type": "inspect", "code": code, "cursor_pos": cursor_pos}, timeout=10)
        except ChildDied as e:
            self._restart_child(str(e))
            r = {}
        return {"status": "ok", "found": bool(r.get("found")), "data": r.get("data") or {}, "metadata": {}}

    def do_shutdown(self, restart):
        if self.child is not None:
            try:
                self.child.send({"type": "shutdown"})
                self.child.proc.wait(timeout=2)
            except Exception:
                pass
            self.child.kill()
            self.child = None
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    from ipykernel.kernelapp import IPKernelApp
    IPKernelApp.launch_instance(kernel_class=AttnlabKernel)
