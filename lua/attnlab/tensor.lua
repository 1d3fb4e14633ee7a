--[[
attnlab.tensor — the Lua tensor: creation, queries, views, copies, devices, memory.

A tensor handle is an `al_lua_tensor` cdata (a struct holding one `al_tensor` descriptor in the field
`raw`); its __gc releases the storage reference through C. Views cost one FFI call and one small
allocation. Dims and indices are 1-based; negative dims count from the end (-1 is the last), as in
Torch7 and TransformerEngine.

Other modules add methods to `M.methods` (math.lua, print.lua, ...) and create results with:
  local out = T.new(); T.check(C.al_something(out.raw, ...), "something"); return out
]]
local lffi = require "attnlab.ffi"
local ffi, C = lffi.ffi, lffi.C

local M = {}
local methods = {}
M.methods = methods

local tensor_ct = ffi.typeof("al_lua_tensor")
local size_buf = ffi.new("int64_t[8]")
local stride_buf = ffi.new("int64_t[8]")
local perm_buf = ffi.new("int32_t[8]")
local tonumber, type, select, error = tonumber, type, select, error

---------------------------------------------------------------------------------------------------
-- dtypes and devices
---------------------------------------------------------------------------------------------------
local DTYPES = { "f32", "f64", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i32", "i64", "u8", "bool" }
local dtype_code = {}
for i, n in ipairs(DTYPES) do dtype_code[n] = i - 1 end
local aliases = { float32 = "f32", float = "f32", float64 = "f64", double = "f64", float16 = "f16",
  half = "f16", bfloat16 = "bf16", e4m3 = "fp8_e4m3", e5m2 = "fp8_e5m2", float8_e4m3fn = "fp8_e4m3",
  float8_e5m2 = "fp8_e5m2", int32 = "i32", int = "i32", int64 = "i64", long = "i64", uint8 = "u8",
  byte = "u8" }
for a, n in pairs(aliases) do dtype_code[a] = dtype_code[n] end
M.DTYPES = DTYPES

local default_dtype = 0 -- f32

local function parse_dtype(d, fname)
  if d == nil then return default_dtype end
  local c = dtype_code[d]
  if c == nil then
    error(fname .. ": dtype: expected one of " .. table.concat(DTYPES, " ") .. ", got " .. tostring(d), 3)
  end
  return c
end
M.parse_dtype = parse_dtype

local function parse_device(d, fname)
  if d == nil or d == "cpu" then return 0, 0 end
  if d == "cuda" then return 1, 0 end
  if type(d) == "string" then
    local n = d:match("^cuda:(%d+)$")
    if n then return 1, tonumber(n) end
  end
  error(fname .. ": device: expected 'cpu', 'cuda' or 'cuda:N', got " .. tostring(d), 3)
end
M.parse_device = parse_device

function M.set_default_dtype(d) default_dtype = parse_dtype(d, "set_default_dtype") end
function M.get_default_dtype() return DTYPES[default_dtype + 1] end

---------------------------------------------------------------------------------------------------
-- handles, errors, memory pressure
---------------------------------------------------------------------------------------------------
local soft_limit = 1024 * 1024 * 1024 -- bytes on all devices before Lua is nudged to collect
M.gc_stats = { collections = 0 }

local function new()
  local t = tensor_ct() -- (not a tail call: a trace started here could not return through it)
  return t
end
M.new = new

-- Nudge the collector when native memory grows (Torch7's heap tracking, pull-style): tensors are
-- small cdata to Lua's GC, which cannot see the bytes they hold.
local function after_alloc()
  local used = tonumber(C.al_memory_in_use(0, 0)) + tonumber(C.al_memory_in_use(1, 0))
  if used > soft_limit then
    collectgarbage()
    M.gc_stats.collections = M.gc_stats.collections + 1
    used = tonumber(C.al_memory_in_use(0, 0)) + tonumber(C.al_memory_in_use(1, 0))
    if used > soft_limit * 0.7 then soft_limit = used * 1.4 end
  end
end
M.after_alloc = after_alloc
function M.set_soft_limit(bytes) soft_limit = bytes end
function M.get_soft_limit() return soft_limit end

local function last_error()
  return ffi.string(C.al_last_error())
end
M.last_error = last_error

-- Raise the C library's message for a failed status (level 3: the caller of the method).
local function check(st, fname)
  if st ~= 0 then
    local msg = last_error()
    if fname and msg:sub(1, #fname + 1) ~= fname .. ":" then msg = fname .. ": " .. msg end
    error(msg, 3)
  end
end
M.check = check

local function is_tensor(x)
  return type(x) == "cdata" and ffi.istype(tensor_ct, x)
end
M.is_tensor = is_tensor

-- Lua dim (1-based, negative from the end) -> C dim (0-based). `extra` allows ndim+1 (unsqueeze).
local function dim0(t, d, fname, argname, extra)
  if t.raw.storage == nil then error(fname .. ": self: expected a tensor, got a released tensor", 3) end
  local nd = t.raw.ndim + (extra or 0)
  if type(d) ~= "number" or d % 1 ~= 0 then
    error(fname .. ": " .. (argname or "dim") .. ": expected an integer, got " .. tostring(d), 3)
  end
  local c = d < 0 and nd + d or d - 1
  if c < 0 or c >= nd then
    error(string.format("%s: %s %d out of range for a tensor with %d dims", fname, argname or "dim", d, t.raw.ndim), 3)
  end
  return c
end
M.dim0 = dim0

-- Shape argument: a table {2,3}, numbers 2,3, or a tensor's size table. Fills size_buf; returns n.
local function shape_arg(fname, a, ...)
  local n
  if type(a) == "table" then
    n = #a
    if n > 8 then error(fname .. ": expected at most 8 dims, got " .. n, 3) end
    for i = 1, n do
      local v = a[i]
      if type(v) ~= "number" or v % 1 ~= 0 then
        error(fname .. ": size: expected integers, got " .. tostring(v) .. " at position " .. i, 3)
      end
      size_buf[i - 1] = v
    end
  else
    n = 1 + select("#", ...)
    if a == nil then n = 0 end
    if n > 8 then error(fname .. ": expected at most 8 dims, got " .. n, 3) end
    for i = 1, n do
      local v = i == 1 and a or select(i - 1, ...)
      if type(v) ~= "number" or v % 1 ~= 0 then
        error(fname .. ": size: expected integers, got " .. tostring(v) .. " at position " .. i, 3)
      end
      size_buf[i - 1] = v
    end
  end
  return n
end

-- Split (shape..., opts) where the shape is a table or numbers and opts an optional trailing table.
local function shape_and_opts(fname, ...)
  local nargs = select("#", ...)
  local first = ...
  local opts
  if type(first) == "table" then
    opts = select(2, ...)
    return shape_arg(fname, first), opts or {}
  end
  local last = select(nargs, ...)
  if nargs > 0 and type(last) == "table" then
    opts = last
    nargs = nargs - 1
  end
  local n = 0
  for i = 1, nargs do
    local v = select(i, ...)
    if type(v) ~= "number" or v % 1 ~= 0 then
      error(fname .. ": size: expected integers, got " .. tostring(v) .. " at position " .. i, 3)
    end
    size_buf[i - 1] = v
    n = n + 1
  end
  if n > 8 then error(fname .. ": expected at most 8 dims, got " .. n, 3) end
  return n, opts or {}
end

local function empty_n(n, dtype, dt, di, fname)
  local t = new()
  check(C.al_tensor_empty(t.raw, n, size_buf, dtype, dt, di), fname)
  after_alloc()
  return t
end
M.empty_n = empty_n

---------------------------------------------------------------------------------------------------
-- creation (installed as al.empty, al.zeros, ...)
---------------------------------------------------------------------------------------------------
local create = {}

function create.empty(...)
  local n, opts = shape_and_opts("empty", ...)
  local dt, di = parse_device(opts.device, "empty")
  return empty_n(n, parse_dtype(opts.dtype, "empty"), dt, di, "empty")
end

function create.zeros(...)
  local n, opts = shape_and_opts("zeros", ...)
  local dt, di = parse_device(opts.device, "zeros")
  local t = empty_n(n, parse_dtype(opts.dtype, "zeros"), dt, di, "zeros")
  check(C.al_tensor_fill_(t.raw, 0), "zeros")
  return t
end

function create.ones(...)
  local n, opts = shape_and_opts("ones", ...)
  local dt, di = parse_device(opts.device, "ones")
  local t = empty_n(n, parse_dtype(opts.dtype, "ones"), dt, di, "ones")
  check(C.al_tensor_fill_(t.raw, 1), "ones")
  return t
end

function create.full(shape, v, opts)
  if type(v) ~= "number" and type(v) ~= "boolean" then
    error("full: value: expected a number, got " .. type(v), 2)
  end
  opts = opts or {}
  local n = shape_arg("full", shape)
  local dt, di = parse_device(opts.device, "full")
  local t = empty_n(n, parse_dtype(opts.dtype, "full"), dt, di, "full")
  check(C.al_tensor_fill_(t.raw, v == true and 1 or v == false and 0 or v), "full")
  return t
end

-- al.arange(stop), al.arange(start, stop), al.arange(start, stop, step), each with optional opts.
function create.arange(a, b, c, d)
  local opts
  local args = { a, b, c, d }
  local nums = {}
  for i = 1, 4 do
    if type(args[i]) == "table" then opts = args[i] break end
    if args[i] ~= nil then nums[#nums + 1] = args[i] end
  end
  opts = opts or {}
  local start, stop, step = 0, nums[1], 1
  if #nums >= 2 then start, stop = nums[1], nums[2] end
  if #nums >= 3 then step = nums[3] end
  if type(stop) ~= "number" then error("arange: expected arange(stop), arange(start, stop[, step])", 2) end
  if step == 0 then error("arange: step must be non-zero", 2) end
  local n = math.max(0, math.ceil((stop - start) / step))
  local dtype = opts.dtype
  if dtype == nil then
    dtype = (start % 1 == 0 and stop % 1 == 0 and step % 1 == 0) and "i64" or DTYPES[default_dtype + 1]
  end
  size_buf[0] = n
  local dt, di = parse_device(opts.device, "arange")
  local t = empty_n(1, parse_dtype(dtype, "arange"), dt, di, "arange")
  check(C.al_tensor_arange_(t.raw, start, step), "arange")
  return t
end

local function random(kind, fname, ...)
  local n, opts = shape_and_opts(fname, ...)
  local dt, di = parse_device(opts.device, fname)
  local t = empty_n(n, parse_dtype(opts.dtype, fname), dt, di, fname)
  check(C.al_tensor_random_(t.raw, kind), fname)
  return t
end
function create.randn(...) return random(1, "randn", ...) end
function create.rand(...) return random(0, "rand", ...) end

function create.manual_seed(seed)
  if type(seed) ~= "number" or seed < 0 or seed % 1 ~= 0 then
    error("manual_seed: seed: expected a non-negative integer, got " .. tostring(seed), 2)
  end
  C.al_manual_seed(seed)
end

-- al.tensor(nested table of numbers or booleans, opts) -> a tensor with that shape and values.
function create.tensor(data, opts)
  opts = opts or {}
  if type(data) == "number" or type(data) == "boolean" then
    local t = empty_n(0, parse_dtype(opts.dtype, "tensor"), parse_device(opts.device, "tensor"))
    local buf = ffi.new("double[1]", data == true and 1 or data == false and 0 or data)
    check(C.al_tensor_write_f64(t.raw, buf, 1), "tensor")
    return t
  end
  if type(data) ~= "table" then error("tensor: data: expected a number or a nested table, got " .. type(data), 2) end
  local shape = {}
  local x = data
  while type(x) == "table" do
    shape[#shape + 1] = #x
    x = x[1]
    if #shape > 8 then error("tensor: data: nested deeper than 8 dims", 2) end
  end
  local numel = 1
  for i = 1, #shape do numel = numel * shape[i] end
  local buf = ffi.new("double[?]", math.max(numel, 1))
  local k = 0
  local function walk(v, depth, path)
    if depth > #shape then
      if type(v) == "boolean" then v = v and 1 or 0 end
      if type(v) ~= "number" then error("tensor: data: expected numbers, got " .. type(v) .. " at " .. path, 4) end
      buf[k] = v
      k = k + 1
      return
    end
    if type(v) ~= "table" or #v ~= shape[depth] then
      error(string.format("tensor: data: ragged nested table at %s: expected %d entries, got %s", path, shape[depth],
        type(v) == "table" and tostring(#v) or type(v)), 4)
    end
    for i = 1, #v do walk(v[i], depth + 1, path .. "[" .. i .. "]") end
  end
  walk(data, 1, "data")
  local dtype = opts.dtype
  if dtype == nil then
    local first = x
    dtype = type(first) == "boolean" and "bool" or DTYPES[default_dtype + 1]
  end
  local n = shape_arg("tensor", shape)
  local dt, di = parse_device(opts.device, "tensor")
  local t = empty_n(n, parse_dtype(dtype, "tensor"), dt, di, "tensor")
  check(C.al_tensor_write_f64(t.raw, buf, numel), "tensor")
  return t
end

function create.empty_like(t, opts, fname)
  fname = fname or "empty_like"
  -- (hostile_spec: a non-tensor used to fail with "attempt to index local 't'", naming no function)
  if not is_tensor(t) then error(fname .. ": t: expected a tensor, got " .. type(t), 3) end
  if opts ~= nil and type(opts) ~= "table" then error(fname .. ": opts: expected a table {dtype=, device=}, got " .. type(opts), 3) end
  opts = opts or {}
  local r = t.raw
  for i = 0, r.ndim - 1 do size_buf[i] = r.size[i] end
  local dt, di = r.device_type, r.device_index
  if opts.device then dt, di = parse_device(opts.device, fname) end
  local dtype = opts.dtype and parse_dtype(opts.dtype, fname) or r.dtype
  return empty_n(r.ndim, dtype, dt, di, fname)
end
function create.zeros_like(t, opts)
  local z = create.empty_like(t, opts, "zeros_like")
  check(C.al_tensor_fill_(z.raw, 0), "zeros_like")
  return z
end
function create.randn_like(t, opts)
  local z = create.empty_like(t, opts, "randn_like")
  check(C.al_tensor_random_(z.raw, 1), "randn_like")
  return z
end

M.create = create

---------------------------------------------------------------------------------------------------
-- queries
---------------------------------------------------------------------------------------------------
function methods:size(d)
  local r = self.raw
  if d == nil then
    local s = {}
    for i = 0, r.ndim - 1 do s[i + 1] = tonumber(r.size[i]) end
    return s
  end
  return tonumber(r.size[dim0(self, d, "size")])
end

function methods:stride(d)
  local r = self.raw
  if d == nil then
    local s = {}
    for i = 0, r.ndim - 1 do s[i + 1] = tonumber(r.stride[i]) end
    return s
  end
  return tonumber(r.stride[dim0(self, d, "stride")])
end

function methods:dim() return self.raw.ndim end
methods.nDimension = methods.dim
function methods:numel() return tonumber(C.al_tensor_numel(self.raw)) end
methods.nElement = methods.numel
function methods:dtype() return DTYPES[self.raw.dtype + 1] end
function methods:device()
  local r = self.raw
  if r.device_type == 0 then return "cpu" end
  return "cuda:" .. r.device_index
end
function methods:is_cuda() return self.raw.device_type == 1 end
function methods:storage_offset() return tonumber(self.raw.offset) end
function methods:storage_id() return tonumber(self.raw.storage_id) end
function methods:data_ptr() return C.al_tensor_data_ptr(self.raw) end
function methods:is_contiguous() return C.al_tensor_is_contiguous(self.raw) ~= 0 end
function methods:is_same_storage(other) return C.al_tensor_same_storage(self.raw, other.raw) ~= 0 end
function methods:element_size() return tonumber(C.al_dtype_size(self.raw.dtype)) end

-- All values as a flat Lua array (row-major), read through f64.
function methods:flat_values()
  local n = self:numel()
  local buf = ffi.new("double[?]", math.max(n, 1))
  check(C.al_tensor_read_f64(self.raw, buf, n), "totable")
  local out = {}
  for i = 0, n - 1 do out[i + 1] = buf[i] end
  return out
end

function methods:totable()
  local flat = self:flat_values()
  local r = self.raw
  if r.ndim == 0 then return flat[1] end
  local shape = self:size()
  local k = 0
  local function build(depth)
    local t = {}
    for i = 1, shape[depth] do
      if depth == #shape then
        k = k + 1
        t[i] = flat[k]
      else
        t[i] = build(depth + 1)
      end
    end
    return t
  end
  return build(1)
end

function methods:item()
  local n = self:numel()
  if n ~= 1 then error("item: expected a tensor with one element, got " .. n .. " elements", 2) end
  local buf = ffi.new("double[1]")
  check(C.al_tensor_read_f64(self.raw, buf, 1), "item")
  local v = buf[0]
  if self.raw.dtype == 9 then return v ~= 0 end
  return v
end

---------------------------------------------------------------------------------------------------
-- views (no copy)
---------------------------------------------------------------------------------------------------
function methods:select(dim, index)
  local d = dim0(self, dim, "select")
  if type(index) ~= "number" or index % 1 ~= 0 then
    error("select: index: expected an integer, got " .. tostring(index), 2)
  end
  local n = tonumber(self.raw.size[d])
  local i0 = index < 0 and n + index or index - 1
  if i0 < 0 or i0 >= n then
    error(string.format("select: index %d out of range for dim %d of size %d", index, dim, n), 2)
  end
  local out = new()
  check(C.al_tensor_select(out.raw, self.raw, d, i0), "select")
  return out
end

function methods:narrow(dim, start, length)
  local d = dim0(self, dim, "narrow")
  if type(start) ~= "number" or type(length) ~= "number" then
    error("narrow: expected narrow(dim, start, length) with numbers", 2)
  end
  local n = tonumber(self.raw.size[d])
  local s0 = start < 0 and n + start or start - 1
  local out = new()
  local st = C.al_tensor_narrow(out.raw, self.raw, d, s0, length)
  if st ~= 0 then
    error(string.format("narrow: range start %d length %d out of range for dim %d of size %d", start, length, dim, n), 2)
  end
  return out
end

-- Torch7/NumPy-style slicing of one dim: t:slice(dim, first, last) inclusive, negative from the end.
function methods:slice(dim, first, last)
  local d = dim0(self, dim, "slice")
  local n = tonumber(self.raw.size[d])
  first = first or 1
  last = last or n
  if first < 0 then first = n + first + 1 end
  if last < 0 then last = n + last + 1 end
  return self:narrow(dim, first, last - first + 1)
end

function methods:transpose(a, b)
  local out = new()
  check(C.al_tensor_transpose(out.raw, self.raw, dim0(self, a, "transpose", "dim0"), dim0(self, b, "transpose", "dim1")),
    "transpose")
  return out
end

function methods:t()
  if self.raw.ndim ~= 2 then error("t: expected a 2-d tensor, got " .. self.raw.ndim .. " dims", 2) end
  return self:transpose(1, 2)
end

function methods:permute(...)
  local dims = ...
  if type(dims) ~= "table" then dims = { ... } end
  local nd = self.raw.ndim
  if #dims ~= nd then error("permute: expected " .. nd .. " dims in the permutation, got " .. #dims, 2) end
  for i = 1, nd do perm_buf[i - 1] = dim0(self, dims[i], "permute") end
  local out = new()
  check(C.al_tensor_permute(out.raw, self.raw, nd, perm_buf), "permute")
  return out
end

function methods:view(...)
  local n = shape_arg("view", ...)
  local out = new()
  check(C.al_tensor_view(out.raw, self.raw, n, size_buf), "view")
  return out
end

-- reshape: a view when the strides allow it, else a contiguous copy (the second result says which).
local copied_buf = ffi.new("int32_t[1]")
function methods:reshape(...)
  local n = shape_arg("reshape", ...)
  local out = new()
  check(C.al_tensor_reshape(out.raw, self.raw, n, size_buf, copied_buf), "reshape")
  if copied_buf[0] ~= 0 then after_alloc() end
  return out, copied_buf[0] ~= 0
end

function methods:expand(...)
  local n = shape_arg("expand", ...)
  local out = new()
  check(C.al_tensor_expand(out.raw, self.raw, n, size_buf), "expand")
  return out
end

function methods:expand_as(other) return self:expand(other:size()) end

function methods:unsqueeze(dim)
  local out = new()
  check(C.al_tensor_unsqueeze(out.raw, self.raw, dim0(self, dim, "unsqueeze", "dim", 1)), "unsqueeze")
  return out
end

function methods:squeeze(dim)
  local out = new()
  check(C.al_tensor_squeeze(out.raw, self.raw, dim == nil and -1 or dim0(self, dim, "squeeze")), "squeeze")
  return out
end

function methods:unbind(dim)
  dim = dim or 1
  local d = dim0(self, dim, "unbind")
  local res = {}
  for i = 1, tonumber(self.raw.size[d]) do res[i] = self:select(dim, i) end
  return res
end

-- Arbitrary strided view over this tensor's storage (bounds-checked). offset is in elements, 0-based
-- like PyTorch's storage_offset().
function methods:as_strided(size, stride, offset)
  local n = shape_arg("as_strided", size)
  if type(stride) ~= "table" or #stride ~= n then
    error("as_strided: stride: expected a table of " .. n .. " integers", 2)
  end
  for i = 1, n do stride_buf[i - 1] = stride[i] end
  local out = new()
  check(C.al_tensor_as_strided(out.raw, self.raw, n, size_buf, stride_buf, offset or tonumber(self.raw.offset)),
    "as_strided")
  return out
end

---------------------------------------------------------------------------------------------------
-- copies
---------------------------------------------------------------------------------------------------
function methods:contiguous()
  if C.al_tensor_is_contiguous(self.raw) ~= 0 then return self end
  return self:clone()
end

function methods:clone()
  local out = new()
  check(C.al_tensor_clone(out.raw, self.raw), "clone")
  after_alloc()
  return out
end

function methods:copy_(src)
  if not is_tensor(src) then error("copy_: src: expected a tensor, got " .. type(src), 2) end
  check(C.al_tensor_copy_(self.raw, src.raw), "copy_")
  return self
end

function methods:fill_(v)
  if type(v) == "boolean" then v = v and 1 or 0 end
  if type(v) ~= "number" then error("fill_: value: expected a number, got " .. type(v), 2) end
  check(C.al_tensor_fill_(self.raw, v), "fill_")
  return self
end
function methods:zero_() return self:fill_(0) end

function methods:normal_()
  check(C.al_tensor_random_(self.raw, 1), "normal_")
  return self
end
function methods:uniform_()
  check(C.al_tensor_random_(self.raw, 0), "uniform_")
  return self
end

-- to(dtype) / to(device) / to{dtype=, device=}: a converted copy; returns self when nothing changes.
function methods:to(arg, arg2)
  local r = self.raw
  local dtype, dt, di = r.dtype, r.device_type, r.device_index
  local function apply(a)
    if type(a) == "table" then
      if a.dtype then dtype = parse_dtype(a.dtype, "to") end
      if a.device then dt, di = parse_device(a.device, "to") end
    elseif type(a) == "string" then
      if dtype_code[a] then dtype = dtype_code[a]
      elseif a == "cpu" or a:match("^cuda") then dt, di = parse_device(a, "to")
      else error("to: expected a dtype, a device or {dtype=, device=}, got '" .. a .. "'", 3) end
    elseif a ~= nil then
      error("to: expected a dtype, a device or {dtype=, device=}, got " .. type(a), 3)
    end
  end
  apply(arg)
  apply(arg2)
  if dtype == r.dtype and dt == r.device_type and (dt == 0 or di == r.device_index) then return self end
  local out = new()
  check(C.al_tensor_to(out.raw, r, dtype, dt, di), "to")
  after_alloc()
  return out
end

function methods:cuda(idx) return self:to(idx and ("cuda:" .. idx) or "cuda") end
function methods:cpu() return self:to("cpu") end
function methods:float() return self:to("f32") end
function methods:double() return self:to("f64") end
function methods:half() return self:to("f16") end
function methods:bfloat16() return self:to("bf16") end
function methods:type_as(other) return self:to(DTYPES[other.raw.dtype + 1]) end

-- Drop this handle's storage reference now instead of at garbage collection.
function methods:free()
  C.al_tensor_release(self.raw)
end

---------------------------------------------------------------------------------------------------
-- the metatype
---------------------------------------------------------------------------------------------------
local function binop(name)
  return function(a, b)
    local f = methods[name]
    if not f then error("tensor arithmetic needs attnlab.math (" .. name .. ")", 2) end
    if is_tensor(a) then return f(a, b) end
    -- number op tensor: the math module handles scalar-first forms through al.<name>
    return f(b, a, true)
  end
end

-- The finalizer takes the handle's address directly (raw is its first field): building a `t.raw`
-- reference inside every finalizer costs a third of a view's price.
local release_ptr = ffi.cast("void (*)(void *)", C.al_tensor_release)
local mt = {
  __index = methods,
  __gc = function(t) release_ptr(t) end,
  __tostring = function(t)
    local f = methods.__tostring_impl
    if f then return f(t) end
    return string.format("attnlab.Tensor %s %s %s", DTYPES[t.raw.dtype + 1], table.concat(t:size(), "x"), t:device())
  end,
  __add = binop("add"),
  __sub = binop("sub"),
  __mul = binop("mul"),
  __div = binop("div"),
  __pow = binop("pow"),
  __unm = function(a) return methods.neg(a) end,
  __len = function(t) return t.raw.ndim > 0 and tonumber(t.raw.size[0]) or 0 end,
}
-- Metatypes are permanent: set it once per process even if this module is reloaded.
if not M.__metatype_done then
  local ok = pcall(ffi.metatype, tensor_ct, mt)
  M.__metatype_done = ok
end

function methods:print()
  local f = methods.__print_impl
  if f then return f(self) end
  print(tostring(self))
end

---------------------------------------------------------------------------------------------------
-- CUDA and memory (installed as al.cuda and al.memory)
---------------------------------------------------------------------------------------------------
local cuda = {}
local reason_buf = ffi.new("const char *[1]")

function cuda.available()
  if C.al_cuda_available(reason_buf) ~= 0 then return true end
  return false, ffi.string(reason_buf[0])
end

function cuda.device_count()
  if C.al_cuda_available(nil) == 0 then return 0 end
  return C.al_cuda_device_count()
end

function cuda.synchronize(idx)
  check(C.al_cuda_synchronize(idx or 0), "cuda.synchronize")
end

-- al.cuda.device_info(idx) -> {name, capability = {major, minor}, total_memory (bytes), multiprocessors (SMs:
-- one wave of a one-CTA-per-SM grid), l2_bytes, smem_per_block_optin (bytes a block may opt in to)}
function cuda.device_info(idx)
  local name = ffi.new("char[256]")
  local ma, mi, mem = ffi.new("int32_t[1]"), ffi.new("int32_t[1]"), ffi.new("int64_t[1]")
  check(C.al_cuda_device_info(idx or 0, name, 256, ma, mi, mem), "cuda.device_info")
  local sms, l2, smem = ffi.new("int32_t[1]"), ffi.new("int64_t[1]"), ffi.new("int32_t[1]")
  check(C.al_cuda_device_attrs(idx or 0, sms, l2, smem), "cuda.device_info")
  return { name = ffi.string(name), capability = { ma[0], mi[0] }, total_memory = tonumber(mem[0]),
    multiprocessors = sms[0], l2_bytes = tonumber(l2[0]), smem_per_block_optin = smem[0] }
end

function cuda.memory_reserved(idx) return tonumber(C.al_cuda_memory_reserved(idx or 0)) end

-- al.cuda.backend_info(name) -> text, count: a GPU attention backend's counters and log. "fused": the
-- cuDNN version and plans cached / built (count = plans built); "flash": NVRTC compiles and cache loads
-- and every specialisation compiled or loaded, with its time (count = kernels compiled).
local info_buf
function cuda.backend_info(name)
  if name ~= "fused" and name ~= "flash" then
    error("cuda.backend_info: name: expected 'fused' or 'flash', got " .. tostring(name), 2)
  end
  info_buf = info_buf or ffi.new("char[131072]")   -- 256 log lines of up to 256 chars, and the counters
  local n = C.al_cuda_backend_info(name, info_buf, 131072)
  if n < 0 then error(last_error(), 2) end
  return ffi.string(info_buf), tonumber(n)
end
function cuda.empty_cache(idx) check(C.al_cuda_empty_cache(idx or 0), "cuda.empty_cache") end

-- al.cuda.Stream(device): s:synchronize(), s:query() (true when idle), s:wait_event(e).
-- al.cuda.set_stream(s) makes s current for this thread on its device (al.cuda.set_stream(nil, dev)
-- restores the default); al.cuda.current_stream(dev) returns it (nil: the default stream);
-- al.cuda.with_stream(s, fn, ...) runs fn with s current and restores the previous stream, even on error.
local Stream = {}
Stream.__index = Stream
local streams_by_ptr = setmetatable({}, { __mode = "v" }) -- C pointer -> Lua object
function cuda.Stream(idx)
  local p = ffi.new("al_cuda_stream *[1]")
  check(C.al_cuda_stream_new(p, idx or 0), "cuda.Stream")
  local s = setmetatable({ handle = ffi.gc(p[0], C.al_cuda_stream_free), device = idx or 0 }, Stream)
  streams_by_ptr[tostring(ffi.cast("uintptr_t", p[0]))] = s
  return s
end
function Stream:synchronize() check(C.al_cuda_stream_synchronize(self.handle), "Stream:synchronize") end
function Stream:query()
  local done = ffi.new("int32_t[1]")
  check(C.al_cuda_stream_query(self.handle, done), "Stream:query")
  return done[0] ~= 0
end
function Stream:wait_event(e) check(C.al_cuda_stream_wait_event(self.handle, e.handle), "Stream:wait_event") return self end
function Stream:__tostring() return "attnlab.cuda.Stream on cuda:" .. self.device end

function cuda.set_stream(s, idx)
  if s ~= nil and getmetatable(s) ~= Stream then error("cuda.set_stream: expected a cuda.Stream or nil, got " .. type(s), 2) end
  local dev = s and s.device or idx or 0
  check(C.al_cuda_set_stream(dev, s and s.handle or nil), "cuda.set_stream")
end
function cuda.current_stream(idx)
  local p = C.al_cuda_get_stream(idx or 0)
  if p == nil then return nil end
  return streams_by_ptr[tostring(ffi.cast("uintptr_t", p))]
end
local function pack_results(...) return { n = select("#", ...), ... } end
function cuda.with_stream(s, fn, ...)
  local prev = cuda.current_stream(s.device)
  cuda.set_stream(s)
  local res = pack_results(pcall(fn, ...))
  cuda.set_stream(prev, s.device)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

-- al.cuda.Event(): e:record([stream]), e:synchronize(), start:elapsed_time(stop) in milliseconds.
local Event = {}
Event.__index = Event
function cuda.Event(idx)
  local p = ffi.new("al_cuda_event *[1]")
  check(C.al_cuda_event_new(p, idx or 0), "cuda.Event")
  local e = setmetatable({ handle = ffi.gc(p[0], C.al_cuda_event_free) }, Event)
  return e
end
function Event:record(stream)
  check(C.al_cuda_event_record_on(self.handle, stream and stream.handle or nil), "Event:record")
  return self
end
function Event:synchronize() check(C.al_cuda_event_synchronize(self.handle), "Event:synchronize") end
function Event:elapsed_time(stop)
  local ms = ffi.new("float[1]")
  check(C.al_cuda_event_elapsed(self.handle, stop.handle, ms), "Event:elapsed_time")
  return ms[0]
end

-- al.cuda.time(fn, {warmup = 3, iters = 10, device = 0}) -> mean milliseconds of fn() over iters calls
-- after warmup calls (and on, until the caching allocator stops growing), measured by CUDA events on the
-- current stream (a GPU call returns before its kernels finish, so a host clock would time the
-- launches, not the work).
function cuda.time(fn, opts)
  if type(fn) ~= "function" then error("cuda.time: fn: expected a function, got " .. type(fn), 2) end
  opts = opts or {}
  local warmup, iters = opts.warmup or 3, opts.iters or 10
  if type(iters) ~= "number" or iters < 1 or iters % 1 ~= 0 then
    error("cuda.time: iters: expected a positive integer, got " .. tostring(iters), 2)
  end
  if type(warmup) ~= "number" or warmup < 0 or warmup % 1 ~= 0 then
    error("cuda.time: warmup: expected an integer >= 0, got " .. tostring(warmup), 2)
  end
  for _ = 1, warmup do fn() end
  -- Then warm on while the caching allocator still reserves memory: outputs that fn drops return to the
  -- cache only when Lua's collector frees them (after_alloc's soft limit), so until one collection cycle
  -- has passed each call may cudaMalloc afresh, which stalls the queue (measured on an H200: a 0.27 ms
  -- cuDNN forward timed at 0.46 ms). Stops after `iters` calls without growth, or 256 calls.
  if warmup > 0 then
    local dev = type(opts.device) == "number" and opts.device or 0
    local last, calm = cuda.memory_reserved(dev), 0
    for _ = 1, 256 do
      if calm >= iters then break end
      fn()
      local now = cuda.memory_reserved(dev)
      if now > last then calm = 0 else calm = calm + 1 end
      last = now
    end
  end
  cuda.synchronize(opts.device)
  local e0, e1 = cuda.Event(opts.device), cuda.Event(opts.device)
  e0:record()
  for _ = 1, iters do fn() end
  e1:record()
  e1:synchronize()
  return e0:elapsed_time(e1) / iters
end
M.cuda = cuda

-- al.memory(): bytes in use and peak per device, plus the live storage count.
function M.memory()
  local m = {
    cpu = tonumber(C.al_memory_in_use(0, 0)),
    cpu_peak = tonumber(C.al_memory_peak(0, 0)),
    storages = tonumber(C.al_storage_live_count()),
    soft_limit = soft_limit,
  }
  if C.al_cuda_available(nil) ~= 0 then
    m.cuda = {}
    for i = 0, C.al_cuda_device_count() - 1 do
      m.cuda[i] = { in_use = tonumber(C.al_memory_in_use(1, i)), peak = tonumber(C.al_memory_peak(1, i)),
        reserved = tonumber(C.al_cuda_memory_reserved(i)) }
    end
  end
  return m
end

function M.install(al)
  for k, f in pairs(create) do al[k] = f end
  al.is_tensor = is_tensor
  al.cuda = cuda
  al.memory = M.memory
  al.set_default_dtype = M.set_default_dtype
  al.get_default_dtype = M.get_default_dtype
  al.Tensor = methods
end

return M
