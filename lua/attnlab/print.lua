--[[
attnlab.print — how tensors look as text.

  tostring(t)           one line: `attnlab.Tensor f32 [2,3,4] strides=[12,4,1] cpu`, plus
                        ` view of #<storage id>+<offset>` when the view does not cover its whole
                        storage from offset 0 (a slice, a strided or expanded view, a packed q/k/v).
  t:print(), al.print(t), t:format()
                        the values, PyTorch-style (precision 4; above `threshold` elements only the
                        first and last `edgeitems` of each long dim; aligned columns; nested brackets
                        by dim), then a Torch7-style summary line `[attnlab.Tensor f32 of size 2x3 on cpu]`.
  al.set_printoptions{precision=, threshold=, edgeitems=, linewidth=, sci_mode=}

Values are read through C (al_tensor_read_f64; a cuda tensor is staged through the host by the core).
A large tensor is never read whole for printing: only its displayed corners are read, piece by piece,
through narrowed views.

install(al) puts __tostring_impl / __print_impl / format / print into the tensor method table
(lua/attnlab/tensor.lua calls them) and al.print / al.set_printoptions into `al`.
--]]

local ffi = require "ffi"

local M = {}

local C                     -- the library namespace, set by install() (or lazily from attnlab)
local floor, abs, huge = math.floor, math.abs, math.huge
local concat, format = table.concat, string.format

local defaults = { precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80, sci_mode = nil }
local opts = {}
for k, v in pairs(defaults) do opts[k] = v end

-- al.set_printoptions{precision=, threshold=, edgeitems=, linewidth=, sci_mode=}; returns the
-- previous options. set_printoptions("default") restores the defaults.
function M.set_printoptions(o)
    local old = {}
    for k, v in pairs(opts) do old[k] = v end
    if o == "default" then
        for k in pairs(opts) do opts[k] = nil end
        for k, v in pairs(defaults) do opts[k] = v end
        return old
    end
    if type(o) ~= "table" then
        error("set_printoptions: expected a table {precision=, threshold=, edgeitems=, linewidth=, sci_mode=} or \"default\", got " .. type(o), 2)
    end
    for k, v in pairs(o) do
        if k == "sci_mode" then
            if v ~= nil and type(v) ~= "boolean" then
                error("set_printoptions: sci_mode must be a boolean or nil, got " .. type(v), 2)
            end
            opts.sci_mode = v
        elseif defaults[k] ~= nil then
            if type(v) ~= "number" or v < 0 or v ~= floor(v) then
                error(format("set_printoptions: %s must be a non-negative integer, got %s", k, tostring(v)), 2)
            end
            opts[k] = v
        else
            error("set_printoptions: unknown option '" .. tostring(k) ..
                  "' (expected precision, threshold, edgeitems, linewidth, sci_mode)", 2)
        end
    end
    return old
end

function M.get_printoptions()
    local r = {}
    for k, v in pairs(opts) do r[k] = v end
    return r
end

local function lib()
    if not C then C = require("attnlab").C end
    return C
end

-- The Lua handle is an `al_lua_tensor` (the descriptor in its field `raw`); a bare `al_tensor`
-- descriptor is accepted too.
local function descriptor(x)
    if type(x) ~= "cdata" then return nil end
    local ok, yes = pcall(ffi.istype, "al_lua_tensor", x)
    if ok and yes then return x.raw end
    ok, yes = pcall(ffi.istype, "al_tensor", x)
    if ok and yes then return x end
    return nil
end
M.descriptor = descriptor

local function is_tensor(x) return descriptor(x) ~= nil end
M.is_tensor = is_tensor

local function dtype_name(t)
    local p = lib().al_dtype_name(t.dtype)
    return p ~= nil and ffi.string(p) or ("dtype" .. tonumber(t.dtype))
end

local function device_name(t)
    if t.device_type == 0 then return "cpu" end
    if t.device_type == 1 then return "cuda:" .. tonumber(t.device_index) end
    return "device" .. tonumber(t.device_type) .. ":" .. tonumber(t.device_index)
end

local function dims(t, field)
    local r = {}
    for i = 0, t.ndim - 1 do r[#r + 1] = tostring(tonumber(t[field][i])) end
    return r
end

local function numel(t)
    local n = 1
    for i = 0, t.ndim - 1 do n = n * tonumber(t.size[i]) end
    return n
end

-- The one-line summary (tostring).
function M.summary(x)
    local t = descriptor(x)
    if t == nil then return tostring(x) end
    if t.storage == nil then return "attnlab.Tensor (released)" end
    local s = format("attnlab.Tensor %s [%s] strides=[%s] %s", dtype_name(t),
                     concat(dims(t, "size"), ","), concat(dims(t, "stride"), ","), device_name(t))
    local off, cap = tonumber(t.offset), tonumber(t.storage_numel)
    if off ~= 0 or numel(t) ~= cap then
        s = s .. format(" view of #%d+%d", tonumber(t.storage_id), off)
    end
    return s
end

-- The closing line of the value printout, Torch7 style.
function M.footer(x)
    local t = descriptor(x)
    local shape = t.ndim == 0 and "scalar" or ("of size " .. concat(dims(t, "size"), "x"))
    return format("[attnlab.Tensor %s %s on %s]", dtype_name(t), shape, device_name(t))
end

--------------------------------------------------------------------------------------------------
-- Reading the displayed values: a dense "reduced" array over the kept indices of every dim.
-- A dim longer than 2*edgeitems (when summarising) keeps its first and last edgeitems indices.
--------------------------------------------------------------------------------------------------
local function read_values(t, summarise, edge)
    local c = lib()
    local nd = t.ndim
    local segs, rsize = {}, {}     -- per dim: list of {start, len, reduced_start}; reduced extents
    for d = 0, nd - 1 do
        local n = tonumber(t.size[d])
        if summarise and n > 2 * edge then
            segs[d] = { { 0, edge, 0 }, { n - edge, edge, edge } }
            rsize[d] = 2 * edge
        else
            segs[d] = { { 0, n, 0 } }
            rsize[d] = n
        end
    end
    local rstride, total = {}, 1
    for d = nd - 1, 0, -1 do rstride[d] = total; total = total * rsize[d] end
    local vals = {}                -- 0-based dense row-major over rsize

    local piece_start = {}
    local function leaf(v)
        local n = numel(v)
        if n == 0 then return end
        local buf = ffi.new("double[?]", n)
        local st = c.al_tensor_read_f64(v, buf, n)
        if st ~= 0 then
            error("print: cannot read tensor values: " .. ffi.string(c.al_last_error()), 0)
        end
        -- walk the piece in row-major order, mapping to reduced indices
        local idx = {}
        for d = 0, nd - 1 do idx[d] = 0 end
        for i = 0, n - 1 do
            local r = 0
            for d = 0, nd - 1 do r = r + (piece_start[d] + idx[d]) * rstride[d] end
            vals[r] = buf[i]
            for d = nd - 1, 0, -1 do
                idx[d] = idx[d] + 1
                if idx[d] < tonumber(v.size[d]) then break end
                idx[d] = 0
            end
        end
    end

    local function rec(v, d)
        if d == nd then return leaf(v) end
        local s = segs[d]
        if #s == 1 then
            piece_start[d] = 0
            return rec(v, d + 1)
        end
        for _, seg in ipairs(s) do
            local tmp = ffi.new("al_tensor")
            local st = c.al_tensor_narrow(tmp, v, d, seg[1], seg[2])
            if st ~= 0 then
                error("print: cannot narrow for display: " .. ffi.string(c.al_last_error()), 0)
            end
            piece_start[d] = seg[3]
            local ok, err = pcall(rec, tmp, d + 1)
            c.al_tensor_release(tmp)
            if not ok then error(err, 0) end
        end
    end
    rec(t, 0)
    return vals, rsize, rstride, total
end

--------------------------------------------------------------------------------------------------
-- Number formatting, after PyTorch's _Formatter: one format for all displayed values.
--------------------------------------------------------------------------------------------------
local function special(v)
    if v ~= v then return "nan" end
    if v == huge then return "inf" end
    if v == -huge then return "-inf" end
end

local function make_formatter(vals, total, is_float)
    local p = opts.precision
    local fmt
    if not is_float then
        fmt = function(v) return special(v) or format("%d", v) end
    else
        local int_mode, maxa, mina = true, 0, huge
        for i = 0, total - 1 do
            local v = vals[i]
            if v == v and v ~= huge and v ~= -huge then
                if v ~= floor(v) then int_mode = false end
                local a = abs(v)
                if a ~= 0 then
                    if a > maxa then maxa = a end
                    if a < mina then mina = a end
                end
            end
        end
        if mina == huge then mina, maxa = 0, 0 end
        local sci
        if opts.sci_mode ~= nil then
            sci = opts.sci_mode
        elseif int_mode then
            sci = maxa > 1e8 or (mina > 0 and maxa / mina > 1000)
        else
            sci = maxa > 1e8 or (mina > 0 and (maxa / mina > 1000 or mina < 1e-4))
        end
        if sci then
            local f = "%." .. p .. "e"
            fmt = function(v) return special(v) or format(f, v) end
        elseif int_mode then
            fmt = function(v) return special(v) or (format("%.0f", v) .. ".") end
        else
            local f = "%." .. p .. "f"
            fmt = function(v) return special(v) or format(f, v) end
        end
    end
    local strs, width = {}, 1
    for i = 0, total - 1 do
        local s = fmt(vals[i])
        strs[i] = s
        if #s > width then width = #s end
    end
    return strs, width
end

--------------------------------------------------------------------------------------------------
-- Layout: nested brackets, "..." where a dim was summarised, rows wrapped at linewidth.
--------------------------------------------------------------------------------------------------
local function layout(strs, width, rsize, rstride, nd, summarised, edge)
    local pad = "%" .. width .. "s"
    local function cell(i) return format(pad, strs[i]) end
    local function elided(d) return summarised[d] end

    local function block(d, base, indent)
        local n = rsize[d]
        if d == nd - 1 then
            local items = {}
            for i = 0, n - 1 do
                if elided(d) and i == edge then items[#items + 1] = "..." end
                items[#items + 1] = cell(base + i * rstride[d])
            end
            local per_line = math.max(1, floor((opts.linewidth - indent - 1) / (width + 2)))
            if #items <= per_line then return "[" .. concat(items, ", ") .. "]" end
            local lines = {}
            for i = 1, #items, per_line do
                lines[#lines + 1] = concat(items, ", ", i, math.min(i + per_line - 1, #items))
            end
            return "[" .. concat(lines, ",\n" .. string.rep(" ", indent + 1)) .. "]"
        end
        local sep = "," .. string.rep("\n", nd - 1 - d) .. string.rep(" ", indent + 1)
        local parts = {}
        for i = 0, n - 1 do
            if elided(d) and i == edge then parts[#parts + 1] = "..." end
            parts[#parts + 1] = block(d + 1, base + i * rstride[d], indent + 1)
        end
        return "[" .. concat(parts, sep) .. "]"
    end
    return block(0, 0, 0)
end

-- The values as text (without the summary line).
function M.values(x)
    local t = descriptor(x)
    if t == nil then error("format: expected a tensor, got " .. type(x), 2) end
    if t.storage == nil then return "(released tensor)" end
    local n = numel(t)
    if n == 0 then return "[]" end
    local summarise = n > opts.threshold
    local edge = opts.edgeitems
    local vals, rsize, rstride, total = read_values(t, summarise, edge)
    local is_float = lib().al_dtype_is_float(t.dtype) ~= 0
    local strs, width = make_formatter(vals, total, is_float)
    if t.ndim == 0 then return strs[0] end
    local summarised = {}
    for d = 0, t.ndim - 1 do summarised[d] = rsize[d] < tonumber(t.size[d]) end
    return layout(strs, width, rsize, rstride, t.ndim, summarised, edge)
end

-- Values and the summary line: what t:print() shows.
function M.format(t)
    return M.values(t) .. "\n" .. M.footer(t)
end

function M.print_tensor(t)
    io.write(M.format(t), "\n")
end

-- al.print(...): tensors with their values, anything else as print() would.
function M.print(...)
    local n = select("#", ...)
    local args = { ... }
    for i = 1, n do
        local v = args[i]
        if is_tensor(v) then
            io.write(M.format(v), "\n")
        else
            io.write(tostring(v), i < n and "\t" or "\n")
        end
    end
    if n == 0 then io.write("\n") end
end

function M.install(al)
    if al and al.C then C = al.C end
    local methods = require("attnlab.tensor").methods
    methods.__tostring_impl = M.summary
    methods.__print_impl = M.print_tensor
    methods.format = M.format
    if methods.print == nil then methods.print = M.print_tensor end
    if al then
        al.print = M.print
        al.set_printoptions = M.set_printoptions
        al.get_printoptions = M.get_printoptions
    end
    return M
end

return M
