--[[
attnlab.repl — the `attnlab` command: an interactive LuaJIT REPL with `al` loaded, and the script runner.

  attnlab                    REPL (line editing and history through libreadline.so.8 when stdin is a
                             terminal; plain line reading otherwise, so `attnlab < cmds.lua` and pipes work)
  attnlab file.lua a b ...   run a script: `al` is a global, arg[0] = "file.lua", arg[1] = "a", ...
  attnlab -e 'code' ...      evaluate code as a REPL line would (values printed); several -e allowed
  attnlab -i file.lua        run the script, then stay in the REPL
  attnlab -h | -v

In the REPL
  - an expression prints its value without '=' (`1+1` prints 2); a trailing ';' suppresses printing;
    `_` holds the last value printed
  - tensors print their values and a summary line; tables print nested (bounded depth)
  - an incomplete chunk ('<eof>' errors) continues on the next line (prompt `..>`)
  - errors print their message and the REPL carries on; Ctrl-C at the prompt is ignored, and during
    a command it interrupts it (LuaJIT's "interrupted!" error) without leaving the REPL
  - at the interactive prompt, a command that takes longer than 0.1 s reports its wall time (not when
    stdin is piped or with -e: a script's output must not depend on how loaded the machine is)
  - `?name` prints help for name (al.help when present, else the comment above the function's
    definition and its parameters, the text docs/REFERENCE.md is generated from; for al.C.al_*
    functions, their comment in include/attnlab.h); `?` alone lists these commands; `$ cmd` runs a
    shell command
  - `%time code` runs code once and prints its wall time, with al.cuda.synchronize() before the clock
    starts and before it is read when a GPU is usable (a GPU call returns before its kernel finishes)
  - Tab completes global names, table fields (`al.att<Tab>`), tensor methods (`t:tr<Tab>`) and,
    inside a string, file names; history lives in ~/.attnlab_history (ATTNLAB_HISTORY overrides)
  - when stdin is not a terminal there are no prompts and no banner, and the exit status is 1 if
    any command failed
--]]

local ffi = require "ffi"

local M = {}

local unpack = unpack
local concat, format = table.concat, string.format
-- Exit through lua_close (os.exit's second argument) so every tensor's finalizer runs: LeakSanitizer
-- (make test-asan) then reports only real leaks, not the tensors still referenced when a script ends.
local function exit(code)
  io.stdout:flush()
  os.exit(code, true)
end

--------------------------------------------------------------------------------------------------
-- C declarations (each guarded: another module may have declared the same name already)
--------------------------------------------------------------------------------------------------
local function cdef(s) pcall(ffi.cdef, s) end
cdef "int isatty(int fd);"
cdef "void free(void *p);"
cdef "char *strdup(const char *s);"
cdef "typedef void (*al_repl_sighandler_t)(int);"
cdef "al_repl_sighandler_t signal(int signum, al_repl_sighandler_t handler);"
cdef "typedef struct { long tv_sec; long tv_nsec; } al_repl_timespec;"
cdef "int clock_gettime(int clk_id, al_repl_timespec *tp);"

local function stdin_is_tty()
    local ok, r = pcall(function() return ffi.C.isatty(0) end)
    return ok and r == 1
end

local now
do
    local ok = pcall(function()
        local ts = ffi.new("al_repl_timespec")
        assert(ffi.C.clock_gettime(1, ts) == 0)       -- CLOCK_MONOTONIC
        now = function()
            ffi.C.clock_gettime(1, ts)
            return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
        end
    end)
    if not ok then now = os.clock end
end

--------------------------------------------------------------------------------------------------
-- Loading attnlab. If it fails (library not built, ...), `al` becomes a stand-in that raises the
-- load error when used, so plain Lua still works in the REPL and in scripts that do not need it.
--------------------------------------------------------------------------------------------------
local function load_al()
    local ok, al = pcall(require, "attnlab")
    if ok then return al, nil end
    local msg = tostring(al)
    local stub = setmetatable({}, {
        __index = function(_, k)
            error("attnlab failed to load, so al." .. tostring(k) .. " is unavailable:\n" .. msg, 2)
        end,
        __tostring = function() return "attnlab (failed to load: " .. msg .. ")" end,
    })
    return stub, msg
end

local function tensor_methods()
    local ok, T = pcall(require, "attnlab.tensor")
    if ok and type(T) == "table" and type(T.methods) == "table" then return T.methods end
    return {}
end

-- Tensor handles are `al_lua_tensor` cdata (descriptor in .raw); bare `al_tensor` structs count too.
local function is_tensor(v)
    if type(v) ~= "cdata" then return false end
    for _, ct in ipairs { "al_lua_tensor", "al_tensor" } do
        local ok, yes = pcall(ffi.istype, ct, v)
        if ok and yes then return true end
    end
    return false
end

--------------------------------------------------------------------------------------------------
-- Pretty printing of values
--------------------------------------------------------------------------------------------------
local MAX_DEPTH, MAX_ITEMS, WIDTH = 3, 60, 80

local keywords = {}
for w in ([[and break do else elseif end false for function goto if in local nil not or repeat
            return then true until while]]):gmatch("%S+") do keywords[w] = true end

local function is_ident(k)
    return type(k) == "string" and k:match("^[%a_][%w_]*$") and not keywords[k]
end

local function tensor_line(v)
    local ok, s = pcall(tostring, v)
    return ok and s or "<tensor: " .. tostring(s) .. ">"
end

local function key_order(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then
        if ta == "number" then return true end
        if tb == "number" then return false end
        return ta < tb
    end
    if ta == "number" or ta == "string" then return a < b end
    return tostring(a) < tostring(b)
end

-- A table (or any value) as text, nested up to MAX_DEPTH; tensors inside as their one-line summary.
local function pretty(v, depth, seen, indent)
    local tv = type(v)
    if tv == "string" then return (format("%q", v):gsub("\\\n", "\\n")) end
    if tv == "cdata" and is_tensor(v) then return tensor_line(v) end
    if tv ~= "table" then return tostring(v) end
    local mt = getmetatable(v)
    if type(mt) == "table" and rawget(mt, "__tostring") then
        local ok, s = pcall(tostring, v)
        if ok then return s end
    end
    if seen[v] then return "<cycle: " .. tostring(v) .. ">" end
    if depth >= MAX_DEPTH then
        return next(v) == nil and "{}" or "{...}"
    end
    seen[v] = true
    local parts, n = {}, #v
    for i = 1, math.min(n, MAX_ITEMS) do
        parts[#parts + 1] = pretty(v[i], depth + 1, seen, indent .. "  ")
    end
    local keys = {}
    for k in pairs(v) do
        if not (type(k) == "number" and k >= 1 and k <= n and k == math.floor(k)) then
            keys[#keys + 1] = k
        end
    end
    table.sort(keys, key_order)
    for i = 1, #keys do
        if #parts >= MAX_ITEMS then break end
        local k = keys[i]
        local ks = is_ident(k) and k or ("[" .. pretty(k, MAX_DEPTH, seen, indent) .. "]")
        parts[#parts + 1] = ks .. " = " .. pretty(v[k], depth + 1, seen, indent .. "  ")
    end
    local more = (n + #keys) - #parts
    if more > 0 then parts[#parts + 1] = format("... (%d more)", more) end
    seen[v] = nil
    if #parts == 0 then return "{}" end
    local flat = "{" .. concat(parts, ", ") .. "}"
    if #flat + #indent <= WIDTH and not flat:find("\n") then return flat end
    return "{\n" .. indent .. "  " .. concat(parts, ",\n" .. indent .. "  ") .. "\n" .. indent .. "}"
end

-- What the REPL prints for one value: tensors in full, strings raw, tables nested.
function M.render(v)
    if is_tensor(v) then
        local ok, P = pcall(require, "attnlab.print")
        if ok then
            local ok2, s = pcall(P.format, v)
            if ok2 then return s end
            return tensor_line(v) .. "\n(values unavailable: " .. tostring(s) .. ")"
        end
        return tensor_line(v)
    end
    if type(v) == "string" then return v end
    return pretty(v, 0, {}, "")
end
M.pretty = function(v) return pretty(v, 0, {}, "") end

--------------------------------------------------------------------------------------------------
-- Evaluation
--------------------------------------------------------------------------------------------------
local function pack(...) return { n = select("#", ...), ... } end

-- Compile a chunk of input. Expressions first: "return PACK(<chunk>\n)" (PACK is passed in as the
-- chunk's vararg, so error() inside the expression is not a tail call and keeps its position; the
-- newline lets a trailing comment through). Then the chunk as statements.
-- Returns fn, is_expression; or nil, "incomplete"; or nil, error message.
local PACK_PREFIX = "local __attnlab_repl_pack = ...; return __attnlab_repl_pack("
local function compile(chunk, name)
    local expr = chunk:gsub(";%s*$", "")
    local fn, experr = loadstring(PACK_PREFIX .. expr .. "\n)", name)
    if fn then return fn, true end
    local err
    fn, err = loadstring(chunk, name)
    if fn then return fn, false end
    if err:match("<eof>'?$") then return nil, "incomplete" end
    -- A statement parse that fails with "'=' expected" or at the first token means the input was
    -- meant as an expression: the expression parse then says more (unless it tripped on our wrapper).
    local first = chunk:match("^%s*([%w_]+)") or chunk:match("^%s*(%p)")
    local at_first = first and err:find("near '" .. first .. "'", 1, true)
    if (err:find("'=' expected", 1, true) or at_first)
       and not experr:find("')' expected", 1, true) and not experr:find("__attnlab_repl_pack", 1, true)
       and (tonumber(experr:match("^[^:]*:(%d+):")) or 1) <= select(2, chunk:gsub("\n", "")) + 1 then
        return nil, experr
    end
    return nil, err
end

M.compile = compile

-- Keep the traceback lines above the REPL's own xpcall.
local function handler(e)
    local msg = type(e) == "string" and e or M.pretty(e)
    local tb = debug.traceback("", 2)
    local lines = {}
    for line in tb:gmatch("[^\n]+") do
        if line:find("in function 'xpcall'", 1, true) then break end
        if not line:match("^stack traceback:") and line ~= "" then lines[#lines + 1] = line end
    end
    -- Errors raised straight from the typed chunk need no traceback; deeper ones get it.
    local deep = false
    for _, l in ipairs(lines) do
        if not (l:match("^%s*%[C%]: in function 'error'") or l:match("^%s*%[C%]: in function 'assert'")
                or l:match("^%s*stdin:%d+: in main chunk") or l:match("^%s*%(command line%)")) then
            deep = true
        end
    end
    if deep and not msg:match("^stdin:") then
        msg = msg .. "\nstack traceback:\n" .. concat(lines, "\n")
    end
    return msg
end

local function print_error(msg)
    io.stdout:flush()
    io.stderr:write(msg, "\n")
    io.stderr:flush()
end

-- A function that waits for the GPU (al.cuda.synchronize()) when one is usable, else nil.
function M.gpu_sync(al)
    local ok, avail = pcall(function() return al.cuda.available() end)
    if ok and avail then return function() al.cuda.synchronize() end end
    return nil
end

local function fmt_seconds(dt)
    if dt < 1e-3 then return format("%.1f us", dt * 1e6) end
    if dt < 1 then return format("%.3f ms", dt * 1e3) end
    return format("%.3f s", dt)
end
M.fmt_seconds = fmt_seconds

-- Run one complete chunk; print its values unless `quiet`. Returns true on success.
-- `timing` (the %time command): {sync = function or nil}: the GPU is synchronised before the clock
-- starts and again before it is read, and the wall time is always printed. `report_slow`: print
-- "(N s)" after a command slower than 0.1 s (the interactive prompt only).
function M.run_chunk(fn, quiet, is_expr, timing, report_slow)
    if timing and timing.sync then pcall(timing.sync) end
    local t0 = now()
    local r = pack(xpcall(fn, handler, pack))
    if timing and timing.sync and r[1] then
        local oks, err = pcall(timing.sync)
        if not oks then r = { n = 2, false, "%time: cuda.synchronize failed: " .. tostring(err) } end
    end
    local dt = now() - t0
    if not r[1] then
        print_error(tostring(r[2]))
        return false
    end
    if is_expr then
        local v = r[2]
        r = { n = v.n + 1, true }
        for i = 1, v.n do r[i + 1] = v[i] end
    end
    if not quiet and r.n > 1 then
        local outs, multiline = {}, false
        for i = 2, r.n do
            local ok, s = pcall(M.render, r[i])
            s = ok and s or ("<unprintable: " .. tostring(s) .. ">")
            if s:find("\n") then multiline = true end
            outs[#outs + 1] = s
        end
        io.write(concat(outs, multiline and "\n" or "\t"), "\n")
        rawset(_G, "_", r[2])
    end
    if timing then
        io.write(format("%%time: wall %s%s\n", fmt_seconds(dt),
            timing.sync and " (GPU synchronised before and after)" or " (no GPU: CPU only)"))
    elseif report_slow and dt > 0.1 then
        io.write(format("(%.3f s)\n", dt))
    end
    io.stdout:flush()
    return true, dt
end

-- `%time code`: run code once and print its values and its wall time, synchronising the GPU
-- (al.cuda.synchronize()) before starting and before reading the clock, so asynchronous kernel
-- launches are counted in full. Returns true on success and the seconds taken.
function M.time(code, al, name)
    local fn, err = M.compile(code, name or "=stdin")
    if not fn then
        print_error(err == "incomplete" and "%time: incomplete code (put it on one line)" or err)
        return false
    end
    return M.run_chunk(fn, code:match(";%s*$") ~= nil, err, { sync = M.gpu_sync(al) })
end

--------------------------------------------------------------------------------------------------
-- ?name help
--------------------------------------------------------------------------------------------------
local REPL_HELP = [[
attnlab REPL
  <expression>        prints its value (no '=' needed); end a line with ';' to print nothing
  _                   the last value printed
  ?name               help on name, e.g. ?al.randn  ?t.view  (t a tensor: its methods)  ?al.C.al_tensor_select
  %time code          run code once and print its wall time (the GPU synchronised before and after)
  $ command           run a shell command
  Tab                 complete names, fields and tensor methods (file names inside strings)
  Ctrl-D, exit        quit (history is kept in ~/.attnlab_history)]]

-- Comment lines right above a function's definition in its source file.
local function source_comment(info)
    local file = info.source and info.source:match("^@(.*)")
    if not file or not info.linedefined or info.linedefined < 1 then return nil end
    local f = io.open(file, "r")
    if not f then return nil end
    local lines, i = {}, 0
    for line in f:lines() do
        i = i + 1
        if i >= info.linedefined then break end
        lines[i] = line
    end
    f:close()
    local doc = {}
    for j = info.linedefined - 1, 1, -1 do
        local c = lines[j] and lines[j]:match("^%s*%-%-+%s?(.*)$")
        if not c or lines[j]:match("^%s*%-%-%[%[") then break end
        table.insert(doc, 1, c)
    end
    return #doc > 0 and concat(doc, "\n") or nil
end

local function describe_function(f, name)
    local info = debug.getinfo(f, "Su")
    if info.what == "C" then return name .. ": a built-in (C) function" end
    local params = {}
    for i = 1, info.nparams or 20 do
        local p = debug.getlocal(f, i)
        if not p then break end
        params[#params + 1] = p
    end
    if info.isvararg then params[#params + 1] = "..." end
    local head = format("%s(%s)    -- %s:%d", name, concat(params, ", "),
                        (info.short_src or "?"), info.linedefined or 0)
    local doc = source_comment(info)
    return doc and (head .. "\n" .. doc) or head
end

function M.help(name, al)
    if name == "" then return REPL_HELP end
    -- C functions: their comment in include/attnlab.h (the same text as docs/REFERENCE.md)
    local cname = name:match("^al%.C%.([%w_]+)$") or name:match("^(al_[%w_]+)$")
    if cname then
        local okd, apidoc = pcall(require, "attnlab.apidoc")
        local entry = okd and apidoc.c_function(cname)
        if entry then return entry.decl .. (entry.comment ~= "" and ("\n" .. entry.comment) or "") end
    end
    local fn = loadstring("return " .. name, "=help")
    if not fn then return "?" .. name .. ": not a name or expression" end
    local ok, v = pcall(fn)
    -- `?t.view` where t is a tensor: look the method up in the tensor method table
    if (not ok or v == nil) and name:match("^[%w_%.]+[%.:]([%w_]+)$") then
        local base, field = name:match("^(.+)[%.:]([%w_]+)$")
        local okb, b = pcall(loadstring("return " .. base, "=help"))
        if okb and is_tensor(b) then
            ok, v = true, tensor_methods()[field]
        end
    end
    if not ok then return "?" .. name .. ": " .. tostring(v) end
    if al and type(rawget(al, "help")) == "function" then
        local okh, s = pcall(al.help, v, name)
        if okh and type(s) == "string" then return s end
        if okh then return nil end          -- al.help printed it itself
    end
    if al and type(rawget(al, "docs")) == "table" then
        local d = al.docs[name] or al.docs[name:gsub("^al%.", "")]
        if d then return d end
    end
    if type(v) == "function" then return describe_function(v, name) end
    if is_tensor(v) then
        local names = {}
        for k in pairs(tensor_methods()) do
            if type(k) == "string" and not k:match("^__") then names[#names + 1] = k end
        end
        table.sort(names)
        return tensor_line(v) .. "\nmethods: " .. concat(names, " ")
    end
    if type(v) == "table" then
        local names = {}
        for k, x in pairs(v) do names[#names + 1] = tostring(k) .. (type(x) == "function" and "()" or "") end
        table.sort(names)
        return name .. ": a table with fields " .. concat(names, " ")
    end
    return name .. ": " .. type(v) .. " " .. M.render(v)
end

--------------------------------------------------------------------------------------------------
-- Readline through the FFI, with completion
--------------------------------------------------------------------------------------------------
local rl, rl_anchor = nil, {}

local function load_readline()
    if os.getenv("ATTNLAB_NO_READLINE") then return nil end
    local ok, lib = pcall(ffi.load, "libreadline.so.8")
    if not ok then ok, lib = pcall(ffi.load, "readline") end
    if not ok then return nil end
    cdef [[
        char *readline(const char *prompt);
        void add_history(const char *line);
        int read_history(const char *filename);
        int append_history(int nelements, const char *filename);
        int history_truncate_file(const char *filename, int nlines);
        typedef char *al_rl_compentry_func_t(const char *text, int state);
        extern al_rl_compentry_func_t *rl_completion_entry_function;
        extern const char *rl_basic_word_break_characters;
        extern int rl_completion_append_character;
        extern char *rl_line_buffer;
        extern int rl_point;
        extern const char *rl_readline_name;
        char *rl_filename_completion_function(const char *text, int state);
    ]]
    local okr = pcall(function() return lib.readline end)
    if not okr then return nil end
    return lib
end

-- Names that complete `text`: globals, fields of a dotted path, tensor methods after ':'.
local function candidates(text)
    local out = {}
    local path, sep, partial = text:match("^([%a_][%w_%.:]-)([%.:])([%w_]*)$")
    local function add_keys(t, prefix, only_functions, seen)
        seen = seen or {}
        local guard = 0
        while type(t) == "table" and not seen[t] and guard < 8 do
            seen[t] = true
            guard = guard + 1
            for k, v in pairs(t) do
                if type(k) == "string" and k:sub(1, #partial) == partial and is_ident(k)
                   and not k:match("^__") and (not only_functions or type(v) == "function") then
                    out[#out + 1] = prefix .. k
                end
            end
            local mt = getmetatable(t)
            t = type(mt) == "table" and rawget(mt, "__index") or nil
        end
    end
    if not path then
        partial = text
        if not text:match("^[%a_]?[%w_]*$") then return out end
        add_keys(_G, "")
        for k in pairs(keywords) do
            if k:sub(1, #text) == text then out[#out + 1] = k end
        end
        return out
    end
    -- walk the identifier chain without calling anything but __index
    local v = _G
    for seg in path:gmatch("[^%.:]+") do
        local ok, nv
        if is_tensor(v) then
            nv = tensor_methods()[seg]
        elseif type(v) == "table" or type(v) == "cdata" then
            ok, nv = pcall(function() return v[seg] end)
            if not ok then return out end
        else
            return out
        end
        v = nv
    end
    local prefix = path .. sep
    if is_tensor(v) then
        add_keys(tensor_methods(), prefix, sep == ":")
        if sep == "." and ("raw"):sub(1, #partial) == partial then out[#out + 1] = prefix .. "raw" end
    elseif type(v) == "string" then
        add_keys(string, prefix, true)
    elseif type(v) == "table" then
        add_keys(v, prefix, sep == ":")
    end
    return out
end
M.candidates = candidates

local function in_string()
    local line = ffi.string(rl.rl_line_buffer, rl.rl_point)
    local q, i = nil, 1
    while i <= #line do
        local c = line:sub(i, i)
        if q then
            if c == "\\" then i = i + 1 elseif c == q then q = nil end
        elseif c == '"' or c == "'" then
            q = c
        end
        i = i + 1
    end
    return q ~= nil
end

local function setup_completion()
    local matches, idx, files = {}, 0, false
    local cb = ffi.cast("al_rl_compentry_func_t *", function(ctext, state)
        local ok, r = pcall(function()
            if state == 0 then
                rl.rl_completion_append_character = 0
                files = in_string()
                if not files then
                    local seen, uniq = {}, {}
                    for _, m in ipairs(candidates(ffi.string(ctext))) do
                        if not seen[m] then seen[m] = true; uniq[#uniq + 1] = m end
                    end
                    table.sort(uniq)
                    matches, idx = uniq, 0
                end
            end
            if files then return rl.rl_filename_completion_function(ctext, state) end
            idx = idx + 1
            local m = matches[idx]
            if m == nil then return nil end
            return ffi.C.strdup(m)
        end)
        if ok then return r end
        return nil
    end)
    rl_anchor.cb = cb                       -- never collected: readline holds the pointer
    rl.rl_completion_entry_function = cb
    -- '.' and ':' are not word breaks, so "al.att" reaches the completer whole
    rl_anchor.breaks = ffi.new("char[?]", 40, " \t\n\"\\'`@$><=;|&{(,)[]+-*/%^~#")
    rl.rl_basic_word_break_characters = rl_anchor.breaks
    rl_anchor.name = ffi.new("char[?]", 8, "attnlab")
    rl.rl_readline_name = rl_anchor.name
end

--------------------------------------------------------------------------------------------------
-- Ctrl-C: ignored while waiting at the prompt; during a command LuaJIT's own handler (installed by
-- the luajit binary around the main chunk) raises "interrupted!", which the REPL's xpcall catches.
--------------------------------------------------------------------------------------------------
local SIGINT = 2
local sig_ign, lj_handler
local function sigint_ignore()
    local ok = pcall(function()
        sig_ign = sig_ign or ffi.cast("al_repl_sighandler_t", 1)
        local old = ffi.C.signal(SIGINT, sig_ign)
        -- remember LuaJIT's handler (it resets itself to SIG_DFL after firing once)
        local addr = tonumber(ffi.cast("intptr_t", old))
        if lj_handler == nil and addr > 1 then lj_handler = old end
    end)
    return ok
end
local function sigint_restore()
    if lj_handler then pcall(ffi.C.signal, SIGINT, lj_handler) end
end

--------------------------------------------------------------------------------------------------
-- The loop
--------------------------------------------------------------------------------------------------
local function history_path()
    local p = os.getenv("ATTNLAB_HISTORY")
    if p then return p end
    local home = os.getenv("HOME")
    return home and (home .. "/.attnlab_history") or nil
end

function M.loop(al, interactive)
    local read_line, hist
    local last_hist
    if interactive then rl = load_readline() end
    if rl then
        hist = history_path()
        if hist then
            local f = io.open(hist, "a")
            if f then f:close() else hist = nil end
        end
        if hist then
            rl.history_truncate_file(hist, 5000)
            rl.read_history(hist)
        end
        pcall(setup_completion)
        read_line = function(prompt)
            sigint_ignore()
            local p = rl.readline(prompt)
            sigint_restore()
            if p == nil then return nil end
            local s = ffi.string(p)
            ffi.C.free(p)
            if s:match("%S") and s ~= last_hist then
                rl.add_history(s)
                last_hist = s
                if hist then rl.append_history(1, hist) end
            end
            return s
        end
    elseif interactive then
        read_line = function(prompt)
            io.write(prompt)
            io.flush()
            sigint_ignore()
            local s = io.read("*l")
            sigint_restore()
            return s
        end
    else
        read_line = function() return io.read("*l") end
    end

    local failed = false
    local buf = nil
    while true do
        local line = read_line(buf and "..> " or "al> ")
        if line == nil then
            if interactive then io.write("\n") end
            break
        end
        if buf == nil then
            local trimmed = line:match("^%s*(.-)%s*$")
            if trimmed == "exit" or trimmed == "quit" then break end
            if trimmed:match("^%%time%s") or trimmed == "%time" then
                if not M.time(trimmed:sub(6), al) then failed = true end
                line = nil
            elseif trimmed:sub(1, 1) == "?" then
                local ok, s = pcall(M.help, trimmed:sub(2):match("^%s*(.-)%s*$"), al)
                if ok and s then io.write(s, "\n") elseif not ok then print_error(tostring(s)) end
                io.stdout:flush()
                line = nil
            elseif trimmed:sub(1, 1) == "$" then
                io.stdout:flush()
                os.execute(trimmed:sub(2))
                line = nil
            elseif trimmed == "" then
                line = nil
            end
        end
        if line ~= nil then
            local chunk = buf and (buf .. "\n" .. line) or line
            local fn, err = compile(chunk, "=stdin")
            if fn then
                buf = nil
                local quiet = chunk:match(";%s*$") ~= nil
                if not M.run_chunk(fn, quiet, err, nil, interactive) then failed = true end
            elseif err == "incomplete" then
                buf = chunk
            else
                buf = nil
                print_error(err)
                failed = true
            end
        end
    end
    if buf then
        local _, err = loadstring(buf, "=stdin")
        print_error(err or "incomplete input at end of file")
        failed = true
    end
    return not failed
end

--------------------------------------------------------------------------------------------------
-- Command line
--------------------------------------------------------------------------------------------------
local USAGE = [[
usage: attnlab                    start the REPL (al = require "attnlab" is loaded)
       attnlab file.lua [args]    run a script (al is a global; arg[0] = file.lua, arg[1..] = args)
       attnlab -e 'code' [...]    evaluate code and print its values (-e may repeat)
       attnlab -i [file.lua]      run the script (if any), then start the REPL
       attnlab -h | -v            this help | versions
environment: ATTNLAB_LIBDIR (where libattnlab.so lives), ATTNLAB_HISTORY, ATTNLAB_NO_READLINE]]

local function version_line(al, load_err)
    local v = "?"
    if not load_err then
        local ok, s = pcall(function() return ffi.string(al.C.al_version()) end)
        if ok then v = s end
    end
    local line = format("attnlab %s on %s", v, jit and jit.version or _VERSION)
    if load_err then return line .. " (attnlab failed to load: " .. load_err .. ")" end
    local ok, avail, why = pcall(function() return al.cuda.available() end)
    if ok then
        line = line .. (avail and " · cuda available" or (" · cpu only (" .. tostring(why) .. ")"))
    end
    return line
end

local function run_script(file, args)
    local fn, err = loadfile(file)
    if not fn then
        print_error("attnlab: " .. tostring(err))
        return false
    end
    local a = { [0] = file }
    for i = 1, #args do a[i] = args[i] end
    a[-1] = rawget(_G, "arg") and rawget(_G, "arg")[-1] or "luajit"
    rawset(_G, "arg", a)
    local ok, msg = xpcall(function() return fn(unpack(args)) end, function(e)
        return debug.traceback(type(e) == "string" and e or M.pretty(e), 2)
    end)
    if not ok then
        -- drop the launcher's own frames
        msg = msg:gsub("\n%s*%[C%]: in function 'xpcall'.*$", "")
        print_error("attnlab: " .. msg)
        return false
    end
    return true
end

function M.main(argv)
    argv = argv or {}
    local al, load_err = load_al()
    rawset(_G, "al", al)

    local evals, script, script_args, interactive_after = {}, nil, {}, false
    local i = 1
    while i <= #argv do
        local a = argv[i]
        if a == "-e" then
            if argv[i + 1] == nil then print_error("attnlab: -e needs an argument\n" .. USAGE); exit(2) end
            evals[#evals + 1] = argv[i + 1]
            i = i + 2
        elseif a == "-i" then
            interactive_after = true
            i = i + 1
        elseif a == "-h" or a == "--help" then
            io.write(USAGE, "\n")
            exit(0)
        elseif a == "-v" or a == "--version" then
            io.write(version_line(al, load_err), "\n")
            exit(0)
        elseif a == "--" then
            script = argv[i + 1]
            for j = i + 2, #argv do script_args[#script_args + 1] = argv[j] end
            break
        elseif a:sub(1, 1) == "-" and a ~= "-" then
            print_error("attnlab: unknown option " .. a .. "\n" .. USAGE)
            exit(2)
        else
            script = a
            for j = i + 1, #argv do script_args[#script_args + 1] = argv[j] end
            break
        end
    end

    local ok = true
    for _, code in ipairs(evals) do
        local fn, err = compile(code, "=(command line)")
        if not fn then
            print_error("attnlab: " .. (err == "incomplete" and "incomplete code in -e" or err))
            exit(1)
        end
        if not M.run_chunk(fn, code:match(";%s*$") ~= nil, err) then exit(1) end
    end
    if script then
        if script == "-" then script = nil end     -- `attnlab -` : read commands from stdin
        if script then
            ok = run_script(script, script_args)
            if not interactive_after then exit(ok and 0 or 1) end
        end
    elseif #evals > 0 and not interactive_after then
        exit(0)
    end

    local interactive = stdin_is_tty()
    if interactive then
        io.write(version_line(al, load_err), "\n")
        io.write("al = require \"attnlab\" is loaded · ?name for help · Ctrl-D to quit\n")
    elseif load_err then
        print_error("attnlab: warning: attnlab failed to load: " .. load_err)
    end
    local loop_ok = M.loop(al, interactive)
    io.stdout:flush()
    exit((ok and (loop_ok or interactive)) and 0 or 1)
end

-- Run as the program (`luajit repl.lua ...`), not when required as a module.
if ... ~= "attnlab.repl" then
    M.main({ ... })
end

return M
