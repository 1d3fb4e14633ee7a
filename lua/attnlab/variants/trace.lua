--[[
attnlab.variants.trace — calls score_mod / mask_mod once with symbolic arguments and records what they
compute (attnlab.variants.sym), with the tensors they read as captures.

Captures: every tensor the function reaches as an upvalue, a global, inside a plain table upvalue or
through a helper function's upvalues is swapped for a proxy while the trace runs; indexing a proxy with
symbolic or constant indices gives a `load` node, and the capture records (k, shape, contiguous
strides, kind "i" / "f", requires_grad) are what the code generators and the GPU copies use.
al.attention.capture(t) wraps a tensor the scan does not reach; al.attention.param(t) asks for its
gradient. Errors explain what to write instead: a Lua `if` / `and` / `or` on a symbolic value (found
as a comparison that does not reach the result), math.* on a symbolic value, comparison operators.
]]
local T = require "attnlab.tensor"
local sym = require "attnlab.variants.sym"

local M = {}
local is_tensor = T.is_tensor
local is_sym, node, const, lift = sym.is_sym, sym.node, sym.const, sym.lift
local HINT, CMP_MSG = sym.HINT, sym.CMP_MSG

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

-- The chunk-name prefix of attnlab's own Lua modules (lua/attnlab/...): their functions are not scanned.
local LIB_SOURCE = "@" .. (debug.getinfo(1, "S").source:match("^@(.*/)variants/trace%.lua$") or "\0")
-- library closures that hold a researcher's functions as upvalues (al.attention.and_masks / or_masks): scanned
local scan_through = setmetatable({}, { __mode = "k" })
local function scan_upvalues_of(f) scan_through[f] = true return f end

-- Replace tensor upvalues of fn (directly, in plain tables, through helper functions, up to 8 functions deep:
-- and_masks of many masks nests closures) by proxies;
-- returns a function that restores everything.
local function swap_upvalues(fn, c, al)
  local undo = {}
  local seen = {}
  local function scan(f, depth)
    if seen[f] then return end
    seen[f] = true
    local info = debug.getinfo(f, "S")
    -- attnlab's own functions (al.land kept in a local, say) hold the library's state, never a capture: scanning
    -- them swapped the tensor ctype inside al.is_tensor for a proxy, which broke the trace
    if info and info.source:sub(1, #LIB_SOURCE) == LIB_SOURCE and not scan_through[f] then return end
    -- globals (the REPL's `slopes = al.tensor(...)` is one): the function reads them through a proxy
    -- environment that hands out captures for tensors, for as long as the trace runs
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
      elseif type(val) == "function" and depth < 8 then
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
-- (the wrappers are made once: a trace only swaps them in and out, allocating nothing; a nested trace leaves
-- them in place, and the outermost puts back whatever math.* held before, a user's own replacement included)
local math_saved, math_wrapped, math_depth = {}, {}, 0
for _, n in ipairs(MATH_NAMES) do
  math_wrapped[n] = function(...)
    for i = 1, select("#", ...) do
      if is_sym((select(i, ...))) then
        error("math." .. n .. " cannot take a symbolic value (" .. HINT .. "): use al." ..
          ((n == "exp" or n == "log" or n == "tanh" or n == "sqrt" or n == "abs" or n == "min" or n == "max")
            and n or "exp / al.log / al.tanh / al.sqrt / al.abs / al.min / al.max / al.where") ..
          " instead", 2)
      end
    end
    return math_saved[n](...)
  end
end
local function restore_math()
  math_depth = math_depth - 1
  if math_depth == 0 then
    for _, n in ipairs(MATH_NAMES) do math[n] = math_saved[n] end
  end
end
local function swap_math()
  if math_depth == 0 then
    for _, n in ipairs(MATH_NAMES) do
      math_saved[n] = math[n]
      math[n] = math_wrapped[n]
    end
  end
  math_depth = math_depth + 1
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
  swap_math()
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


M.trace, M.new_context, M.note_bool, M.scan_upvalues_of = trace, new_context, note_bool, scan_upvalues_of
return M
