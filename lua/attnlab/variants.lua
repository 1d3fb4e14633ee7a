--[[
attnlab.variants — attention variants scripted in Lua (FlexAttention-style score_mod / mask_mod):
the tracer, the symbolic derivatives, the code generators (CUDA C for the flash kernels' hooks, Lua
for the CPU oracle), the CPU oracle itself and block masks.

  local slopes = al.tensor({0.5, 0.25, 0.125, 0.0625})
  local out, ctx = al.attention.forward{query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd",
    attn_mask_type = "no_mask",
    score_mod = function(score, b, h, q_idx, kv_idx) return score - slopes[h] * al.abs(kv_idx - q_idx) end,
    mask_mod  = function(b, h, q_idx, kv_idx) return al.ge(q_idx, kv_idx) end}
  local bm = al.attention.block_mask(mask_mod, 1, 1, 4096, 4096, {block = 128})   -- tile map for the GPU

The language (docs/VARIANTS.md). score_mod(score, b, h, q_idx, kv_idx) returns the new logit; `score`
is softmax_scale * q.k (natural-log units), b/h/q_idx/kv_idx are 1-based like every index of the Lua
API (h is the QUERY head; q_idx/kv_idx are sequence-local). mask_mod(b, h, q_idx, kv_idx) returns
"keep" (nonzero / true = keep, FlexAttention's convention, the opposite of TE's attention_mask).
Both functions are called once with symbolic values that record what they compute:
  arithmetic      + - * / % unary minus, ^ with a constant exponent (number ^ symbolic via exp/log)
  comparisons     al.lt al.le al.gt al.ge al.eq al.ne (Lua's < <= == cannot return symbolic values)
  logic           al.land al.lor al.lnot, selection al.where(cond, a, b)
  math            al.exp al.log al.tanh al.sqrt al.abs al.min al.max (on tensors these stay the
                  tensor functions, on numbers they compute; only symbolic arguments are traced)
  captured tensors  any tensor the function reaches as an upvalue or a global (directly, inside a plain
                  table upvalue, or through a helper function's) is read with symbolic indices:
                  slopes[h], bias[h][kv_idx - q_idx + S], doc[b][q_idx]; al.attention.capture(t)
                  wraps a tensor explicitly where that does not reach it. Integer tensors (i32, i64,
                  u8, bool) are read as ints, float tensors as floats.
Unsupported constructs raise errors that say what to write instead: comparison operators, a Lua `if`
/ `and` / `or` on a symbolic value (detected as a comparison that does not reach the result), calling
a function that does not take symbolic values (math.exp, ...), symbolic exponents of ^, float indices.

Expressions are hash-consed (one node per distinct subexpression) and simplified as they are built:
constants fold, sums are kept as linear combinations (so (h + 1) - 1 is h again and
kv_idx - q_idx + S - 1 becomes kv_idx - q_idx + (S - 1)), x*1, x+0, x*0 and where(c, a, a) vanish.
The derivative with respect to score (-> the score_grad snippet, d(new)/d(score) * grad) and with
respect to each element a captured parameter contributes (-> capture_grad: atomicAdd(AL_CAP_GRAD(k) +
offset, grad * partial)) is taken symbolically from the same tree (grad = dL/d(new logit)).

Code generation. CUDA: one C expression per hook (kernels/flash_common.cuh's contract: b, h, q_idx,
kv_idx 0-based ints, so the Lua index h is (h + 1) and folds away in offsets); ints stay ints, / is
always float division (by a constant: times its reciprocal; else __fdividef, 2 ulp), math is
expf/logf/sqrtf/fabsf/fminf/fmaxf and a fast tanh (bf16 kernels: tanh.approx.f32, relative error
2^-11; f16 kernels: exp2 + reciprocal, absolute error < 1e-6). Captures are passed to C as
contiguous copies on q's device, f32 for float dtypes and i32 for integer dtypes (no copy when the
tensor already is one), read as ((const float *)AL_CAP(k))[offset] with the strides as constants:
changing a captured tensor's values never recompiles, changing its shape does. Capture gradients are
f32 contiguous accumulators of the capture's shape.

CPU oracle: the same simplified tree is printed as Lua source, load()ed (cached by source text) and
compiled by LuaJIT's trace compiler, looping over the [b,h,sq,skv] score matrix through FFI pointers.
We chose generated Lua over an interpreter (a tree walk per element is ~50x slower) and over generated
C (needs a C compiler at run time, which a researcher's machine may lack): LuaJIT compiles the
expression to machine code with nothing outside this process, in double precision, and reads
captures with bounds checks (an out-of-range index raises an error naming the capture, the dim and
the element). S = softmax_scale * Q K^T and O = P V use al.matmul in f64; mask, score_mod, softmax,
lse (-inf and zero output for fully masked rows) and the backward (dP, dS, score_grad, capture
gradients) run in the generated loop, so the oracle composes with the built-in mask exactly like
the flash kernels: an element is kept when it lies inside the sequence lengths, the causal / window
band, a non-empty block of the block mask (a full block keeps it without mask_mod) and mask_mod.

Block masks: block_mask(mask_mod, B, H, Sq, Skv, {block = 128}) classifies every tile as 0 (every
element masked), 1 (partial) or 2 (every element kept). Each tile is first judged by interval
arithmetic over its index box (exact for comparisons of sums of indices, so causal and sliding
window masks cost O(tiles)); tiles the intervals cannot decide are evaluated element by element with
the generated Lua, stopping as soon as the tile is known to be partial. The tensor broadcasts over b
and h (size 1) when mask_mod does not read them.
]]
local T = require "attnlab.tensor"
local lffi = require "attnlab.ffi"
local ffi = lffi.ffi

local M = {}
local is_tensor = T.is_tensor
local floor, huge = math.floor, math.huge

---------------------------------------------------------------------------------------------------
-- symbolic nodes
---------------------------------------------------------------------------------------------------
-- A node: {op, id, t ("i" int, "f" float, "b" bool), args (children), x (op data: a constant's value,
-- a variable's name, a capture's index, pow's exponent)}. Nodes are interned by structure.
local Sym = {}
local FIELDS = { op = true, id = true, t = true, args = true, x = true, key = true }
local intern = setmetatable({}, { __mode = "v" })
local next_id = 0

local function is_sym(x) return type(x) == "table" and getmetatable(x) == Sym end
M.is_sym = is_sym

local HINT = "score_mod / mask_mod tracing"

local function node(op, t, args, x)
  local key = op .. "|" .. t .. "|" .. tostring(x)
  if args then for i = 1, #args do key = key .. "|" .. args[i].id end end
  local n = intern[key]
  if n then return n end
  next_id = next_id + 1
  n = setmetatable({ op = op, id = next_id, t = t, args = args or {}, x = x, key = key }, Sym)
  intern[key] = n
  return n
end

local function numkey(v)
  if v ~= v then return "nan" end
  if v == huge then return "inf" end
  if v == -huge then return "-inf" end
  if v == 0 and 1 / v < 0 then return "-0" end
  return string.format("%.17g", v)
end

local function const(v, t)
  if t == nil then t = (v % 1 == 0 and math.abs(v) < 2 ^ 31) and "i" or "f" end
  local n = node("const", t, nil, numkey(v))
  rawset(n, "v", v)
  return n
end
local function cval(n) return n.op == "const" and rawget(n, "v") or nil end

local function var(name, t) return node("var", t, nil, name) end

-- user value -> node
local function lift(x, fname)
  if is_sym(x) then return x end
  local tx = type(x)
  if tx == "number" then return const(x) end
  if tx == "boolean" then return const(x and 1 or 0, "b") end
  if is_tensor(x) then
    error(fname .. ": got a tensor inside a traced score_mod / mask_mod: read one element with symbolic " ..
      "indices (t[h], t[b][q_idx]) instead", 4)
  end
  error(fname .. ": expected a number or a symbolic value, got " .. tx, 4)
end

local function num_t(a, b) return (a.t == "f" or b.t == "f") and "f" or "i" end

-- linear form: c + sum coef_k * term_k
local function lin_of(n, scale, acc)
  local c = cval(n)
  if c then acc.c = acc.c + scale * c return end
  local op = n.op
  if op == "add" then lin_of(n.args[1], scale, acc) lin_of(n.args[2], scale, acc) return end
  if op == "sub" then lin_of(n.args[1], scale, acc) lin_of(n.args[2], -scale, acc) return end
  if op == "neg" then lin_of(n.args[1], -scale, acc) return end
  if op == "mul" then
    local a, b = n.args[1], n.args[2]
    local ca, cb = cval(a), cval(b)
    if ca then lin_of(b, scale * ca, acc) return end
    if cb then lin_of(a, scale * cb, acc) return end
  end
  local k = acc.coef[n]
  if k == nil then acc.order[#acc.order + 1] = n end
  acc.coef[n] = (k or 0) + scale
  if n.t == "f" then acc.t = "f" end
end

local function raw_mul(a, b)
  if a.id > b.id then a, b = b, a end
  return node("mul", num_t(a, b), { a, b })
end

local function lin_build(acc)
  local pos, negs = {}, {}
  table.sort(acc.order, function(x, y) return x.id < y.id end)
  for _, n in ipairs(acc.order) do
    local k = acc.coef[n]
    if k ~= 0 then
      local t
      if k == 1 or k == -1 then t = n else t = raw_mul(const(math.abs(k)), n) end
      if k > 0 then pos[#pos + 1] = t else negs[#negs + 1] = t end
    end
  end
  local c = acc.c
  local r
  if #pos == 0 and #negs > 0 and c > 0 then   -- c - x rather than -x + c
    r = const(c, acc.t == "f" and "f" or nil)
    c = 0
  end
  for _, t in ipairs(pos) do r = r and node("add", num_t(r, t), { r, t }) or t end
  for _, t in ipairs(negs) do r = r and node("sub", num_t(r, t), { r, t }) or node("neg", t.t == "b" and "i" or t.t, { t }) end
  if r == nil then return const(c, acc.t == "f" and "f" or nil) end
  if c ~= 0 then
    if c > 0 then r = node("add", num_t(r, const(c)), { r, const(c) })
    else r = node("sub", num_t(r, const(-c)), { r, const(-c) }) end
  end
  return r
end

local function linear(a, b, sb)
  local acc = { c = 0, coef = {}, order = {}, t = (a.t == "f" or b.t == "f") and "f" or "i" }
  lin_of(a, 1, acc)
  lin_of(b, sb, acc)
  return lin_build(acc)
end

local S = {}   -- smart constructors (fold and simplify)
M.S = S

function S.add(a, b) return linear(a, b, 1) end
function S.sub(a, b) return linear(a, b, -1) end
function S.neg(a) return linear(const(0), a, -1) end
function S.mul(a, b)
  local ca, cb = cval(a), cval(b)
  if ca and cb then return const(ca * cb, num_t(a, b) == "f" and "f" or nil) end
  if ca == 0 or cb == 0 then return const(0, num_t(a, b) == "f" and "f" or nil) end
  if ca or cb then
    local acc = { c = 0, coef = {}, order = {}, t = num_t(a, b) }
    if ca then lin_of(b, ca, acc) else lin_of(a, cb, acc) end
    return lin_build(acc)
  end
  return raw_mul(a, b)
end
function S.div(a, b)
  local ca, cb = cval(a), cval(b)
  if ca and cb then return const(ca / cb, "f") end
  if cb == 1 then
    if a.t == "f" then return a end
    return node("div", "f", { a, b })
  end
  if ca == 0 and b.t ~= "f" then return const(0, "f") end
  return node("div", "f", { a, b })
end
function S.pow(a, e)
  local ca = cval(a)
  if ca then return const(ca ^ e, "f") end
  if e == 1 then return a end
  if e == 0 then return const(1, "f") end
  if e == 2 then return raw_mul(a, a) end
  if e == 0.5 then return S.sqrt(a) end
  if e == -1 then return S.div(const(1, "f"), a) end
  return node("pow", "f", { a }, numkey(e))
end
function S.mod(a, b)
  local ca, cb = cval(a), cval(b)
  if ca and cb then return const(ca % cb, num_t(a, b) == "f" and "f" or nil) end
  return node("mod", num_t(a, b), { a, b })
end

local CMP = { lt = function(x, y) return x < y end, le = function(x, y) return x <= y end,
  gt = function(x, y) return x > y end, ge = function(x, y) return x >= y end,
  eq = function(x, y) return x == y end, ne = function(x, y) return x ~= y end }
-- integer comparisons are normalised: a - b = P - N + c becomes P op N - c (exact for ints), so
-- (q_idx + 1) >= (kv_idx + 1) is q_idx >= kv_idx again
local function cmp_sides(a, b)
  local acc = { c = 0, coef = {}, order = {}, t = "i" }
  lin_of(a, 1, acc)
  lin_of(b, -1, acc)
  local P = { c = 0, coef = {}, order = {}, t = "i" }
  local N = { c = -acc.c, coef = {}, order = {}, t = "i" }
  for _, n in ipairs(acc.order) do
    local k = acc.coef[n]
    if k > 0 then P.order[#P.order + 1] = n; P.coef[n] = k
    elseif k < 0 then N.order[#N.order + 1] = n; N.coef[n] = -k end
  end
  return lin_build(P), lin_build(N)
end
for name, f in pairs(CMP) do
  S[name] = function(a, b)
    local ca, cb = cval(a), cval(b)
    if ca and cb then return const(f(ca, cb) and 1 or 0, "b") end
    if a.t == "i" and b.t == "i" then
      a, b = cmp_sides(a, b)
      ca, cb = cval(a), cval(b)
      if ca and cb then return const(f(ca, cb) and 1 or 0, "b") end
    end
    return node(name, "b", { a, b })
  end
end
local function truth(n) local c = cval(n) if c == nil then return nil end return c ~= 0 end
function S.land(a, b)
  local ta, tb = truth(a), truth(b)
  if ta == false or tb == false then return const(0, "b") end
  if ta == true and tb == true then return const(1, "b") end
  if ta == true then return b.t == "b" and b or S.ne(b, const(0)) end
  if tb == true then return a.t == "b" and a or S.ne(a, const(0)) end
  if rawequal(a, b) then return a end
  if a.id > b.id then a, b = b, a end
  return node("land", "b", { a, b })
end
function S.lor(a, b)
  local ta, tb = truth(a), truth(b)
  if ta == true or tb == true then return const(1, "b") end
  if ta == false and tb == false then return const(0, "b") end
  if ta == false then return b.t == "b" and b or S.ne(b, const(0)) end
  if tb == false then return a.t == "b" and a or S.ne(a, const(0)) end
  if rawequal(a, b) then return a end
  if a.id > b.id then a, b = b, a end
  return node("lor", "b", { a, b })
end
function S.lnot(a)
  local ta = truth(a)
  if ta ~= nil then return const(ta and 0 or 1, "b") end
  if a.op == "lnot" then return a.args[1].t == "b" and a.args[1] or S.ne(a.args[1], const(0)) end
  return node("lnot", "b", { a })
end
function S.where(c, a, b)
  local tc = truth(c)
  if tc == true then return a end
  if tc == false then return b end
  if rawequal(a, b) then return a end
  local t = (a.t == "f" or b.t == "f") and "f" or ((a.t == "b" and b.t == "b") and "b" or "i")
  return node("where", t, { c, a, b })
end

local MATH1 = { exp = math.exp, log = math.log, tanh = math.tanh, sqrt = math.sqrt }
for name, f in pairs(MATH1) do
  S[name] = function(a)
    local ca = cval(a)
    if ca then return const(f(ca), "f") end
    return node(name, "f", { a })
  end
end
function S.abs(a)
  local ca = cval(a)
  if ca then return const(math.abs(ca), a.t == "f" and "f" or nil) end
  return node("abs", a.t == "b" and "i" or a.t, { a })
end
function S.min(a, b)
  local ca, cb = cval(a), cval(b)
  if ca and cb then return const(math.min(ca, cb), num_t(a, b) == "f" and "f" or nil) end
  if rawequal(a, b) then return a end
  if a.id > b.id then a, b = b, a end
  return node("min", num_t(a, b), { a, b })
end
function S.max(a, b)
  local ca, cb = cval(a), cval(b)
  if ca and cb then return const(math.max(ca, cb), num_t(a, b) == "f" and "f" or nil) end
  if rawequal(a, b) then return a end
  if a.id > b.id then a, b = b, a end
  return node("max", num_t(a, b), { a, b })
end

---------------------------------------------------------------------------------------------------
-- the tracing context: captures and the comparisons created (to detect Lua `if` on them)
---------------------------------------------------------------------------------------------------
local ctx_stack = {}
local function cur() return ctx_stack[#ctx_stack] end

local function note_bool(n)
  local c = cur()
  if c and n.op ~= "const" and n.t == "b" then c.bools[#c.bools + 1] = n end
  return n
end

-- metamethods
local function arith(name, f)
  return function(a, b)
    return f(lift(a, "symbolic " .. name), lift(b, "symbolic " .. name))
  end
end
Sym.__add = arith("+", S.add)
Sym.__sub = arith("-", S.sub)
Sym.__mul = arith("*", S.mul)
Sym.__div = arith("/", S.div)
Sym.__mod = arith("%", S.mod)
Sym.__unm = function(a) return S.neg(a) end
Sym.__pow = function(a, e)
  if is_sym(e) then
    if type(a) == "number" and a > 0 then return S.exp(S.mul(e, const(math.log(a), "f"))) end
    error("x ^ y: the exponent must be a Lua number (for a symbolic exponent write al.exp(y * al.log(x)))", 2)
  end
  if type(e) ~= "number" then error("x ^ y: the exponent must be a Lua number, got " .. type(e), 2) end
  return S.pow(a, e)
end
local CMP_MSG = "comparison operators (<, <=, >, >=, ==, ~=) cannot trace symbolic values (Lua turns their " ..
  "result into a boolean): write al.lt(a, b), al.le, al.gt, al.ge, al.eq or al.ne, and al.where(cond, a, b) to select"
Sym.__lt = function() error(CMP_MSG, 2) end
Sym.__le = function() error(CMP_MSG, 2) end
Sym.__eq = function(a, b)
  if rawequal(a, b) then return true end
  error(CMP_MSG, 2)
end
Sym.__call = function() error("a symbolic value is not a function (" .. HINT .. ")", 2) end
Sym.__concat = function() error("a symbolic value cannot be concatenated to a string (" .. HINT .. ")", 2) end
Sym.__len = function() error("# of a symbolic value: symbolic values are scalars (" .. HINT .. ")", 2) end
Sym.__newindex = function() error("symbolic values are read-only (" .. HINT .. ")", 2) end
Sym.__index = function(_, k)
  if FIELDS[k] or k == "v" then return nil end
  if type(k) ~= "string" then
    error("a symbolic value cannot be indexed (" .. HINT .. "; was a captured tensor given more indices than it has dims?)", 2)
  end
  error("symbolic values have no field or method '" .. tostring(k) .. "' (" .. HINT .. "): use al.exp(x), " ..
    "al.abs(x), ... instead of methods", 2)
end
Sym.__tostring = function(n) return "<symbolic " .. n.op .. " " .. n.t .. " #" .. n.id .. ">" end

---------------------------------------------------------------------------------------------------
-- captured tensors: proxies indexed with symbolic or constant indices
---------------------------------------------------------------------------------------------------
local Cap = {}   -- proxy metatable: {cap = capture record, idx = indices so far}
local function kind_of(t)
  local dt = t:dtype()
  if dt == "i32" or dt == "i64" or dt == "u8" or dt == "bool" then return "i" end
  if dt == "fp8_e4m3" or dt == "fp8_e5m2" then
    error("score_mod / mask_mod: captured tensor of dtype " .. dt .. ": convert it with t:to('f32') first", 5)
  end
  return "f"
end

local function load_node(rec, idx)
  local args = {}
  for i = 1, #idx do args[i] = idx[i] end
  return node("load", rec.kind, args, rec.k)
end

Cap.__index = function(p, key)
  local rec, idx = rawget(p, "cap"), rawget(p, "idx")
  if type(key) == "string" then
    local t = rec.tensor
    local f = t[key]
    if type(f) ~= "function" then return f end
    return function(_, ...) return f(t, ...) end
  end
  local nd = #rec.shape
  local d = #idx + 1
  if d > nd then error(string.format("captured tensor %d (shape %s) indexed with more than %d indices",
    rec.k + 1, rec.shape_str, nd), 2) end
  local n
  if type(key) == "number" then
    if key % 1 ~= 0 or key < 1 or key > rec.shape[d] then
      error(string.format("captured tensor %d (shape %s): constant index %s on dim %d outside 1..%d",
        rec.k + 1, rec.shape_str, tostring(key), d, rec.shape[d]), 2)
    end
    n = const(key)
  elseif is_sym(key) then
    if key.t == "f" then
      error(string.format("captured tensor %d (shape %s): the index on dim %d is a float expression; indices " ..
        "must be integer expressions of b, h, q_idx, kv_idx, integer captures and integer constants " ..
        "(/ always gives a float)", rec.k + 1, rec.shape_str, d), 2)
    end
    n = key
  else
    error(string.format("captured tensor %d: index on dim %d: expected an integer or a symbolic index, got %s",
      rec.k + 1, d, type(key)), 2)
  end
  local nidx = {}
  for i = 1, #idx do nidx[i] = idx[i] end
  nidx[d] = n
  if d == nd then
    local c = cur()
    local ld = load_node(rec, nidx)
    if c then c.loads[ld] = rec end
    return ld
  end
  return setmetatable({ cap = rec, idx = nidx }, Cap)
end
Cap.__newindex = function() error("captured tensors are read-only inside score_mod / mask_mod", 2) end
local function partial_err()
  error("a captured tensor was used before all its dims were indexed (write t[i][j] for a 2-d tensor)", 2)
end
for _, mm in ipairs({ "__add", "__sub", "__mul", "__div", "__mod", "__pow", "__unm", "__lt", "__le", "__concat" }) do
  Cap[mm] = partial_err
end
Cap.__tostring = function(p) return "<captured tensor " .. (rawget(p, "cap").k + 1) .. ">" end

-- al.attention.capture(t): an explicit capture (for tensors the upvalue scan does not reach)
local Explicit = {}
Explicit.__index = function(e, key)
  local c = cur()
  local t = rawget(e, "tensor")
  if c == nil then
    if type(key) == "string" then
      local f = t[key]
      if type(f) ~= "function" then return f end
      return function(_, ...) return f(t, ...) end
    end
    error("al.attention.capture: index a captured tensor inside score_mod / mask_mod only", 2)
  end
  return c.proxy(t)[key]
end
-- al.attention.capture(t): wrap a tensor that score_mod / mask_mod cannot reach as an upvalue (a global,
-- a nested structure) so it can be indexed with symbolic indices
function M.capture(t)
  if not is_tensor(t) then error("attention.capture: expected a tensor, got " .. type(t), 2) end
  return setmetatable({ tensor = t }, Explicit)
end

-- al.attention.param(t): t is a captured tensor whose gradient the backward returns
local params = setmetatable({}, { __mode = "k" })
-- al.attention.param(t): mark captured tensor t as a parameter: the backward returns its gradient in
-- grads.captures[t] (and grads.captures[i] for ctx.captures[i]); returns t
function M.param(t)
  if type(t) == "table" and getmetatable(t) == Explicit then t = rawget(t, "tensor") end
  if not is_tensor(t) then error("attention.param: expected a tensor, got " .. type(t), 2) end
  params[t] = true
  return t
end
function M.is_param(t) return params[t] == true end

local function new_context()
  local c = { caps = {}, by_tensor = {}, loads = {}, bools = {} }
  function c.record(t)
    local rec = c.by_tensor[t]
    if rec then return rec end
    local nd = t:dim()
    if nd == 0 then error("score_mod / mask_mod: a 0-d captured tensor cannot be indexed: use a 1-element tensor", 4) end
    local shape = t:size()
    rec = { k = #c.caps, tensor = t, shape = shape, shape_str = table.concat(shape, "x"), kind = kind_of(t),
      requires_grad = params[t] == true }
    -- contiguous strides (the copies the oracle and the GPU read)
    local st, s = {}, 1
    for d = nd, 1, -1 do st[d] = s; s = s * shape[d] end
    rec.strides, rec.numel = st, s
    c.caps[#c.caps + 1] = rec
    c.by_tensor[t] = rec
    return rec
  end
  function c.proxy(t) return setmetatable({ cap = c.record(t), idx = {} }, Cap) end
  return c
end

-- Replace tensor upvalues of fn (directly, in plain tables, through helper functions) by proxies;
-- returns a function that restores everything.
local function swap_upvalues(fn, c, al)
  local undo = {}
  local seen = {}
  local function scan(f, depth)
    if seen[f] then return end
    seen[f] = true
    -- globals (the REPL's `slopes = al.tensor(...)` is one): the function reads them through a proxy
    -- environment that hands out captures for tensors, for as long as the trace runs
    local info = debug.getinfo(f, "S")
    if info and info.what ~= "C" then
      local env = getfenv(f)
      if type(env) == "table" then
        local penv = setmetatable({}, {
          __index = function(_, k)
            local v = env[k]
            if is_tensor(v) then return c.proxy(v) end
            return v
          end,
          __newindex = env })
        setfenv(f, penv)
        undo[#undo + 1] = function() setfenv(f, env) end
      end
    end
    local i = 1
    while true do
      local name, val = debug.getupvalue(f, i)
      if name == nil then break end
      if is_tensor(val) then
        local slot = i
        debug.setupvalue(f, slot, c.proxy(val))
        undo[#undo + 1] = function() debug.setupvalue(f, slot, val) end
      elseif type(val) == "function" and depth < 4 then
        scan(val, depth + 1)
      elseif type(val) == "table" and val ~= al and getmetatable(val) == nil and not seen[val] then
        seen[val] = true
        local n = 0
        for k2, x in pairs(val) do
          n = n + 1
          if n > 256 then break end
          if is_tensor(x) then undo[#undo + 1] = { val, k2, x } end
        end
        for j = #undo, 1, -1 do
          local u = undo[j]
          if type(u) == "table" and u[1] == val then rawset(val, u[2], c.proxy(u[3])) end
        end
      end
      i = i + 1
    end
  end
  scan(fn, 0)
  return function()
    for j = #undo, 1, -1 do
      local u = undo[j]
      if type(u) == "function" then u() else rawset(u[1], u[2], u[3]) end
    end
  end
end

-- math.* functions that explain themselves when they meet a symbolic value during a trace
local MATH_NAMES = { "exp", "log", "tanh", "sqrt", "abs", "min", "max", "floor", "ceil", "pow", "sin", "cos",
  "fmod", "log10" }
local function swap_math()
  local saved = {}
  for _, n in ipairs(MATH_NAMES) do
    local f = math[n]
    saved[n] = f
    math[n] = function(...)
      for i = 1, select("#", ...) do
        if is_sym((select(i, ...))) then
          error("math." .. n .. " cannot take a symbolic value (" .. HINT .. "): use al." ..
            ((n == "exp" or n == "log" or n == "tanh" or n == "sqrt" or n == "abs" or n == "min" or n == "max")
              and n or "exp / al.log / al.tanh / al.sqrt / al.abs / al.min / al.max / al.where") ..
            " instead", 2)
        end
      end
      return f(...)
    end
  end
  return function() for n, f in pairs(saved) do math[n] = f end end
end

-- reachability (for the `if` detector)
local function reach(root, set)
  if set[root] then return end
  set[root] = true
  for _, a in ipairs(root.args) do reach(a, set) end
end

local function rewrite_error(msg)
  msg = tostring(msg)
  if msg:find("attempt to compare", 1, true) then
    return msg .. " (" .. CMP_MSG .. ")"
  end
  if msg:find("attempt to perform arithmetic on", 1, true) or msg:find("number expected, got table", 1, true) then
    return msg .. " (inside score_mod / mask_mod only symbolic-aware functions work: al.exp, al.log, al.tanh, " ..
      "al.sqrt, al.abs, al.min, al.max, al.where, al.lt ... and arithmetic)"
  end
  return msg
end

-- Trace fn with the symbolic arguments; returns the result node.
local function trace(al, fn, args, what, c)
  ctx_stack[#ctx_stack + 1] = c
  local before = #c.bools
  local restore = swap_upvalues(fn, c, al)
  local restore_math = swap_math()
  local ok, res = pcall(fn, unpack(args))
  restore_math()
  restore()
  ctx_stack[#ctx_stack] = nil
  if not ok then
    error(what .. ": " .. rewrite_error(res), 0)
  end
  if res == nil then error(what .. ": the function returned nothing (it must return " ..
    (what == "mask_mod" and "keep: a boolean expression" or "the new score") .. ")", 0) end
  if getmetatable(res) == Cap then error(what .. ": returned a partly indexed captured tensor", 0) end
  local ok2, root = pcall(lift, res, what)
  if not ok2 then error(what .. ": returned " .. type(res) .. ", expected a number or a symbolic value", 0) end
  local set = {}
  reach(root, set)
  for i = before + 1, #c.bools do
    local b = c.bools[i]
    if not set[b] then
      error(what .. ": a comparison or logical value (" .. b.op .. ") was computed but does not reach the result: " ..
        "a Lua `if`, `and`, `or` or `not` on a symbolic value always sees true. Write al.where(cond, a, b) to " ..
        "select and al.land / al.lor / al.lnot to combine conditions", 0)
    end
  end
  return root
end

---------------------------------------------------------------------------------------------------
-- derivatives
---------------------------------------------------------------------------------------------------
local ZERO_F, ONE_F
local function deriv(root, wrt)
  ZERO_F = ZERO_F or const(0, "f")
  ONE_F = ONE_F or const(1, "f")
  local memo, dep = {}, {}
  local function depends(n)
    local d = dep[n]
    if d ~= nil then return d end
    d = rawequal(n, wrt)
    if not d then for _, a in ipairs(n.args) do if depends(a) then d = true break end end end
    dep[n] = d
    return d
  end
  local function D(n)
    if not depends(n) then return ZERO_F end
    if rawequal(n, wrt) then return ONE_F end
    local r = memo[n]
    if r then return r end
    local op, a, b = n.op, n.args[1], n.args[2]
    if op == "add" then r = S.add(D(a), D(b))
    elseif op == "sub" then r = S.sub(D(a), D(b))
    elseif op == "neg" then r = S.neg(D(a))
    elseif op == "mul" then r = S.add(S.mul(D(a), b), S.mul(a, D(b)))
    elseif op == "div" then r = S.sub(S.div(D(a), b), S.div(S.mul(a, D(b)), S.mul(b, b)))
    elseif op == "pow" then
      local e = tonumber(n.x)
      r = S.mul(S.mul(const(e, "f"), S.pow(a, e - 1)), D(a))
    elseif op == "exp" then r = S.mul(n, D(a))
    elseif op == "log" then r = S.div(D(a), a)
    elseif op == "tanh" then r = S.mul(S.sub(ONE_F, S.mul(n, n)), D(a))
    elseif op == "sqrt" then r = S.div(D(a), S.mul(const(2, "f"), n))
    elseif op == "abs" then r = S.where(S.lt(a, const(0)), S.neg(D(a)), D(a))
    elseif op == "min" then r = S.where(S.le(a, b), D(a), D(b))
    elseif op == "max" then r = S.where(S.ge(a, b), D(a), D(b))
    elseif op == "where" then r = S.where(a, D(b), D(n.args[3]))
    elseif op == "mod" then
      if depends(b) then error("score_mod: the derivative of x % y with respect to y is not supported", 0) end
      r = D(a)
    else
      r = ZERO_F   -- comparisons, logic, loads at integer indices: piecewise constant
    end
    if r.t ~= "f" then
      local c = cval(r)
      r = c and const(c, "f") or r
    end
    memo[n] = r
    return r
  end
  return D(root)
end
M.deriv = deriv

---------------------------------------------------------------------------------------------------
-- code generation: CUDA C and Lua
---------------------------------------------------------------------------------------------------
local function cuda_float(v)
  if v ~= v then return "__int_as_float(0x7fffffff)" end
  if v == huge then return "__int_as_float(0x7f800000)" end
  if v == -huge then return "__int_as_float(0xff800000)" end
  local s = string.format("%.9g", v)
  if not s:find("[%.eEn]") then s = s .. ".0" end
  return s .. "f"
end

local CUDA_VARS = { score = "score", grad = "grad", b = "b", h = "h", q = "q_idx", kv = "kv_idx" }
local C_CMP = { lt = "<", le = "<=", gt = ">", ge = ">=", eq = "==", ne = "!=" }
local C_ARITH = { add = "+", sub = "-", mul = "*" }
-- tanh is al_v_tanh (the prelude): libdevice's tanhf costs ~20 instructions and two MUFU ops per score,
-- which made soft-capping 3.4x the plain forward on the H200; al_v_tanh is exp2 + reciprocal, absolute
-- error < 1e-6 (what a logit needs: softmax sees absolute, not relative, errors)
local C_FN = { exp = "expf", log = "logf", tanh = "al_v_tanh", sqrt = "sqrtf" }

-- offset node of a load (0-based, from the Lua 1-based indices) for given strides
local function offset_node(idx, strides)
  local off = const(0)
  for d = 1, #idx do
    off = S.add(off, S.mul(S.sub(idx[d], const(1)), const(strides[d])))
  end
  return off
end

-- a constant whose reciprocal and products stay normal f32 numbers (safe to fold into a multiplier)
local function foldable(c) return c ~= nil and c == c and math.abs(c) >= 2 ^ -126 and math.abs(c) <= 2 ^ 126 end

-- gen_cuda(root, caps, uses[, pre]): the CUDA C expression of a traced tree. pre: the AL_SCORE_PRE form
-- (kernels/flash_common.cuh), where score is acc * scale and a constant factor on score folds into
-- scale: score / c becomes acc * (scale * (1/c)), one FMUL per element once the compiler hoists
-- scale * (1/c) out of the kernel's loops (it may not reassociate (acc * scale) * (1/c) itself).
local function gen_cuda(root, caps, uses, pre)
  local E
  local function is_score(n) return n.op == "var" and n.x == "score" end
  -- pre: score times constant k as acc * (scale * k)
  local function scaled_score(k) return "(acc * (scale * " .. cuda_float(k) .. "))" end
  -- as a float: constants as float literals, int expressions cast
  local function EF(n)
    if n.t == "f" then return E(n) end
    local c = cval(n)
    if c then return cuda_float(c) end
    return "(float)" .. E(n)
  end
  function E(n)
    local op = n.op
    if op == "const" then
      local v = rawget(n, "v")
      if n.t == "f" then return cuda_float(v) end
      return string.format("%d", v)
    elseif op == "var" then
      if pre and n.x == "score" then return "(acc * scale)" end
      return CUDA_VARS[n.x]
    elseif pre and op == "mul" and (is_score(n.args[1]) or is_score(n.args[2])) and
        foldable(cval(n.args[1]) or cval(n.args[2])) then
      return scaled_score(cval(n.args[1]) or cval(n.args[2]))
    elseif pre and op == "div" and is_score(n.args[1]) and foldable(cval(n.args[2])) then
      return scaled_score(1 / cval(n.args[2]))
    elseif C_ARITH[op] then
      return "(" .. E(n.args[1]) .. " " .. C_ARITH[op] .. " " .. E(n.args[2]) .. ")"
    elseif op == "neg" then return "(-" .. E(n.args[1]) .. ")"
    elseif op == "div" then
      -- by a constant: times its reciprocal (one FMUL, <= 1.5 ulp); otherwise __fdividef (2 ulp, no
      -- slow path). IEEE division is ~10 instructions with a branch, per score element.
      -- (only where c and 1/c are normal f32 numbers: 2^-126 <= |c| <= 2^126, else __fdividef)
      local c = cval(n.args[2])
      if foldable(c) then
        return "(" .. EF(n.args[1]) .. " * " .. cuda_float(1 / c) .. ")"
      end
      return "__fdividef(" .. EF(n.args[1]) .. ", " .. EF(n.args[2]) .. ")"
    elseif op == "pow" then return "powf(" .. EF(n.args[1]) .. ", " .. cuda_float(tonumber(n.x)) .. ")"
    elseif op == "mod" then
      uses.mod = true
      return (n.t == "f" and "al_v_fmod(" or "al_v_imod(") .. E(n.args[1]) .. ", " .. E(n.args[2]) .. ")"
    elseif C_CMP[op] then return "(" .. E(n.args[1]) .. " " .. C_CMP[op] .. " " .. E(n.args[2]) .. ")"
    elseif op == "land" then return "(" .. E(n.args[1]) .. " && " .. E(n.args[2]) .. ")"
    elseif op == "lor" then return "(" .. E(n.args[1]) .. " || " .. E(n.args[2]) .. ")"
    elseif op == "lnot" then return "(!" .. E(n.args[1]) .. ")"
    elseif op == "where" then
      local a, b = n.args[2], n.args[3]
      local sa, sb = E(a), E(b)
      if n.t == "f" then sa, sb = EF(a), EF(b) end
      return "(" .. E(n.args[1]) .. " ? " .. sa .. " : " .. sb .. ")"
    elseif C_FN[op] then
      if op == "tanh" then uses.tanh = true end
      uses.mufu = true
      return C_FN[op] .. "(" .. EF(n.args[1]) .. ")"
    elseif op == "abs" then
      if n.t == "f" then return "fabsf(" .. E(n.args[1]) .. ")" end
      uses.iabs = true
      return "al_v_iabs(" .. E(n.args[1]) .. ")"
    elseif op == "min" or op == "max" then
      if n.t == "f" then return (op == "min" and "fminf(" or "fmaxf(") .. EF(n.args[1]) .. ", " .. EF(n.args[2]) .. ")" end
      uses.iminmax = true
      return "al_v_i" .. op .. "(" .. E(n.args[1]) .. ", " .. E(n.args[2]) .. ")"
    elseif op == "load" then
      local rec = caps[n.x + 1]
      local off = offset_node(n.args, rec.strides)
      return "((const " .. (rec.kind == "i" and "int" or "float") .. " *)AL_CAP(" .. rec.k .. "))[" .. E(off) .. "]"
    end
    error("variants: internal: no CUDA for op " .. tostring(op))
  end
  return E(root)
end

-- The kernels' build switches ATTNLAB_VARIANT_DEFINES may set (each read with #ifndef in kernels/):
local VARIANT_DEFINES = {
  AL_SM90_PINGPONG = true,    -- flash_fwd_sm90.cu: the two consumer warpgroups take turns on the tensor cores (1)
  AL_SM90_PIPE = true,        -- flash_fwd_sm90.cu: S(j+1) issued with O += P(j) V(j) (1 at d <= 128)
  AL_SM90_LEAN_MOD = true,    -- flash_bwd_sm90.cu: bf16 score_mod without capture gradients on the plain path (0)
  AL_TANH_FMA_EVERY = true,   -- flash_fwd_sm90.cu: a bf16 score_mod's tanh on the FMA pipe every k-th column group (0)
}

local function cuda_prelude(uses)
  local p, defs = {}, {}
  -- ATTNLAB_VARIANT_DEFINES="NAME=N ..." (A/B measurements of the kernels' build switches): each becomes a
  -- #define at the top of every variant source, so it is part of the cache keys. Only switches that leave the
  -- launch (tiles, threads, shared memory) as the host computes it: see VARIANT_DEFINES.
  for def in (os.getenv("ATTNLAB_VARIANT_DEFINES") or ""):gmatch("[^%s,]+") do
    local name, val = def:match("^([%w_]+)=(%d+)$")
    if not (name and VARIANT_DEFINES[name]) then
      local names = {}
      for k in pairs(VARIANT_DEFINES) do names[#names + 1] = k end
      table.sort(names)
      error("ATTNLAB_VARIANT_DEFINES: expected NAME=N items (N a non-negative integer) separated by spaces or " ..
        "commas, NAME one of " .. table.concat(names, ", ") .. "; got '" .. def .. "'", 0)
    end
    p[#p + 1] = string.format("#define %s %s", name, val)
    defs[name] = tonumber(val)
  end
  if uses.mod then
    p[#p + 1] = "static __device__ __forceinline__ int al_v_imod(int a, int m) { int r = a % m; return (r != 0 && ((r < 0) != (m < 0))) ? r + m : r; }"
    p[#p + 1] = "static __device__ __forceinline__ float al_v_fmod(float a, float m) { return a - floorf(a / m) * m; }"
  end
  if uses.iabs then p[#p + 1] = "static __device__ __forceinline__ int al_v_iabs(int a) { return a < 0 ? -a : a; }" end
  if uses.tanh then
    -- bf16 kernels: the hardware tanh (tanh.approx.f32, one MUFU op, relative error 2^-11, below the 2^-9
    -- of P's own bf16 rounding; what FlashAttention's soft-capping uses). f16 kernels (P rounded at
    -- 2^-12): tanh |x| = 1 - 2 / (e^2|x| + 1) with __expf (ex2.approx; inf past |x| ~ 44, giving 1) and
    -- __fdividef (rcp.approx), absolute error < 1e-6. AL_BF16 is a -D option, so the prelude sees it.
    p[#p + 1] = "static __device__ __forceinline__ float al_v_tanh(float x) {\n" ..
      "#if defined(AL_BF16) && AL_BF16\n" ..
      "  float y; asm(\"tanh.approx.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x)); return y;\n" ..
      "#else\n" ..
      "  const float e = __expf(2.0f * fabsf(x)); return copysignf(1.0f - __fdividef(2.0f, e + 1.0f), x);\n" ..
      "#endif\n" ..
      "}"
    -- AL_TANH_FMA_EVERY (an experiment): where the Hopper forward's al_fl_mod_pre says al_tanh_fma_now, the FMA-pipe
    -- al_tanh_fma (kernels/flash_common.cuh); everywhere else this constant false keeps the MUFU tanh
    if (defs.AL_TANH_FMA_EVERY or 0) > 0 then
      p[#p + 1] = "#if defined(AL_BF16) && AL_BF16\n" ..
        "static constexpr bool al_tanh_fma_now = false;\n" ..
        "#define al_v_tanh(x) (al_tanh_fma_now ? al_tanh_fma(x) : al_v_tanh(x))\n" ..
        "#endif"
    end
  end
  if uses.iminmax then
    p[#p + 1] = "static __device__ __forceinline__ int al_v_imin(int a, int b) { return a < b ? a : b; }"
    p[#p + 1] = "static __device__ __forceinline__ int al_v_imax(int a, int b) { return a > b ? a : b; }"
  end
  if uses.mufu then
    -- the expression has its own multi-function-unit operation per score (tanh, exp, log, sqrt) beside the
    -- softmax's exponential: the Hopper forward then computes every k-th column group's exponentials on
    -- the FMA pipe (kernels/flash_common.cuh, AL_EX2_FMA_EVERY; docs/PERFORMANCE.md session 10 for k).
    -- ATTNLAB_VARIANT_EX2_FMA=k sets k (0: off), for measurements.
    local k = tonumber(os.getenv("ATTNLAB_VARIANT_EX2_FMA") or "") or 8
    if k > 0 then p[#p + 1] = string.format("#define AL_EX2_FMA_EVERY %d", math.floor(k)) end
  end
  if #p == 0 then return nil end
  return table.concat(p, "\n") .. "\n"
end

local function lua_num(v)
  if v ~= v then return "(0/0)" end
  if v == huge then return "math.huge" end
  if v == -huge then return "(-math.huge)" end
  return string.format("%.17g", v)
end

local LUA_CMP = { lt = "<", le = "<=", gt = ">", ge = ">=", eq = "==", ne = "~=" }
local LUA_ARITH = { add = "+", sub = "-", mul = "*", div = "/", mod = "%" }

-- Lua source of an expression; vars map to the given local names; loads call ld<k>(i1, i2, ...)
local function gen_lua(root, names)
  local function E(n)
    local op = n.op
    if op == "const" then return lua_num(rawget(n, "v"))
    elseif op == "var" then return names[n.x]
    elseif LUA_ARITH[op] then return "(" .. E(n.args[1]) .. " " .. LUA_ARITH[op] .. " " .. E(n.args[2]) .. ")"
    elseif op == "neg" then return "(-" .. E(n.args[1]) .. ")"
    elseif op == "pow" then return "(" .. E(n.args[1]) .. " ^ " .. lua_num(tonumber(n.x)) .. ")"
    elseif LUA_CMP[op] then return "(" .. E(n.args[1]) .. " " .. LUA_CMP[op] .. " " .. E(n.args[2]) .. " and 1 or 0)"
    elseif op == "land" then return "((" .. E(n.args[1]) .. " ~= 0 and " .. E(n.args[2]) .. " ~= 0) and 1 or 0)"
    elseif op == "lor" then return "((" .. E(n.args[1]) .. " ~= 0 or " .. E(n.args[2]) .. " ~= 0) and 1 or 0)"
    elseif op == "lnot" then return "(" .. E(n.args[1]) .. " == 0 and 1 or 0)"
    elseif op == "where" then return "(" .. E(n.args[1]) .. " ~= 0 and " .. E(n.args[2]) .. " or " .. E(n.args[3]) .. ")"
    elseif op == "exp" or op == "log" or op == "tanh" or op == "sqrt" or op == "abs" then
      return "m_" .. op .. "(" .. E(n.args[1]) .. ")"
    elseif op == "min" or op == "max" then return "m_" .. op .. "(" .. E(n.args[1]) .. ", " .. E(n.args[2]) .. ")"
    elseif op == "load" then
      local parts = {}
      for i, a in ipairs(n.args) do parts[i] = E(a) end
      return "ld" .. n.x .. "(" .. table.concat(parts, ", ") .. ")"
    end
    error("variants: internal: no Lua for op " .. tostring(op))
  end
  return E(root)
end

-- the chunk header: math locals and one bounds-checked reader per capture
local function lua_header(caps, what)
  local L = { "local m_exp, m_log, m_tanh, m_sqrt, m_abs, m_min, m_max = math.exp, math.log, math.tanh, " ..
    "math.sqrt, math.abs, math.min, math.max",
    "local CAPS, POS, error, format = ...",
    "local function oob(k, d, i, n, shape) error(format(" ..
    "\"%s: captured tensor %d (shape %s) read at index %s on dim %d, outside 1..%d (at b=%d, h=%d, q_idx=%d, kv_idx=%d)\", " ..
    string.format("%q", what) .. ", k, shape, tostring(i), d, n, POS[0] + 1, POS[1] + 1, POS[2] + 1, POS[3] + 1), 0) end" }
  for _, rec in ipairs(caps) do
    local k = rec.k
    local args, checks, off = {}, {}, {}
    for d = 1, #rec.shape do
      args[d] = "i" .. d
      checks[d] = string.format("if i%d < 1 or i%d > %d or i%d %% 1 ~= 0 then oob(%d, %d, i%d, %d, %q) end",
        d, d, rec.shape[d], d, k + 1, d, d, rec.shape[d], rec.shape_str)
      off[d] = string.format("(i%d - 1) * %d", d, rec.strides[d])
    end
    L[#L + 1] = string.format("local c%d = CAPS[%d]", k, k + 1)
    L[#L + 1] = string.format("local function ld%d(%s) %s return c%d[%s] end", k, table.concat(args, ", "),
      table.concat(checks, " "), k, table.concat(off, " + "))
  end
  return table.concat(L, "\n") .. "\n"
end

local chunk_cache = setmetatable({}, { __mode = "v" })
local function load_chunk(src, name)
  local f = chunk_cache[src]
  if f then return f end
  local err
  f, err = loadstring(src, "=" .. name)
  if not f then error("variants: internal: generated Lua does not compile: " .. tostring(err) .. "\n" .. src, 0) end
  chunk_cache[src] = f
  return f
end
M._load_chunk = load_chunk

---------------------------------------------------------------------------------------------------
-- building a variant
---------------------------------------------------------------------------------------------------
local Variant = {}
Variant.__index = Variant

local function sym_args()
  local one = const(1)
  return {
    score = var("score", "f"), grad = var("grad", "f"),
    b = S.add(var("b", "i"), one), h = S.add(var("h", "i"), one),
    q = S.add(var("q", "i"), one), kv = S.add(var("kv", "i"), one),
  }
end

local function uses_var(root, name)
  local found = false
  local seen = {}
  local function walk(n)
    if found or seen[n] then return end
    seen[n] = true
    if n.op == "var" and n.x == name then found = true return end
    for _, a in ipairs(n.args) do walk(a) end
  end
  walk(root)
  return found
end
M._uses_var = uses_var

-- M.build(al, {score_mod=, mask_mod=}) -> variant (traced, derived, generated)
function M.build(al, score_mod, mask_mod, fname)
  fname = fname or "attention"
  if score_mod ~= nil and type(score_mod) ~= "function" then
    error(fname .. ": score_mod: expected a function(score, b, h, q_idx, kv_idx), got " .. type(score_mod), 0)
  end
  if mask_mod ~= nil and type(mask_mod) ~= "function" then
    error(fname .. ": mask_mod: expected a function(b, h, q_idx, kv_idx), got " .. type(mask_mod), 0)
  end
  local c = new_context()
  local a = sym_args()
  local v = setmetatable({ ctx = c, captures = c.caps }, Variant)
  if score_mod then
    local r = trace(al, score_mod, { a.score, a.b, a.h, a.q, a.kv }, "score_mod", c)
    if r.t ~= "f" then r = S.add(r, const(0, "f")) end
    if r.t ~= "f" then r = node("add", "f", { r, const(0, "f") }) end
    v.score_root = r
  end
  if mask_mod then
    local r = trace(al, mask_mod, { a.b, a.h, a.q, a.kv }, "mask_mod", c)
    v.mask_root = r
  end
  v:_derive()
  v:_generate()
  return v
end

function Variant:_derive()
  local r = self.score_root
  if r == nil then return end
  local a = sym_args()
  local d = deriv(r, a.score)
  self.dscore = d
  self.score_grad_root = S.mul(a.grad, d)
  self.cap_grads = {}
  -- every distinct load of a parameter capture in the score tree
  local seen = {}
  local loads = {}
  local function walk(n)
    if seen[n] then return end
    seen[n] = true
    if n.op == "load" and self.captures[n.x + 1].requires_grad then loads[#loads + 1] = n end
    for _, x in ipairs(n.args) do walk(x) end
  end
  walk(r)
  table.sort(loads, function(x, y) return x.id < y.id end)
  for _, ld in ipairs(loads) do
    local p = deriv(r, ld)
    if cval(p) ~= 0 then
      self.cap_grads[#self.cap_grads + 1] = { load = ld, rec = self.captures[ld.x + 1], partial = p,
        term = S.mul(a.grad, p) }
    end
  end
end

local score_bounds   -- (below, beside the interval arithmetic of block masks)

function Variant:_generate()
  local uses = {}
  local caps = self.captures
  local score_var = var("score", "f")
  if self.score_root and not rawequal(self.score_root, score_var) then
    self.cuda_score_mod = gen_cuda(self.score_root, caps, uses)
    -- the folded form: a positive constant factor of the whole expression becomes score_post (the
    -- kernels fold it into the softmax's exponent), constant factors on score fold into scale.
    -- ATTNLAB_VARIANT_FOLD=0 leaves it out (A/B measurements: the kernels then use score_mod as is)
    local r, post = self.score_root, 1
    if r.op == "mul" then
      local c1, c2 = cval(r.args[1]), cval(r.args[2])
      local c = c1 or c2
      if foldable(c) and c > 0 then post, r = c, c1 and r.args[2] or r.args[1] end
    end
    if os.getenv("ATTNLAB_VARIANT_FOLD") ~= "0" then
      self.cuda_score_pre, self.score_post = gen_cuda(r, caps, uses, true), post
    end
    if cval(self.dscore) ~= 1 then self.cuda_score_grad = gen_cuda(self.score_grad_root, caps, uses) end
    self.score_lo, self.score_hi = score_bounds(self.score_root)
  end
  if self.mask_root then
    local t = truth(self.mask_root)
    if t ~= true then self.cuda_mask_mod = gen_cuda(self.mask_root, caps, uses) end
  end
  if self.cap_grads and #self.cap_grads > 0 then
    local st = {}
    for _, g in ipairs(self.cap_grads) do
      -- the gradient accumulator is f32 contiguous in the capture's shape
      local off = offset_node(g.load.args, g.rec.strides)
      st[#st + 1] = "atomicAdd(AL_CAP_GRAD(" .. g.rec.k .. ") + " .. gen_cuda(off, caps, uses) .. ", " ..
        gen_cuda(g.term, caps, uses) .. ");"
    end
    self.cuda_capture_grad = "{ " .. table.concat(st, " ") .. " }"
  end
  self.cuda_prelude = cuda_prelude(uses)
  self.has_cap_grad = self.cuda_capture_grad ~= nil
end

-- which symbolic indices the mask reads (for block mask broadcasting)
function Variant:mask_uses(name) return self.mask_root ~= nil and uses_var(self.mask_root, name) end

-- The CUDA snippets, for inspection and tests.
function Variant:source()
  return { score_mod = self.cuda_score_mod, score_grad = self.cuda_score_grad, mask_mod = self.cuda_mask_mod,
    capture_grad = self.cuda_capture_grad, prelude = self.cuda_prelude, score_pre = self.cuda_score_pre,
    score_post = self.cuda_score_pre and self.score_post or nil, score_lo = self.score_lo, score_hi = self.score_hi }
end

function Variant:__tostring()
  local s = self:source()
  local parts = { "attention variant" }
  for _, k in ipairs({ "score_mod", "score_pre", "score_post", "score_grad", "mask_mod", "capture_grad", "prelude" }) do
    if s[k] then
      parts[#parts + 1] = string.format("  %-12s %s", k, ((tostring(s[k]):gsub("%s+$", "")):gsub("\n", "\n               ")))
    end
  end
  if s.score_lo then   -- (score_bounds: where hi - lo <= 64 the bf16 Hopper forward's fixed softmax max)
    parts[#parts + 1] = string.format("  bounds       %.9g <= logit <= %.9g%s", s.score_lo, s.score_hi,
      s.score_hi - s.score_lo <= 64 and " (the Hopper forward's fixed max)" or "")
  end
  for _, rec in ipairs(self.captures) do
    parts[#parts + 1] = string.format("  capture %d    %s %s%s", rec.k + 1, rec.tensor:dtype(), rec.shape_str,
      rec.requires_grad and " (param: gradient returned)" or "")
  end
  return table.concat(parts, "\n")
end

-- f64 contiguous CPU copies of the captures (the oracle reads them through double pointers)
function Variant:cpu_captures(al)
  local keep, ptrs = {}, {}
  for i, rec in ipairs(self.captures) do
    local t = rec.tensor:to({ dtype = "f64", device = "cpu" }):contiguous()
    keep[i] = t
    ptrs[i] = ffi.cast("double *", t:data_ptr())
  end
  return keep, ptrs
end

---------------------------------------------------------------------------------------------------
-- the CPU oracle kernels (generated Lua)
---------------------------------------------------------------------------------------------------
local NAMES = { score = "score", grad = "grad", b = "b", h = "h", q = "i", kv = "j" }

-- forward: S (raw q.k in, new logits out, -inf where masked), K (u8 keep)
function Variant:_fwd_kernel()
  if self.fwd_fn then return self.fwd_fn end
  local mexpr = self.mask_root and gen_lua(self.mask_root, NAMES) or "1"
  local sexpr = self.score_root and gen_lua(self.score_root, NAMES) or "score"
  local src = lua_header(self.captures, self.score_root and "score_mod" or "mask_mod") .. [[
return function(Sp, Kp, B, H, SQ, SKV, scale, qlen, kvlen, diag, wl, wr, BMp, bsb, bsh, bsi, bsj, BMM, BMN)
  local NINF = -math.huge
  for b = 0, B - 1 do
    local ql, kl, dg = qlen[b], kvlen[b], diag[b]
    for h = 0, H - 1 do
      POS[0], POS[1] = b, h
      for i = 0, SQ - 1 do
        local row = ((b * H + h) * SQ + i) * SKV
        POS[2] = i
        for j = 0, SKV - 1 do
          local e = row + j
          local keep = i < ql and j < kl
          if keep and wl >= 0 and j < i + dg - wl then keep = false end
          if keep and wr >= 0 and j > i + dg + wr then keep = false end
          if keep then
            local tile = 1
            if BMp ~= nil then
              tile = BMp[b * bsb + h * bsh + math.floor(i / BMM) * bsi + math.floor(j / BMN) * bsj]
            end
            if tile == 0 then keep = false
            elseif tile == 1 then POS[3] = j keep = (]] .. mexpr .. [[) ~= 0 end
          end
          if keep then
            POS[3] = j
            local score = Sp[e] * scale
            Sp[e] = ]] .. sexpr .. [[

            Kp[e] = 1
          else
            Sp[e] = NINF
            Kp[e] = 0
          end
        end
      end
    end
  end
end
]]
  self.fwd_src = src
  self.fwd_fn = load_chunk(src, "variant_forward")(self.cpu_caps_ptrs, self.pos, error, string.format)
  return self.fwd_fn
end

-- backward: DS holds dL/d(new logit) in, dL/d(score) out; capture gradients accumulate into G<k>
function Variant:_bwd_kernel()
  if self.bwd_fn then return self.bwd_fn end
  local dexpr = self.score_root and gen_lua(self.score_grad_root, NAMES) or "grad"
  local acc = {}
  for _, g in ipairs(self.cap_grads or {}) do
    local off = gen_lua(offset_node(g.load.args, g.rec.strides), NAMES)
    acc[#acc + 1] = string.format("do local o = %s; local G = GR[%d]; G[o] = G[o] + %s end", off, g.rec.k + 1,
      gen_lua(g.term, NAMES))
  end
  local src = lua_header(self.captures, "score_mod") .. [[
return function(SR, DS, Kp, B, H, SQ, SKV, scale, GR)
  for b = 0, B - 1 do
    for h = 0, H - 1 do
      POS[0], POS[1] = b, h
      for i = 0, SQ - 1 do
        local row = ((b * H + h) * SQ + i) * SKV
        POS[2] = i
        for j = 0, SKV - 1 do
          local e = row + j
          if Kp[e] ~= 0 then
            POS[3] = j
            local score, grad = SR[e] * scale, DS[e]
            ]] .. table.concat(acc, "\n            ") .. [[

            DS[e] = ]] .. dexpr .. [[

          else
            DS[e] = 0
          end
        end
      end
    end
  end
end
]]
  self.bwd_src = src
  self.bwd_fn = load_chunk(src, "variant_backward")(self.cpu_caps_ptrs, self.pos, error, string.format)
  return self.bwd_fn
end

function Variant:_bind_cpu(al)
  if self.cpu_caps_ptrs then return end
  self.cpu_caps_keep, self.cpu_caps_ptrs = self:cpu_captures(al)
  self.pos = ffi.new("int64_t[4]")
end

---------------------------------------------------------------------------------------------------
-- block masks
---------------------------------------------------------------------------------------------------
-- interval of a node over an index box: returns lo, hi (numbers; -inf/inf = unknown)
local function interval(root, box, caps_range)
  local memo = {}
  local function I(n)
    local m = memo[n]
    if m then return m[1], m[2] end
    local lo, hi = -huge, huge
    local op = n.op
    local a, b = n.args[1], n.args[2]
    if op == "const" then lo, hi = rawget(n, "v"), rawget(n, "v")
    elseif op == "var" then local r = box[n.x]; if r then lo, hi = r[1], r[2] end
    elseif op == "add" then local l1, h1 = I(a); local l2, h2 = I(b); lo, hi = l1 + l2, h1 + h2
    elseif op == "sub" then local l1, h1 = I(a); local l2, h2 = I(b); lo, hi = l1 - h2, h1 - l2
    elseif op == "neg" then local l1, h1 = I(a); lo, hi = -h1, -l1
    elseif op == "mul" then
      local l1, h1 = I(a); local l2, h2 = I(b)
      local p = { l1 * l2, l1 * h2, h1 * l2, h1 * h2 }
      lo, hi = huge, -huge
      for _, x in ipairs(p) do
        if x ~= x then lo, hi = -huge, huge break end
        if x < lo then lo = x end
        if x > hi then hi = x end
      end
    elseif op == "lt" or op == "le" or op == "gt" or op == "ge" or op == "eq" or op == "ne" then
      local l1, h1 = I(a); local l2, h2 = I(b)
      local t, f
      if op == "lt" then t, f = h1 < l2, l1 >= h2
      elseif op == "le" then t, f = h1 <= l2, l1 > h2
      elseif op == "gt" then t, f = l1 > h2, h1 <= l2
      elseif op == "ge" then t, f = l1 >= h2, h1 < l2
      elseif op == "eq" then t, f = (l1 == h1 and l2 == h2 and l1 == l2), (h1 < l2 or h2 < l1)
      else t, f = (h1 < l2 or h2 < l1), (l1 == h1 and l2 == h2 and l1 == l2) end
      if t then lo, hi = 1, 1 elseif f then lo, hi = 0, 0 else lo, hi = 0, 1 end
    elseif op == "land" or op == "lor" then
      local l1, h1 = I(a); local l2, h2 = I(b)
      -- truth: 1 = surely true (0 not in range), 0 = surely false, nil = unknown
      local function tv(l, h) if l > 0 or h < 0 then return 1 end if l == 0 and h == 0 then return 0 end return nil end
      local x, y = tv(l1, h1), tv(l2, h2)
      local r
      if op == "land" then
        if x == 0 or y == 0 then r = 0 elseif x == 1 and y == 1 then r = 1 end
      else
        if x == 1 or y == 1 then r = 1 elseif x == 0 and y == 0 then r = 0 end
      end
      if r then lo, hi = r, r else lo, hi = 0, 1 end
    elseif op == "lnot" then
      local l1, h1 = I(a)
      if l1 > 0 or h1 < 0 then lo, hi = 0, 0 elseif l1 == 0 and h1 == 0 then lo, hi = 1, 1 else lo, hi = 0, 1 end
    elseif op == "where" then
      local lc, hc = I(a)
      local l1, h1 = I(b); local l2, h2 = I(n.args[3])
      if lc > 0 or hc < 0 then lo, hi = l1, h1
      elseif lc == 0 and hc == 0 then lo, hi = l2, h2
      else lo, hi = math.min(l1, l2), math.max(h1, h2) end
    elseif op == "abs" then
      local l1, h1 = I(a)
      if l1 >= 0 then lo, hi = l1, h1 elseif h1 <= 0 then lo, hi = -h1, -l1 else lo, hi = 0, math.max(-l1, h1) end
    elseif op == "min" then local l1, h1 = I(a); local l2, h2 = I(b); lo, hi = math.min(l1, l2), math.min(h1, h2)
    elseif op == "max" then local l1, h1 = I(a); local l2, h2 = I(b); lo, hi = math.max(l1, l2), math.max(h1, h2)
    elseif op == "exp" then local l1, h1 = I(a); lo, hi = math.exp(l1), math.exp(h1)
    elseif op == "tanh" then local l1, h1 = I(a); lo, hi = math.tanh(l1), math.tanh(h1)
    elseif op == "load" and caps_range[n.x + 1] then   -- (a capture with no range given: unbounded)
      local r = caps_range[n.x + 1]
      lo, hi = r.lo, r.hi
      -- a small box of the capture: its exact value range there
      local box_lo, box_hi, cnt = {}, {}, 1
      for d = 1, #n.args do
        local l1, h1 = I(n.args[d])
        l1, h1 = math.max(l1, 1), math.min(h1, r.shape[d])
        if l1 > h1 or h1 - l1 > 1e6 then cnt = huge break end
        box_lo[d], box_hi[d] = l1, h1
        cnt = cnt * (h1 - l1 + 1)
      end
      if cnt <= 65536 then
        local key = n.x .. ":" .. table.concat(box_lo, ",") .. ":" .. table.concat(box_hi, ",")
        local hit = r.cache[key]
        if not hit then
          local p, st = r.ptr, r.strides
          local l2, h2 = huge, -huge
          local nd = #n.args
          local idx = {}
          local function rec(d, off)
            if d > nd then
              local x = p[off]
              if x ~= x then l2, h2 = -huge, huge elseif l2 == l2 then
                if x < l2 then l2 = x end
                if x > h2 then h2 = x end
              end
              return
            end
            for i = box_lo[d], box_hi[d] do idx[d] = i rec(d + 1, off + (i - 1) * st[d]) end
          end
          rec(1, 0)
          hit = { l2, h2 }
          r.cache[key] = hit
        end
        lo, hi = hit[1], hit[2]
      end
    end
    if lo ~= lo or hi ~= hi then lo, hi = -huge, huge end
    memo[n] = { lo, hi }
    return lo, hi
  end
  return I(root)
end
M._interval = interval

-- score_bounds(root): lo, hi with lo <= the new logit <= hi for every input, or nil when the interval arithmetic
-- cannot bound it. The C side gets them as al_attn_variant.score_lo / score_hi: the Hopper forward then uses hi as a
-- fixed softmax max where hi - lo <= 64 (soft-capping at c: [-c, c]). No capture ranges are given, so a capture
-- read is unbounded: a capture's values are data, which may change after the variant is built.
score_bounds = function(root)
  local lo, hi = interval(root, {}, {})
  if lo > -huge and hi < huge then return lo, hi end
  return nil
end

local BlockMask = {}
BlockMask.__index = BlockMask
M.BlockMask = BlockMask

function BlockMask:sparsity() return self.counts[0] / math.max(self.ntiles, 1) end
function BlockMask:__tostring()
  local n = math.max(self.ntiles, 1)
  local s = string.format("BlockMask(B=%d%s, H=%d%s, Sq=%d, Skv=%d, block=%dx%d): %d x %d tiles, " ..
    "%.1f%% empty (skipped), %.1f%% partial, %.1f%% full",
    self.B, self.bb == 1 and self.B ~= 1 and " broadcast" or "", self.H, self.hb == 1 and self.H ~= 1 and " broadcast" or "",
    self.Sq, self.Skv, self.block_m, self.block_n, self.nm, self.nn,
    100 * self.counts[0] / n, 100 * self.counts[1] / n, 100 * self.counts[2] / n)
  if self.nm <= 16 and self.nn <= 32 then
    local ch = { [0] = ".", "+", "#" }
    local p = ffi.cast("uint8_t *", self.mask:data_ptr())
    local lines = { s, "  (b=1, h=1; # full, + partial, . empty)" }
    for i = 0, self.nm - 1 do
      local row = {}
      for j = 0, self.nn - 1 do row[#row + 1] = ch[p[i * self.nn + j]] end
      lines[#lines + 1] = "  " .. table.concat(row)
    end
    return table.concat(lines, "\n")
  end
  return s
end
-- the mask tensor on a device (cached per device)
function BlockMask:on(device)
  if device == "cpu" then return self.mask end
  self._dev = self._dev or {}
  local t = self._dev[device]
  if not t then t = self.mask:to(device) self._dev[device] = t end
  return t
end

local function check_pos_int(fname, name, v)
  if type(v) ~= "number" or v % 1 ~= 0 or v < 1 then
    error(string.format("%s: %s: expected a positive integer, got %s", fname, name, tostring(v)), 3)
  end
end

function M.block_mask(al, mask_mod, B, H, Sq, Skv, opts)
  local fname = "attention.block_mask"
  if type(mask_mod) ~= "function" then error(fname .. ": mask_mod: expected a function(b, h, q_idx, kv_idx), got " .. type(mask_mod), 2) end
  check_pos_int(fname, "B", B)
  check_pos_int(fname, "H", H)
  check_pos_int(fname, "Sq", Sq)
  check_pos_int(fname, "Skv", Skv)
  opts = opts or {}
  if type(opts) ~= "table" then error(fname .. ": opts: expected a table {block=, block_m=, block_n=}, got " .. type(opts), 2) end
  local bm = opts.block_m or opts.block or 128
  local bn = opts.block_n or opts.block or 128
  check_pos_int(fname, "block_m", bm)
  check_pos_int(fname, "block_n", bn)
  local ok, v = pcall(M.build, al, nil, mask_mod, fname)
  if not ok then error(v, 2) end
  local root = v.mask_root
  local bb = uses_var(root, "b") and B or 1
  local hb = uses_var(root, "h") and H or 1
  local nm, nn = math.ceil(Sq / bm), math.ceil(Skv / bn)
  local mask = al.zeros({ bb, hb, nm, nn }, { dtype = "u8" })
  local mp = ffi.cast("uint8_t *", mask:data_ptr())
  -- capture value ranges (for the intervals)
  local ranges = {}
  v:_bind_cpu(al)
  for i, rec in ipairs(v.captures) do
    local p = v.cpu_caps_ptrs[i]
    local lo, hi = huge, -huge
    for e = 0, rec.numel - 1 do
      local x = p[e]
      if x ~= x then lo, hi = -huge, huge break end
      if x < lo then lo = x end
      if x > hi then hi = x end
    end
    ranges[i] = { lo = lo, hi = hi, ptr = p, strides = rec.strides, shape = rec.shape, cache = {} }
  end
  -- brute force of one tile (early exit once partial)
  local mexpr = gen_lua(root, NAMES)
  local src = lua_header(v.captures, "mask_mod") .. [[
return function(b, h, i0, i1, j0, j1)
  POS[0], POS[1] = b, h
  local seen_keep, seen_drop = false, false
  for i = i0, i1 do
    POS[2] = i
    for j = j0, j1 do
      POS[3] = j
      if (]] .. mexpr .. [[) ~= 0 then seen_keep = true else seen_drop = true end
      if seen_keep and seen_drop then return 1 end
    end
  end
  return seen_keep and 2 or 0
end
]]
  local tile_fn = load_chunk(src, "block_mask")(v.cpu_caps_ptrs, v.pos, error, string.format)
  local counts = { [0] = 0, 0, 0 }
  local row_work = {}                        -- non-empty tiles per query block, over b and h
  for ti = 0, nm - 1 do row_work[ti] = 0 end
  local box = { b = { 0, 0 }, h = { 0, 0 }, q = { 0, 0 }, kv = { 0, 0 } }
  local brute = 0
  for b = 0, bb - 1 do
    box.b[1], box.b[2] = b, b
    for h = 0, hb - 1 do
      box.h[1], box.h[2] = h, h
      for ti = 0, nm - 1 do
        local i0, i1 = ti * bm, math.min(Sq, (ti + 1) * bm) - 1
        box.q[1], box.q[2] = i0, i1
        for tj = 0, nn - 1 do
          local j0, j1 = tj * bn, math.min(Skv, (tj + 1) * bn) - 1
          box.kv[1], box.kv[2] = j0, j1
          local lo, hi = interval(root, box, ranges)
          local cls
          if lo > 0 or hi < 0 then cls = 2
          elseif lo == 0 and hi == 0 then cls = 0
          else
            cls = tile_fn(b, h, i0, i1, j0, j1)
            brute = brute + 1
          end
          mp[((b * hb + h) * nm + ti) * nn + tj] = cls
          counts[cls] = counts[cls] + 1
          if cls ~= 0 then row_work[ti] = row_work[ti] + 1 end
        end
      end
    end
  end
  -- heavy_last: later query blocks hold more non-empty tiles (work correlates positively with the block index,
  -- as for causal and prefix-LM masks); the flash forward then launches the query blocks last first
  local tilt = 0
  for ti = 0, nm - 1 do tilt = tilt + (ti - (nm - 1) / 2) * row_work[ti] end
  return setmetatable({ mask = mask, block_m = bm, block_n = bn, B = B, H = H, Sq = Sq, Skv = Skv, bb = bb, hb = hb,
    nm = nm, nn = nn, counts = counts, ntiles = bb * hb * nm * nn, brute_tiles = brute, mask_mod = mask_mod,
    heavy_last = tilt > 0 }, BlockMask)
end

function M.is_block_mask(x) return type(x) == "table" and getmetatable(x) == BlockMask end

---------------------------------------------------------------------------------------------------
-- the CPU oracle
---------------------------------------------------------------------------------------------------
local function f64(t) return t:to({ dtype = "f64", device = "cpu" }) end

-- per-sequence geometry from the (C-validated) call
local function geometry(al, p, refs, fmt)
  local q, k = refs.q, refs.k
  local B, SQ, SKV
  local qstart, kvstart, qlen, kvlen = {}, {}, {}, {}
  if fmt == "thd" then
    local cq, ck = refs.cu_seqlens_q:totable(), refs.cu_seqlens_kv:totable()
    local cqp = refs.cu_seqlens_q_padded and refs.cu_seqlens_q_padded:totable() or cq
    local ckp = refs.cu_seqlens_kv_padded and refs.cu_seqlens_kv_padded:totable() or ck
    B = #cq - 1
    SQ, SKV = 0, 0
    for b = 1, B do
      qstart[b], kvstart[b] = cqp[b], ckp[b]
      qlen[b], kvlen[b] = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
      SQ, SKV = math.max(SQ, qlen[b]), math.max(SKV, kvlen[b])
    end
    if tonumber(p.sq) > 0 then SQ = tonumber(p.sq) end
    if tonumber(p.skv) > 0 then SKV = tonumber(p.skv) end
  else
    local bd = fmt == "sbhd" and 2 or 1
    B, SQ, SKV = q:size(bd), q:size(3 - bd), k:size(3 - bd)
    local cq = refs.cu_seqlens_q and refs.cu_seqlens_q:totable()
    local ck = refs.cu_seqlens_kv and refs.cu_seqlens_kv:totable()
    for b = 1, B do
      qstart[b], kvstart[b] = 0, 0
      qlen[b] = cq and (cq[b + 1] - cq[b]) or SQ
      kvlen[b] = ck and (ck[b + 1] - ck[b]) or SKV
    end
  end
  return B, SQ, SKV, qstart, kvstart, qlen, kvlen
end

-- format tensor [.., heads, d] -> dense f64 [B, heads, S, d] (zeros past each sequence)
local function to_dense(al, t, fmt, B, S_, starts, lens)
  local nd = t:dim()
  local heads, d = t:size(nd - 1), t:size(nd)
  local dense = al.zeros({ B, heads, S_, d }, { dtype = "f64" })
  local src = f64(t)
  for b = 1, B do
    local len = lens[b]
    if len > 0 then
      local rows -- [len, heads, d]
      if fmt == "thd" then rows = src:narrow(1, starts[b] + 1, len)
      elseif fmt == "bshd" then rows = src:select(1, b):narrow(1, 1, len)
      else rows = src:select(2, b):narrow(1, 1, len) end
      dense:select(1, b):narrow(2, 1, len):copy_(rows:permute(2, 1, 3))
    end
  end
  return dense
end

-- dense [B, heads, S, d] -> rows of dst (format view) (dst zero first)
local function from_dense(dst, dense, fmt, B, starts, lens)
  dst:zero_()
  for b = 1, B do
    local len = lens[b]
    if len > 0 then
      local rows
      if fmt == "thd" then rows = dst:narrow(1, starts[b] + 1, len)
      elseif fmt == "bshd" then rows = dst:select(1, b):narrow(1, 1, len)
      else rows = dst:select(2, b):narrow(1, 1, len) end
      rows:copy_(dense:select(1, b):narrow(2, 1, len):permute(2, 1, 3))
    end
  end
end

local function dptr(t) return ffi.cast("double *", t:data_ptr()) end

-- check the call for what the oracle supports; names the argument
local function oracle_check(fname, p, inp, args, defaults)
  local function get(n) local x = args[n] if x == nil and defaults then x = defaults[n] end return x end
  if p.dropout_p ~= 0 then error(fname .. ": attention_dropout: score_mod / mask_mod variants do not support dropout", 0) end
  if inp.fp8 ~= nil then error(fname .. ": fp8_recipe: score_mod / mask_mod variants do not support FP8", 0) end
  if p.bias_type ~= 0 then
    error(fname .. ": core_attention_bias_type: with score_mod, write the bias in score_mod (e.g. score + bias[h][q_idx][kv_idx], " ..
      "or slopes[h] * ... for ALiBi) instead of core_attention_bias", 0)
  end
  if p.softmax_type ~= 0 then error(fname .. ": softmax_type: score_mod / mask_mod variants support the vanilla softmax only", 0) end
  if p.mask_type == 6 then error(fname .. ": attn_mask_type: 'arbitrary' with score_mod / mask_mod: express the mask as mask_mod", 0) end
  if inp.attention_mask ~= nil then
    error(fname .. ": attention_mask: padding masks with score_mod / mask_mod are not supported: give the lengths as " ..
      "cu_seqlens_q / cu_seqlens_kv", 0)
  end
  if p.return_max_logit ~= 0 then error(fname .. ": return_max_logit: not supported with score_mod / mask_mod", 0) end
  if get("inference_params") ~= nil then error(fname .. ": inference_params: not supported with score_mod / mask_mod", 0) end
end
M.oracle_check = oracle_check

-- Forward on the CPU. Returns out (q's format and dtype, unflattened), lse, and the oracle state.
function M.oracle_forward(al, v, p, inp, refs, fmt, block_mask)
  local C = lffi.C
  T.check(C.al_attn_check(p, inp), "attention.forward")
  local B, SQ, SKV, qstart, kvstart, qlen, kvlen = geometry(al, p, refs, fmt)
  local q, k, vv = refs.q, refs.k, refs.v
  local nd = q:dim()
  local H, HG = q:size(nd - 1), k:size(nd - 1)
  local D, DV = q:size(nd), vv:size(nd)
  local G = H / HG
  local scale = tonumber(p.softmax_scale)
  if scale == 0 then scale = 1 / math.sqrt(D) end
  -- diagonal alignment and window as the plan resolves them
  local mt = tonumber(p.mask_type)
  local causal = mt == 2 or mt == 3 or mt == 4 or mt == 5
  local br
  if causal then br = (mt == 4 or mt == 5)
  else br = tonumber(p.bottom_right_diagonal) ~= 0 end
  local wl, wr = tonumber(p.window_left), tonumber(p.window_right)
  if causal then
    if wl == -1 and wr == -1 then wr = 0 elseif wl >= 0 then wr = 0 end
  elseif wl == -1 and wr == 0 then wr = -1 end
  local qlen_c, kvlen_c, diag_c = ffi.new("int64_t[?]", B), ffi.new("int64_t[?]", B), ffi.new("int64_t[?]", B)
  for b = 1, B do
    qlen_c[b - 1], kvlen_c[b - 1] = qlen[b], kvlen[b]
    diag_c[b - 1] = br and (kvlen[b] - qlen[b]) or 0
  end
  -- dense operands
  local Qd = to_dense(al, q, fmt, B, SQ, qstart, qlen)      -- [B,H,SQ,D]
  local Kd = to_dense(al, k, fmt, B, SKV, kvstart, kvlen)   -- [B,HG,SKV,D]
  local Vd = to_dense(al, vv, fmt, B, SKV, kvstart, kvlen)  -- [B,HG,SKV,DV]
  local Qg = Qd:view(B, HG, G * SQ, D)
  local Sraw = al.matmul(Qg, Kd:transpose(3, 4)):contiguous()          -- [B,HG,G*SQ,SKV] = [B,H,SQ,SKV]
  local Sn = Sraw:clone()
  local Keep = al.zeros({ B, H, SQ, SKV }, { dtype = "u8" })
  v:_bind_cpu(al)
  local bmp, bsb, bsh, bsi, bsj, bmm, bmn = nil, 0, 0, 0, 0, 1, 1
  local bmt
  if block_mask then
    M.check_block_mask("attention.forward", block_mask, B, H, SQ, SKV)
    bmt = block_mask.mask:to("cpu")
    bmp = ffi.cast("uint8_t *", bmt:data_ptr())
    local st = bmt:stride()
    bsb = block_mask.bb == 1 and 0 or st[1]
    bsh = block_mask.hb == 1 and 0 or st[2]
    bsi, bsj = st[3], st[4]
    bmm, bmn = block_mask.block_m, block_mask.block_n
  end
  local fwd = v:_fwd_kernel()
  fwd(dptr(Sn), ffi.cast("uint8_t *", Keep:data_ptr()), B, H, SQ, SKV, scale, qlen_c, kvlen_c, diag_c,
    wl, wr, bmp, bsb, bsh, bsi, bsj, bmm, bmn)
  -- softmax rows (Sn becomes P), lse
  local lse = al.zeros({ B, H, SQ }, { dtype = "f64" })
  local sp, lp = dptr(Sn), dptr(lse)
  local NINF = -huge
  local exp, log = math.exp, math.log
  for r = 0, B * H * SQ - 1 do
    local base = r * SKV
    local m = NINF
    for j = 0, SKV - 1 do local x = sp[base + j] if x > m then m = x end end
    if m == NINF then
      for j = 0, SKV - 1 do sp[base + j] = 0 end
      lp[r] = NINF
    else
      local s = 0
      for j = 0, SKV - 1 do s = s + exp(sp[base + j] - m) end
      local l = m + log(s)
      lp[r] = l
      for j = 0, SKV - 1 do sp[base + j] = exp(sp[base + j] - l) end
    end
  end
  local Od = al.matmul(Sn:view(B, HG, G * SQ, SKV), Vd):contiguous():view(B, H, SQ, DV)
  -- outputs in q's format and dtype
  local oshape = q:size()
  oshape[nd] = DV
  local out = al.zeros(oshape, { dtype = q:dtype() })
  from_dense(out, Od, fmt, B, qstart, qlen)
  local lse_out = tonumber(p.compute_dtype) == 1 and lse or lse:to("f32")
  local st = { B = B, H = H, HG = HG, G = G, SQ = SQ, SKV = SKV, D = D, DV = DV, scale = scale, fmt = fmt,
    qstart = qstart, kvstart = kvstart, qlen = qlen, kvlen = kvlen, Qd = Qd, Kd = Kd, Vd = Vd, Sraw = Sraw, P = Sn,
    Keep = Keep, Od = Od, bmt = bmt, f64 = tonumber(p.compute_dtype) == 1 }
  return out, lse_out, st
end

-- Backward on the CPU: writes dq, dk, dv (format tensors); returns capture gradients {k -> f32 tensor}.
function M.oracle_backward(al, v, st, dout, dq, dk, dv)
  local B, H, HG, G, SQ, SKV, D, DV = st.B, st.H, st.HG, st.G, st.SQ, st.SKV, st.D, st.DV
  local dOd = to_dense(al, dout, st.fmt, B, SQ, st.qstart, st.qlen)           -- [B,H,SQ,DV]
  local dOg = dOd:view(B, HG, G * SQ, DV)
  local Pg = st.P:view(B, HG, G * SQ, SKV)
  local dVd = al.matmul(Pg:transpose(3, 4), dOg)                              -- [B,HG,SKV,DV]
  local dP = al.matmul(dOg, st.Vd:transpose(3, 4)):contiguous()               -- [B,HG,G*SQ,SKV]
  -- dS = P * (dP - rowsum(dO * O)), in place in dP
  local pp, dpp, op, dop = dptr(st.P), dptr(dP), dptr(st.Od), dptr(dOd)
  for r = 0, B * H * SQ - 1 do
    local s = 0
    local ob = r * DV
    for d = 0, DV - 1 do s = s + op[ob + d] * dop[ob + d] end
    local base = r * SKV
    for j = 0, SKV - 1 do dpp[base + j] = pp[base + j] * (dpp[base + j] - s) end
  end
  -- score_grad and capture gradients
  local grads = {}
  local GR = {}
  for i, rec in ipairs(v.captures) do
    if rec.requires_grad then
      local g = al.zeros(rec.shape, { dtype = "f64" })
      grads[i] = g
      GR[i] = dptr(g)
    end
  end
  local bwd = v:_bwd_kernel()
  bwd(dptr(st.Sraw), dpp, ffi.cast("uint8_t *", st.Keep:data_ptr()), B, H, SQ, SKV, st.scale, GR)
  local dSg = dP
  local dQd = al.matmul(dSg, st.Kd):view(B, H, SQ, D) * st.scale
  local dKd = al.matmul(dSg:transpose(3, 4), st.Qd:view(B, HG, G * SQ, D)) * st.scale
  from_dense(dq, dQd, st.fmt, B, st.qstart, st.qlen)
  from_dense(dk, dKd, st.fmt, B, st.kvstart, st.kvlen)
  from_dense(dv, dVd, st.fmt, B, st.kvstart, st.kvlen)
  if not st.f64 then for i, g in pairs(grads) do grads[i] = g:to("f32") end end
  return grads
end

function M.check_block_mask(fname, bm, B, H, SQ, SKV)
  if not M.is_block_mask(bm) then
    error(fname .. ": block_mask: expected the result of al.attention.block_mask, got " .. type(bm), 0)
  end
  if (bm.bb ~= 1 and bm.B ~= B) or (bm.hb ~= 1 and bm.H ~= H) or bm.Sq ~= SQ or bm.Skv ~= SKV then
    error(string.format("%s: block_mask: built for B=%d, H=%d, Sq=%d, Skv=%d, but the call has B=%d, H=%d, Sq=%d, Skv=%d",
      fname, bm.B, bm.H, bm.Sq, bm.Skv, B, H, SQ, SKV), 0)
  end
end

---------------------------------------------------------------------------------------------------
-- al.* functions that also trace
---------------------------------------------------------------------------------------------------
local function any_sym(...)
  for i = 1, select("#", ...) do if is_sym((select(i, ...))) then return true end end
  return false
end
local function any_tensor(...)
  for i = 1, select("#", ...) do if is_tensor((select(i, ...))) then return true end end
  return false
end

function M.install(al)
  local A = al.attention or {}
  al.attention = A
  local prev = {}
  for _, n in ipairs({ "exp", "log", "tanh", "sqrt", "abs", "lt", "le", "gt", "ge", "eq", "ne", "where", "min", "max" }) do
    prev[n] = rawget(al, n)
  end
  local function unary(n, f)
    -- al.exp / al.log / al.tanh / al.sqrt / al.abs (x): a tensor (element-wise, attnlab.math), a number,
    -- or a symbolic value inside score_mod / mask_mod (traced; docs/VARIANTS.md)
    al[n] = function(x, ...)
      if is_sym(x) then return S[n](x) end
      if type(x) == "number" then return f(x) end
      if prev[n] then return prev[n](x, ...) end
      error(n .. ": expected a tensor, a number or a symbolic value, got " .. type(x), 2)
    end
  end
  unary("exp", math.exp)
  unary("log", math.log)
  unary("tanh", math.tanh)
  unary("sqrt", math.sqrt)
  unary("abs", math.abs)
  for n, f in pairs(CMP) do
    -- al.lt / le / gt / ge / eq / ne (a, b): tensors (element-wise, bool result), numbers (a Lua boolean),
    -- or symbolic values inside score_mod / mask_mod (a traced condition for al.where / mask_mod)
    al[n] = function(a, b, ...)
      if is_sym(a) or is_sym(b) then return note_bool(S[n](lift(a, "al." .. n), lift(b, "al." .. n))) end
      if type(a) == "number" and type(b) == "number" then return f(a, b) end
      if prev[n] then return prev[n](a, b, ...) end
      error(n .. ": expected tensors, numbers or symbolic values", 2)
    end
  end
  -- al.where(cond, a, b): tensors (attnlab.math), a Lua condition on numbers, or a traced selection
  -- inside score_mod / mask_mod (a Lua `if` cannot branch on a symbolic value)
  al.where = function(c, a, b)
    if any_sym(c, a, b) then return S.where(lift(c, "al.where"), lift(a, "al.where"), lift(b, "al.where")) end
    if type(c) == "boolean" or type(c) == "number" then
      if not any_tensor(a, b) then
        local t = c
        if type(c) == "number" then t = c ~= 0 end
        if t then return a else return b end
      end
    end
    return prev.where(c, a, b)
  end
  local function minmax(n, f)
    -- al.min / al.max (a, b): numbers, symbolic values (traced), two tensors (element-wise minimum /
    -- maximum) or (tensor[, dim]) (Torch7's reduction, t:min / t:max)
    al[n] = function(a, b, ...)
      if is_sym(a) or is_sym(b) then return S[n](lift(a, "al." .. n), lift(b, "al." .. n)) end
      if type(a) == "number" and type(b) == "number" then return f(a, b) end
      if prev[n] then return prev[n](a, b, ...) end
      if is_tensor(a) and is_tensor(b) then return (n == "min" and al.minimum or al.maximum)(a, b) end
      if is_tensor(a) then return a[n](a, b, ...) end   -- Torch7: al.max(t[, dim]) reduces
      error(n .. ": expected numbers or symbolic values (al.minimum / al.maximum for tensors), got " .. type(a), 2)
    end
  end
  minmax("min", math.min)
  minmax("max", math.max)
  local function logic(n, f)
    -- al.land / al.lor (a, b): logical and / or of Lua values (numbers: nonzero = true) or of traced
    -- conditions inside score_mod / mask_mod
    al[n] = function(a, b)
      if is_sym(a) or is_sym(b) then return note_bool(S[n](lift(a, "al." .. n), lift(b, "al." .. n))) end
      return f(a, b)
    end
  end
  local function tb(x) if type(x) == "number" then return x ~= 0 end return x and true or false end
  logic("land", function(a, b) return tb(a) and tb(b) end)
  logic("lor", function(a, b) return tb(a) or tb(b) end)
  -- al.lnot(a): logical not of a Lua value or of a traced condition
  al.lnot = function(a)
    if is_sym(a) then return note_bool(S.lnot(a)) end
    return not tb(a)
  end
  A.capture = M.capture
  A.param = M.param
  -- al.attention.block_mask(mask_mod, B, H, Sq, Skv, {block = 128 | block_m =, block_n =}): the tile map of
  -- mask_mod (u8 [B|1, H|1, ceil(Sq/bm), ceil(Skv/bn)], 0 empty / 1 partial / 2 full) for the
  -- block_mask argument of al.attention.forward; :sparsity() is the fraction of skipped tiles
  A.block_mask = function(mask_mod, B, H, Sq, Skv, opts) return M.block_mask(al, mask_mod, B, H, Sq, Skv, opts) end
  -- al.attention.variant{score_mod =, mask_mod =}: the traced variant (print it for the generated CUDA C;
  -- v:source() returns the snippets); forward / backward build it themselves
  A.variant = function(args)
    if type(args) ~= "table" then error("attention.variant: expected {score_mod=, mask_mod=}, got " .. type(args), 2) end
    local ok, v = pcall(M.build, al, args.score_mod, args.mask_mod, "attention.variant")
    if not ok then error(v, 2) end
    return v
  end
  -- a symbolic key on a tensor that was not captured (a global, a deeper table): say how to capture it
  local methods = T.methods
  if getmetatable(methods) == nil then
    setmetatable(methods, { __index = function(_, k)
      if is_sym(k) then
        error("a tensor indexed with a symbolic value was not captured (score_mod / mask_mod see tensors " ..
          "held in upvalues, globals, plain tables or helper functions): bind it to a local first, or wrap it " ..
          "with al.attention.capture(t)", 2)
      end
      return nil
    end })
  end
end

return M
