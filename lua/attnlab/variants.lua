--[[
attnlab.variants — attention variants scripted in Lua (FlexAttention-style score_mod / mask_mod): the
public face of the modules in lua/attnlab/variants/ and the al.* functions that also trace.

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
  logic           al.land al.lor al.lnot, selection al.where(cond, a, b); whole masks combine with
                  al.attention.and_masks / or_masks (and noop_mask), as in FlexAttention
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

The pieces, one job each (lua/attnlab/variants/):
  sym.lua         the expressions: hash-consed nodes simplified as they are built (constants fold, sums
                  are linear combinations, integer comparisons normalised)
  trace.lua       calling score_mod / mask_mod with symbolic arguments; captures and their proxies
  deriv.lua       symbolic derivatives: d(new logit)/d(score) (the backward's score_grad) and each
                  parameter capture's partial (capture_grad: atomicAdd into an f32 accumulator)
  cuda.lua        CUDA C for the flash kernels' hooks and its prelude (compiled with NVRTC by the plugin;
                  captures are passed as contiguous f32 / i32 copies on q's device with their strides as
                  constants: changing a captured tensor's values never recompiles, its shape does)
  luagen.lua      Lua source for the CPU oracle and block masks
  variant.lua     build(): trace, derive, generate; the variant object (print it for its CUDA C)
  interval.lua    interval arithmetic: block-mask tiles decided from index boxes, the logit's bounds
  block_mask.lua  al.attention.block_mask: empty / partial / full tile maps
  oracle.lua      the CPU oracle (forward and backward, f64)
The CPU oracle is generated Lua, not an interpreter (a tree walk per element is ~50x slower) nor
generated C (it needs a C compiler at run time, which a researcher's machine may lack): LuaJIT compiles
the expression to machine code with nothing outside this process, in double precision, and reads
captures with bounds checks (an out-of-range index raises an error naming the capture, the dim and
the element).
]]
local T = require "attnlab.tensor"
local sym = require "attnlab.variants.sym"
local trace = require "attnlab.variants.trace"
local deriv = require "attnlab.variants.deriv"
local luagen = require "attnlab.variants.luagen"
local variant = require "attnlab.variants.variant"
local interval = require "attnlab.variants.interval"
local block_mask = require "attnlab.variants.block_mask"
local oracle = require "attnlab.variants.oracle"

local M = {}
local is_tensor = T.is_tensor
local is_sym, S, CMP, lift = sym.is_sym, sym.S, sym.CMP, sym.lift
local note_bool = trace.note_bool

M.is_sym, M.S, M.deriv = is_sym, S, deriv.deriv
M.capture, M.param, M.is_param = trace.capture, trace.param, trace.is_param
M.build, M._uses_var, M._load_chunk, M._interval = variant.build, variant.uses_var, luagen.load_chunk, interval.interval
M.gen_cache_size, M.gen_cache_clear = variant.gen_cache_size, variant.gen_cache_clear   -- (tests)
M.BlockMask, M.block_mask, M.is_block_mask, M.check_block_mask = block_mask.BlockMask, block_mask.block_mask,
  block_mask.is_block_mask, block_mask.check_block_mask
M.oracle_check, M.oracle_forward, M.oracle_backward = oracle.oracle_check, oracle.oracle_forward, oracle.oracle_backward

---------------------------------------------------------------------------------------------------
-- al.* functions that also trace
---------------------------------------------------------------------------------------------------
local function any_sym(...)
  for i = 1, select("#", ...) do if is_sym((select(i, ...))) then return true end end
  return false
end
-- and_masks / or_masks: the mask_mods combined pairwise, as a balanced tree of closures whose upvalues are the
-- two halves, so the tracer's upvalue scan reaches every mask's captures (a table of masks would hide them)
local function combine_masks(fname, op, none, ...)
  local masks, n = { ... }, select("#", ...)
  for i = 1, n do
    if type(masks[i]) ~= "function" then
      error(string.format("%s: argument %d: expected a mask_mod function(b, h, q_idx, kv_idx), got %s", fname, i,
        type(masks[i])), 3)
    end
  end
  if n == 0 then return function() return none end end
  local function tree(lo, hi)
    if lo == hi then return masks[lo] end
    local mid = math.floor((lo + hi) / 2)
    local left, right = tree(lo, mid), tree(mid + 1, hi)
    return trace.scan_upvalues_of(function(b, h, q_idx, kv_idx)
      return op(left(b, h, q_idx, kv_idx), right(b, h, q_idx, kv_idx))
    end)
  end
  return tree(1, n)
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
  -- al.attention.and_masks(m1, m2, ...): the mask_mod that keeps an element where every mask_mod given keeps it
  -- (FlexAttention's and_masks; with none, everything is kept)
  A.and_masks = function(...) return combine_masks("attention.and_masks", al.land, true, ...) end
  -- al.attention.or_masks(m1, m2, ...): the mask_mod that keeps an element where any mask_mod given keeps it
  -- (FlexAttention's or_masks; with none, nothing is kept)
  A.or_masks = function(...) return combine_masks("attention.or_masks", al.lor, false, ...) end
  -- al.attention.noop_mask(b, h, q_idx, kv_idx): the mask_mod that keeps everything (FlexAttention's noop_mask)
  A.noop_mask = function(b, h, q_idx, kv_idx) return true end
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
