--[[
attnlab.kernel_child — the LuaJIT side of the attnlab Jupyter kernel (notebooks/kernel/attnlab_kernel.py).

The Python kernel starts `luajit lua/attnlab/kernel_child.lua` with two extra pipes and names their
file descriptors in ATTNLAB_KERNEL_FDS="<in>,<out>". Requests arrive on <in> and replies leave on
<out>, both as netstrings ("<length>:<json>,"), so anything C, CUDA or Lua writes to stdout/stderr
(fd 1 and 2, which the kernel streams to the notebook) can never corrupt the protocol.

Requests:  {"type": "execute", "code": ...}   {"type": "complete", "code": ..., "cursor_pos": n}
           {"type": "inspect", "code": ..., "cursor_pos": n}
Frames back while executing: {"type": "display", "data": {mime: text}} (al.display, fig:show()),
each answered by the kernel with {"type": "ack"} before the cell goes on; then one reply: {"type": "reply", "status": "ok", "data": bundle or null}
             or {"type": "reply", "status": "error", "ename": ..., "evalue": ..., "traceback": [...]}.
Before every frame stdout and stderr are flushed (Lua's and C's), so output and frames keep their
order: the kernel drains fd 1 and 2 before it reads a frame.

A cell runs like REPL input (lua/attnlab/repl.lua): globals persist between cells, the value of a
final expression is shown (a trailing ';' hides it), tensors as text, figures (values with a
__display method) as images. `%time code` (or a first line `%%time`) times the code with the GPU
synchronised; `?name` prints help. SIGINT interrupts a running cell with LuaJIT's "interrupted!"
error and the child lives on (a JIT-compiled loop cannot be interrupted: the kernel then restarts
the child).
]]
local ffi = require "ffi"
local repl = require "attnlab.repl"
local json = require "attnlab.json"

local function cdef(s) pcall(ffi.cdef, s) end
cdef "typedef long ssize_t;"
cdef "ssize_t read(int fd, void *buf, size_t count);"
cdef "ssize_t write(int fd, const void *buf, size_t count);"
cdef "int fflush(void *stream);"
cdef "typedef void (*al_repl_sighandler_t)(int);"
cdef "al_repl_sighandler_t signal(int signum, al_repl_sighandler_t handler);"

local fds = os.getenv("ATTNLAB_KERNEL_FDS") or "3,4"
local IN, OUT = fds:match("^(%d+),(%d+)$")
IN, OUT = tonumber(IN), tonumber(OUT)
if not IN then
  io.stderr:write("kernel_child: ATTNLAB_KERNEL_FDS must be '<in>,<out>', got " .. fds .. "\n")
  os.exit(2)
end

---------------------------------------------------------------------------------------------------
-- framing
---------------------------------------------------------------------------------------------------
local rbuf = ffi.new("char[65536]")
local pending = ""

local function read_more()
  while true do
    local n = tonumber(ffi.C.read(IN, rbuf, 65536))
    if n > 0 then pending = pending .. ffi.string(rbuf, n); return true end
    if n == 0 then return false end
    if ffi.errno() ~= 4 then return false end            -- EINTR: try again
  end
end

local function recv()
  while true do
    local len = pending:match("^(%d+):")
    if len then
      local start = #len + 2
      local stop = start + tonumber(len)
      if #pending >= stop then
        local payload = pending:sub(start, stop - 1)
        pending = pending:sub(stop + 1)                  -- drop the ','
        return json.decode(payload)
      end
    elseif #pending > 20 then
      error("kernel_child: bad frame start: " .. pending:sub(1, 20))
    end
    if not read_more() then return nil end
  end
end

local function flush_all()
  io.stdout:flush()
  io.stderr:flush()
  ffi.C.fflush(nil)
end

local function send(msg)
  flush_all()
  local payload = json.encode(msg)
  local frame = #payload .. ":" .. payload .. ","
  local off = 0
  while off < #frame do
    local n = tonumber(ffi.C.write(OUT, ffi.cast("const char *", frame) + off, #frame - off))
    if n < 0 then
      if ffi.errno() ~= 4 then os.exit(3) end            -- the kernel went away
    else
      off = off + n
    end
  end
end

---------------------------------------------------------------------------------------------------
-- values to MIME bundles
---------------------------------------------------------------------------------------------------
local function display_method(v)
  local tv = type(v)
  if tv == "table" then
    local f = v.__display
    if type(f) == "function" then return f end
    local mt = getmetatable(v)
    if type(mt) == "table" and type(rawget(mt, "__display")) == "function" then return rawget(mt, "__display") end
  end
  return nil
end

local function bundle_of(v)
  local f = display_method(v)
  if f then
    local ok, b = pcall(f, v)
    if ok and type(b) == "table" then
      if b["text/plain"] == nil then b["text/plain"] = tostring(v) end
      return b
    end
  end
  local ok, s = pcall(repl.render, v)
  return { ["text/plain"] = ok and s or ("<unprintable: " .. tostring(s) .. ">") }
end

-- A display frame waits for the kernel's ack: the kernel drains stdout/stderr (everything written
-- before the frame) before it shows the display, and nothing written after it exists until the ack,
-- so text and displays reach the notebook in the order the cell produced them.
local function send_display(bundle)
  send({ type = "display", data = bundle })
  local ack = recv()
  if ack == nil then os.exit(3) end
end

-- al.display(v, ...): show values now (figures as images, tensors as text), in cell order.
local function display(...)
  for i = 1, select("#", ...) do
    send_display(bundle_of((select(i, ...))))
  end
end

---------------------------------------------------------------------------------------------------
-- running a cell
---------------------------------------------------------------------------------------------------
local al = require "attnlab"
rawset(_G, "al", al)
al.display = display
local okp, plot = pcall(require, "attnlab.plot")
if okp then plot.display_hook = send_display end

local SIGINT = 2
local sig_ign = ffi.cast("al_repl_sighandler_t", 1)
-- luajit.c installs its SIGINT handler (it raises "interrupted!" at the next Lua instruction) around
-- the main chunk, which is this file: keep it, ignore SIGINT while idle, restore it while running.
local lj_handler = ffi.C.signal(SIGINT, sig_ign)
if tonumber(ffi.cast("intptr_t", lj_handler)) <= 1 then lj_handler = nil end

local PACK_PREFIX = "local __attnlab_repl_pack = ...; "

local function traceback_handler(e)
  local msg = type(e) == "string" and e or repl.pretty(e)
  local tb = debug.traceback("", 2)
  local lines = {}
  for line in tb:gmatch("[^\n]+") do
    if line:find("in function 'xpcall'", 1, true) then break end
    if not line:match("^stack traceback:") then lines[#lines + 1] = line end
  end
  return { msg = msg, tb = lines }
end

-- Compile a cell. A single expression shows its value; otherwise, as in IPython, the cell's last
-- expression does: the shortest run of final lines that parses as an expression (with the lines
-- before it as statements, in the same chunk so their locals are visible) gives the value; else the
-- cell runs as plain statements. Returns fn, has_value, or nil, message.
local function compile_cell(code)
  local fn, err = repl.compile(code, "=cell")
  if fn and err then return fn, true end
  local lines = {}
  for l in (code:gsub("%s+$", "") .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  for k = 1, #lines - 1 do
    local body = table.concat(lines, "\n", 1, #lines - k)
    local expr = table.concat(lines, "\n", #lines - k + 1):gsub(";%s*$", "")
    if not expr:match("^%s*%-%-") then
      local fn2 = loadstring(PACK_PREFIX .. body .. "\nreturn __attnlab_repl_pack(" .. expr .. "\n)", "=cell")
      if fn2 then return fn2, true end
    end
  end
  if fn then return fn, false end
  local fn3, err3 = loadstring(code, "=cell")
  if fn3 then return fn3, false end
  if err == "incomplete" then return nil, err3 .. " (incomplete code: an unclosed function, do, if, string or bracket?)" end
  return nil, err
end

local function pack(...) return { n = select("#", ...), ... } end

local function execute(code)
  local stripped = code:match("^%s*(.-)%s*$")
  -- magics
  if stripped:sub(1, 1) == "?" and not stripped:find("\n") then
    local ok, s = pcall(repl.help, stripped:sub(2):match("^%s*(.-)%s*$"), al)
    if ok and s then io.write(s, "\n") end
    if not ok then return { status = "error", ename = "HelpError", evalue = tostring(s), traceback = { tostring(s) } } end
    return { status = "ok" }
  end
  local timing = false
  if stripped:match("^%%%%time") then
    timing, code = true, stripped:gsub("^%%%%time[^\n]*\n?", "")
  elseif stripped:match("^%%time%s") or stripped == "%time" then
    timing, code = true, stripped:sub(6)
  end
  local quiet = code:match(";%s*$") ~= nil
  local fn, has_value = compile_cell(code)
  if not fn then
    return { status = "error", ename = "SyntaxError", evalue = tostring(has_value), traceback = { tostring(has_value) } }
  end
  local sync = timing and repl.gpu_sync(al) or nil
  if sync then pcall(sync) end
  local t0 = require("attnlab.progress").clock()
  if lj_handler then ffi.C.signal(SIGINT, lj_handler) end
  local r = pack(xpcall(fn, traceback_handler, pack))
  ffi.C.signal(SIGINT, sig_ign)
  if sync and r[1] then pcall(sync) end
  local dt = require("attnlab.progress").clock() - t0
  if not r[1] then
    local e = r[2]
    local interrupted = tostring(e.msg):find("interrupted!", 1, true) ~= nil
    local tb = { e.msg }
    if not interrupted and #e.tb > 1 then
      tb[#tb + 1] = "stack traceback:"
      for _, l in ipairs(e.tb) do tb[#tb + 1] = l end
    end
    return { status = "error", ename = interrupted and "KeyboardInterrupt" or "LuaError", evalue = tostring(e.msg), traceback = tb }
  end
  if timing then
    io.write(string.format("%%time: wall %s%s\n", repl.fmt_seconds(dt),
      sync and " (GPU synchronised before and after)" or " (no GPU: CPU only)"))
  end
  local vals = {}
  if has_value then
    local v = r[2]
    for i = 1, v.n do vals[i] = v[i] end
    vals.n = v.n
  else
    vals.n = 0
  end
  if quiet or vals.n == 0 then return { status = "ok" } end
  rawset(_G, "_", vals[1])
  if vals.n == 1 then return { status = "ok", data = bundle_of(vals[1]) } end
  -- several values: as the REPL prints them (tab-separated, or one per line when one is multi-line)
  -- unless one of them is rich (a figure): then one display each, the last as the cell's result
  local bundles, texts, rich, multiline = {}, {}, false, false
  for i = 1, vals.n do
    bundles[i] = bundle_of(vals[i])
    texts[i] = bundles[i]["text/plain"]
    if next(bundles[i], nil) ~= "text/plain" or next(bundles[i], "text/plain") ~= nil then rich = true end
    if texts[i]:find("\n") then multiline = true end
  end
  if not rich then
    return { status = "ok", data = { ["text/plain"] = table.concat(texts, multiline and "\n" or "\t") } }
  end
  for i = 1, vals.n - 1 do send_display(bundles[i]) end
  return { status = "ok", data = bundles[vals.n] }
end

local function token_before(code, pos)
  local before = code:sub(1, pos)
  return before:match("[%a_][%w_%.:]*$") or ""
end

local function complete(code, pos)
  pos = pos or #code
  local tok = token_before(code, pos)
  local matches = {}
  local ok, c = pcall(repl.candidates, tok)
  if ok then
    local seen = {}
    for _, m in ipairs(c) do if not seen[m] then seen[m] = true; matches[#matches + 1] = m end end
    table.sort(matches)
  end
  return { status = "ok", matches = matches, cursor_start = pos - #tok, cursor_end = pos }
end

local function inspect(code, pos)
  pos = pos or #code
  local after = code:sub(pos + 1):match("^[%w_]*") or ""
  local tok = (token_before(code, pos) .. after):gsub("[%.:]$", "")
  if tok == "" then return { status = "ok", found = false } end
  local ok, s = pcall(repl.help, tok, al)
  if ok and s then return { status = "ok", found = true, data = { ["text/plain"] = s } } end
  return { status = "ok", found = false }
end

-- the loop
send({ type = "ready", version = al.version, jit = jit and jit.version or _VERSION })
while true do
  local req = recv()
  if req == nil then break end
  local reply
  local ok, err = pcall(function()
    if req.type == "execute" then reply = execute(req.code or "")
    elseif req.type == "complete" then reply = complete(req.code or "", req.cursor_pos)
    elseif req.type == "inspect" then reply = inspect(req.code or "", req.cursor_pos)
    elseif req.type == "shutdown" then reply = { status = "ok", bye = true }
    else reply = { status = "error", ename = "ProtocolError", evalue = "unknown request " .. tostring(req.type), traceback = {} } end
  end)
  if not ok then
    reply = { status = "error", ename = "KernelError", evalue = tostring(err), traceback = { tostring(err) } }
  end
  reply.type = "reply"
  send(reply)
  if reply.bye then break end
end
flush_all()
os.exit(0)
