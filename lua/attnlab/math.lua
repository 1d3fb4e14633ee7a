--[[
attnlab.math — tensor math for Lua: element-wise ops with broadcasting, comparisons, where,
reductions, max with indices, softmax, matmul and comparison helpers. Every op runs in C (CPU, or the
CUDA plugin for cuda tensors) over any strides; results are new contiguous tensors.

  local c = a + 2 * b            -- metamethods: + - * / ^ and unary minus; numbers on either side
  local s = x:softmax(-1)        -- dims are 1-based, negative from the end
  local v, i = x:max(2)          -- values and 1-based i64 indices (Torch7 convention)
  local y = al.matmul(q, k:transpose(-2, -1))
  assert(al.allclose(y, ref, {atol = 1e-3, rtol = 1e-3}))

Installed by attnlab/init.lua: module functions go to `al` (al.add, al.maximum, al.where, ...) and
methods to the tensor methods table (t:add, t:sum, ...). Output dtypes are documented in src/math.c.
]]
local T = require "attnlab.tensor"
local lffi = require "attnlab.ffi"
local ffi, C = lffi.ffi, lffi.C

local methods = T.methods
local new, is_tensor, after_alloc = T.new, T.is_tensor, T.after_alloc
local type, error, tonumber = type, error, tonumber

local UNARY = { neg = 0, abs = 1, exp = 2, log = 3, sqrt = 4, tanh = 5 }
local BINARY = { add = 0, sub = 1, mul = 2, div = 3, maximum = 4, minimum = 5, pow = 6,
  eq = 7, ne = 8, lt = 9, le = 10, gt = 11, ge = 12 }
local REDUCE = { sum = 0, mean = 1, amax = 2, amin = 3 }

local dims_buf = ffi.new("int32_t[8]")
local result_f64 = ffi.new("double[1]")
local result_i32 = ffi.new("int32_t[1]")

-- Raise the C message for a failed status at `level` (2 = the caller of the function calling raise).
local function raise_if(st, fname, level)
  if st ~= 0 then
    local msg = ffi.string(C.al_last_error())
    if msg:sub(1, #fname + 1) ~= fname .. ":" then msg = fname .. ": " .. msg end
    error(msg, level + 1)
  end
end

local function describe(x)
  if is_tensor(x) then return "a tensor" end
  return type(x) == "nil" and "nothing" or ("a " .. type(x))
end

local function need_tensor(x, fname, argname, level)
  if not is_tensor(x) then
    error(string.format("%s: %s: expected a tensor, got %s", fname, argname, describe(x)), level + 1)
  end
end

local function scalar_value(x)
  if type(x) == "number" then return x end
  if type(x) == "boolean" then return x and 1 or 0 end
  return nil
end

-- Lua dim (1-based, negative from the end) -> C dim, raising at `level`.
local function cdim(t, d, fname, argname, level)
  local nd = t.raw.ndim
  if type(d) ~= "number" or d % 1 ~= 0 then
    error(string.format("%s: %s: expected an integer dim, got %s", fname, argname, tostring(d)), level + 1)
  end
  local c = d < 0 and nd + d or d - 1
  if c < 0 or c >= nd then
    error(string.format("%s: %s %d out of range for a tensor with %d dims (expected 1..%d or -%d..-1)",
      fname, argname, d, nd, nd, nd), level + 1)
  end
  return c
end

---------------------------------------------------------------------------------------------------
-- element-wise
---------------------------------------------------------------------------------------------------
local function unary(name)
  local op = UNARY[name]
  return function(self)
    need_tensor(self, name, "self", 2)
    local out = new()
    raise_if(C.al_unary(out.raw, op, self.raw), name, 2)
    after_alloc()
    return out
  end
end

-- binary(a, b[, reversed]): a tensor or number on either side. `reversed` comes from the metatype
-- (number op tensor calls methods.op(tensor, number, true)), meaning "b op a".
local function binary(name)
  local op = BINARY[name]
  return function(a, b, reversed)
    local out = new()
    if is_tensor(a) and is_tensor(b) then
      if reversed then a, b = b, a end
      raise_if(C.al_binary(out.raw, op, a.raw, b.raw), name, 2)
    elseif is_tensor(a) then
      local s = scalar_value(b)
      if s == nil then
        error(string.format("%s: %s: expected a tensor or a number, got %s", name, reversed and "a" or "b",
          describe(b)), 2)
      end
      raise_if(C.al_binary_scalar(out.raw, op, a.raw, s, reversed and 1 or 0), name, 2)
    elseif is_tensor(b) then
      local s = scalar_value(a)
      if s == nil then
        error(string.format("%s: a: expected a tensor or a number, got %s", name, describe(a)), 2)
      end
      raise_if(C.al_binary_scalar(out.raw, op, b.raw, s, 1), name, 2)
    else
      error(string.format("%s: expected at least one tensor, got %s and %s", name, describe(a), describe(b)), 2)
    end
    after_alloc()
    return out
  end
end

local M = {}
local fns = {}

for name in pairs(UNARY) do
  methods[name] = unary(name)
  fns[name] = methods[name]
end
for name in pairs(BINARY) do
  methods[name] = binary(name)
  fns[name] = methods[name]
end

-- A 0-d tensor holding v with the dtype/device of `like` (for al.where with a number).
local function scalar_tensor(v, like_dtype, dt, di, fname)
  local t = T.empty_n(0, like_dtype, dt, di, fname)
  raise_if(C.al_tensor_fill_(t.raw, v), fname, 3)
  return t
end

-- al.where(cond, a, b): cond (bool or u8) ? a : b, broadcast; a or b may be numbers.
function fns.where(cond, a, b)
  need_tensor(cond, "where", "cond", 2)
  local cr = cond.raw
  if not is_tensor(a) and not is_tensor(b) then
    local sa, sb = scalar_value(a), scalar_value(b)
    if sa == nil or sb == nil then
      error("where: a and b: expected tensors or numbers, got " .. describe(a) .. " and " .. describe(b), 2)
    end
    a = scalar_tensor(sa, 0, cr.device_type, cr.device_index, "where")
  end
  if not is_tensor(a) then
    local s = scalar_value(a)
    if s == nil then error("where: a: expected a tensor or a number, got " .. describe(a), 2) end
    a = scalar_tensor(s, b.raw.dtype, b.raw.device_type, b.raw.device_index, "where")
  end
  if not is_tensor(b) then
    local s = scalar_value(b)
    if s == nil then error("where: b: expected a tensor or a number, got " .. describe(b), 2) end
    b = scalar_tensor(s, a.raw.dtype, a.raw.device_type, a.raw.device_index, "where")
  end
  local out = new()
  raise_if(C.al_where(out.raw, cr, a.raw, b.raw), "where", 2)
  after_alloc()
  return out
end
function methods:where(a, b) return fns.where(self, a, b) end

---------------------------------------------------------------------------------------------------
-- reductions
---------------------------------------------------------------------------------------------------
-- dims: nil (all), a number, or a table of numbers -> count in dims_buf.
local function fill_dims(t, dims, fname, level)
  if dims == nil then return 0 end
  if type(dims) == "number" then
    dims_buf[0] = cdim(t, dims, fname, "dim", level + 1)
    return 1
  end
  if type(dims) ~= "table" then
    error(string.format("%s: dims: expected nil, a dim or a table of dims, got %s", fname, describe(dims)), level + 1)
  end
  if #dims > t.raw.ndim then
    error(string.format("%s: dims: %d dims given for a tensor with %d dims", fname, #dims, t.raw.ndim), level + 1)
  end
  if #dims == 0 then
    error(fname .. ": dims: expected at least one dim in the table (nil reduces over all dims)", level + 1)
  end
  local seen = {}
  for i = 1, #dims do
    local c = cdim(t, dims[i], fname, "dim", level + 1)
    if seen[c] then
      error(string.format("%s: dims: dim %d appears twice (as %s and %s)", fname, c + 1, tostring(seen[c]),
        tostring(dims[i])), level + 1)
    end
    seen[c] = dims[i]
    dims_buf[i - 1] = c
  end
  return #dims
end

local function reduction(name)
  local op = REDUCE[name]
  return function(self, dims, keepdim)
    need_tensor(self, name, "self", 2)
    local n = fill_dims(self, dims, name, 2)
    local out = new()
    raise_if(C.al_reduce(out.raw, op, self.raw, n, dims_buf, keepdim and 1 or 0), name, 2)
    after_alloc()
    return out
  end
end
for name in pairs(REDUCE) do
  methods[name] = reduction(name)
  fns[name] = methods[name]
end

-- t:max(dim[, keepdim]) -> values, indices (i64, 1-based); t:max() -> the largest value as a number.
function methods:max(dim, keepdim)
  need_tensor(self, "max", "self", 2)
  if dim == nil then
    if C.al_tensor_numel(self.raw) == 0 then error("max: the tensor has no elements", 2) end
    local out = new()
    raise_if(C.al_reduce(out.raw, REDUCE.amax, self.raw, 0, dims_buf, 0), "max", 2)
    return out:item()
  end
  local d = cdim(self, dim, "max", "dim", 2)
  local values, idx0 = new(), new()
  raise_if(C.al_max_dim(values.raw, idx0.raw, self.raw, d, keepdim and 1 or 0), "max", 2)
  local idx = new()
  raise_if(C.al_binary_scalar(idx.raw, BINARY.add, idx0.raw, 1, 0), "max", 2)
  C.al_tensor_release(idx0.raw)
  after_alloc()
  return values, idx
end

-- t:min() -> the smallest value as a number (the indices form is t:neg():max(dim)).
function methods:min(dim)
  need_tensor(self, "min", "self", 2)
  if dim ~= nil then error("min: dim: only t:min() over all elements is supported (use amin(dim))", 2) end
  if C.al_tensor_numel(self.raw) == 0 then error("min: the tensor has no elements", 2) end
  local out = new()
  raise_if(C.al_reduce(out.raw, REDUCE.amin, self.raw, 0, dims_buf, 0), "min", 2)
  return out:item()
end

---------------------------------------------------------------------------------------------------
-- softmax, matmul
---------------------------------------------------------------------------------------------------
local function softmax_fn(name, log)
  return function(self, dim)
    need_tensor(self, name, "self", 2)
    if dim == nil then error(name .. ": dim: expected the dim to normalise over (e.g. -1), got nothing", 2) end
    local d = cdim(self, dim, name, "dim", 2)
    local out = new()
    raise_if(C.al_softmax(out.raw, self.raw, d, log), name, 2)
    after_alloc()
    return out
  end
end
methods.softmax = softmax_fn("softmax", 0)
methods.log_softmax = softmax_fn("log_softmax", 1)
fns.softmax = methods.softmax
fns.log_softmax = methods.log_softmax

function fns.matmul(a, b)
  need_tensor(a, "matmul", "a", 2)
  need_tensor(b, "matmul", "b", 2)
  local out = new()
  raise_if(C.al_matmul(out.raw, a.raw, b.raw), "matmul", 2)
  after_alloc()
  return out
end
function methods:matmul(b)
  need_tensor(self, "matmul", "self", 2)
  need_tensor(b, "matmul", "b", 2)
  local out = new()
  raise_if(C.al_matmul(out.raw, self.raw, b.raw), "matmul", 2)
  after_alloc()
  return out
end

---------------------------------------------------------------------------------------------------
-- comparison helpers (any devices and dtypes)
---------------------------------------------------------------------------------------------------
function fns.max_abs_diff(a, b)
  need_tensor(a, "max_abs_diff", "a", 2)
  need_tensor(b, "max_abs_diff", "b", 2)
  raise_if(C.al_max_abs_diff(a.raw, b.raw, result_f64), "max_abs_diff", 2)
  return tonumber(result_f64[0])
end

function fns.rmse(a, b)
  need_tensor(a, "rmse", "a", 2)
  need_tensor(b, "rmse", "b", 2)
  raise_if(C.al_rmse(a.raw, b.raw, result_f64), "rmse", 2)
  return tonumber(result_f64[0])
end

-- al.allclose(a, b, {atol=1e-8, rtol=1e-5}): |a - b| <= atol + rtol * |b| everywhere (PyTorch defaults).
function fns.allclose(a, b, opts)
  need_tensor(a, "allclose", "a", 2)
  need_tensor(b, "allclose", "b", 2)
  if opts ~= nil and type(opts) ~= "table" then
    error("allclose: opts: expected a table {atol=, rtol=}, got " .. describe(opts), 2)
  end
  opts = opts or {}
  local atol, rtol = opts.atol or 1e-8, opts.rtol or 1e-5
  if type(atol) ~= "number" or type(rtol) ~= "number" then
    error("allclose: atol and rtol: expected numbers, got " .. type(atol) .. " and " .. type(rtol), 2)
  end
  raise_if(C.al_allclose(a.raw, b.raw, atol, rtol, result_i32), "allclose", 2)
  return result_i32[0] ~= 0
end
function methods:allclose(b, opts) return fns.allclose(self, b, opts) end

M.functions = fns

function M.install(al)
  for k, f in pairs(fns) do al[k] = f end
end

return M
