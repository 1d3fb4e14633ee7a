--[[
attnlab.variants.sym — the symbolic expressions score_mod / mask_mod are traced into: hash-consed nodes,
the smart constructors that fold and simplify as they build (S.add, S.mul, S.lt, S.where, S.tanh, ...)
and the metamethods that let Lua's operators build them.

A node is {op, id, t ("i" int, "f" float, "b" bool), args (children), x (op data: a constant's value,
a variable's name, a capture's index, pow's exponent)}. Nodes are interned by structure, so equal
subexpressions are one table (rawequal), which the derivatives, the code generators and the `if`
detector of attnlab.variants.trace rely on. Simplification: constants fold, sums are kept as linear
combinations (so (h + 1) - 1 is h again and kv_idx - q_idx + S - 1 becomes kv_idx - q_idx + (S - 1)),
integer comparisons are normalised, x*1, x+0, x*0 and where(c, a, a) vanish.
]]
local T = require "attnlab.tensor"

local M = {}
local is_tensor = T.is_tensor
local huge = math.huge

-- A node: {op, id, t ("i" int, "f" float, "b" bool), args (children), x (op data: a constant's value,
-- a variable's name, a capture's index, pow's exponent)}. Nodes are interned by structure.
local Sym = {}
local FIELDS = { op = true, id = true, t = true, args = true, x = true, key = true }
local intern = setmetatable({}, { __mode = "v" })
local next_id = 0

-- A new interning table: attnlab.variants.variant starts every build with one, so that a build's nodes are all
-- created by that build, in its order. Commutative operands and the terms of a sum are ordered by id (creation
-- order), so with nodes left over from earlier traces (alive in the weak table, or in a cached variant) the same
-- function could print its C in another order, and so compile as another kernel. Ids stay unique for the
-- process: a node made later from an older build's nodes (the oracle's index offsets) gets a key of its own.
-- seed: nodes every build starts with (the symbolic arguments, made once; older than any node of a build, so
-- they sort first in every build alike).
local function fresh_intern(seed)
  intern = setmetatable({}, { __mode = "v" })
  for _, n in ipairs(seed or {}) do intern[n.key] = n end
end

local function is_sym(x) return type(x) == "table" and getmetatable(x) == Sym end

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


-- offset node of a capture read (0-based, from the Lua 1-based indices) for given strides
local function load_offset(idx, strides)
  local off = const(0)
  for d = 1, #idx do
    off = S.add(off, S.mul(S.sub(idx[d], const(1)), const(strides[d])))
  end
  return off
end

M.is_sym, M.node, M.const, M.cval, M.var, M.lift, M.truth = is_sym, node, const, cval, var, lift, truth
M.S, M.CMP, M.CMP_MSG, M.HINT, M.load_offset, M.fresh_intern = S, CMP, CMP_MSG, HINT, load_offset, fresh_intern
return M
