--[[
attnlab.variants.variant — a variant: score_mod and / or mask_mod traced (attnlab.variants.trace),
derived (attnlab.variants.deriv) and printed as the CUDA snippets of the flash kernels' hooks
(attnlab.variants.cuda).

build(al, score_mod, mask_mod[, fname]) -> variant with
  score_root / mask_root        the traced trees (score_root a float tree)
  dscore, score_grad_root       d(new logit)/d(score) and grad * it (the backward's score_grad)
  cap_grads                     {load, rec, partial, term} per distinct read of a parameter capture
  captures                      the capture records (attnlab.variants.trace)
  cuda_score_mod, cuda_score_pre (+ score_post), cuda_score_grad (+ cuda_score_grad_pre, folded as score_pre),
  cuda_mask_mod, cuda_capture_grad,
  cuda_prelude                  the C snippets (nil where not needed), score_lo / score_hi (proven bounds)
v:source() returns the snippets, tostring(v) prints them with the captures; v:_bind_cpu(al) makes the
f64 CPU copies of the captures the generated Lua reads (the oracle and block masks).
Every build traces afresh (in a fresh interning table); what derivation and generation make is cached per
traced form (below), so a variant called again costs its trace and a table lookup.
gen_cache_size() / gen_cache_clear(): the number of cached forms, and emptying the cache (tests).
]]
local lffi = require "attnlab.ffi"
local sym = require "attnlab.variants.sym"
local trace_mod = require "attnlab.variants.trace"
local cuda = require "attnlab.variants.cuda"
local score_bounds = require("attnlab.variants.interval").score_bounds
local deriv = require("attnlab.variants.deriv").deriv

local M = {}
local ffi = lffi.ffi
local S, node, const, var, cval, truth, load_offset = sym.S, sym.node, sym.const, sym.var, sym.cval, sym.truth,
  sym.load_offset
local trace, new_context = trace_mod.trace, trace_mod.new_context
local gen_cuda, cuda_prelude, foldable = cuda.gen_cuda, cuda.cuda_prelude, cuda.foldable

local Variant = {}
Variant.__index = Variant

-- the symbolic arguments: the kernels' 0-based b, h, q, kv plus one (the Lua API is 1-based; offsets fold it back).
-- Made once (S.add's simplification is not free), with every node of their trees kept as the seed of each build's
-- interning table (sym.fresh_intern), where they are then found again.
local ARGS, ARG_SEED
local function sym_args()
  if ARGS then return ARGS end
  local one = const(1)
  ARGS = {
    score = var("score", "f"), grad = var("grad", "f"),
    b = S.add(var("b", "i"), one), h = S.add(var("h", "i"), one),
    q = S.add(var("q", "i"), one), kv = S.add(var("kv", "i"), one),
  }
  ARG_SEED = {}
  local seen = {}
  local function walk(n)
    if seen[n] then return end
    seen[n] = true
    for _, x in ipairs(n.args) do walk(x) end
    ARG_SEED[#ARG_SEED + 1] = n
  end
  for _, k in ipairs({ "score", "grad", "b", "h", "q", "kv" }) do walk(ARGS[k]) end
  return ARGS
end

-- whether the tree reads variable `name` (block masks broadcast over b / h when mask_mod does not read them)
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

-- The derived and generated part of a variant, per traced form: every forward call traces its score_mod /
-- mask_mod again (the trace reads the function's current upvalues, globals and captured tensors, so a changed
-- constant or a different capture is seen), but derivation and code generation, about two thirds of a build's
-- host time (soft-capping: 57 -> 15 us a call, bench/host_overhead.lua), run once per distinct form. The key:
-- the traced trees written out node by node (form_key), the captures' kind, shape and requires_grad (the
-- generated code reads contiguous strides from the shapes; a capture gradient exists only for params) and the
-- environment variables read at generation (GEN_ENV). A hit copies the generated fields into a new variant whose
-- captures are this call's records (this call's tensors). At most GEN_MAX forms are kept; past that the cache
-- starts over.
local GEN_MAX = 256
local gen_cache, gen_count = {}, 0
local SHARED = { "score_root", "mask_root", "dscore", "score_grad_root", "cuda_score_mod", "cuda_score_pre",
  "score_post", "score_mufu", "cuda_score_grad", "cuda_score_grad_pre", "score_lo", "score_hi", "cuda_mask_mod",
  "cuda_capture_grad", "cuda_prelude", "has_cap_grad" }
-- the environment variables code generation reads (here and in attnlab.variants.cuda)
local GEN_ENV = { "ATTNLAB_VARIANT_FOLD", "ATTNLAB_VARIANT_FOLD_GRAD", "ATTNLAB_VARIANT_DEFINES", "ATTNLAB_VARIANT_EX2_FMA" }

-- a tree as text: each node once (a DAG), as op, type, datum and the numbers of its children, children first.
-- (Every build interns its nodes afresh, sym.fresh_intern, so node ids cannot serve as a key across builds.)
local function form_key(root, parts, seen)
  if root == nil then parts[#parts + 1] = "-" return end
  local function walk(n)
    local i = seen[n]
    if i then return i end
    local a = {}
    for k, c in ipairs(n.args) do a[k] = walk(c) end
    seen.n = seen.n + 1
    seen[n] = seen.n
    parts[#parts + 1] = n.op .. " " .. n.t .. " " .. tostring(n.x) .. " " .. table.concat(a, ",")
    return seen.n
  end
  walk(root)
  parts[#parts + 1] = ";"
end

local function gen_key(score_root, mask_root, caps)
  local parts, seen = {}, { n = 0 }
  form_key(score_root, parts, seen)
  form_key(mask_root, parts, seen)
  for _, name in ipairs(GEN_ENV) do parts[#parts + 1] = os.getenv(name) or "\0" end
  for _, rec in ipairs(caps) do
    parts[#parts + 1] = rec.kind .. rec.shape_str .. (rec.requires_grad and "g" or "")
  end
  return table.concat(parts, "|")
end

local function from_cache(v, g)
  for _, f in ipairs(SHARED) do v[f] = g[f] end
  if g.cap_grads then   -- the same loads and terms, with this call's capture records
    local cg = {}
    for i, e in ipairs(g.cap_grads) do
      cg[i] = { load = e.load, rec = v.captures[e.k + 1], partial = e.partial, term = e.term }
    end
    v.cap_grads = cg
  end
  return v
end

local function to_cache(key, v)
  if gen_count >= GEN_MAX then gen_cache, gen_count = {}, 0 end
  local g = {}
  for _, f in ipairs(SHARED) do g[f] = v[f] end
  if v.cap_grads then   -- (the capture's index, not its record: the cache must not keep a caller's tensor alive)
    g.cap_grads = {}
    for i, e in ipairs(v.cap_grads) do
      g.cap_grads[i] = { load = e.load, k = e.rec.k, partial = e.partial, term = e.term }
    end
  end
  gen_cache[key] = g
  gen_count = gen_count + 1
end

-- build(al, score_mod, mask_mod[, fname]) -> variant (traced, derived, generated)
local function build_body(al, score_mod, mask_mod, fname)
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
    -- a condition as the new logit is a mask given as score_mod (it became a 0 / 1 logit, silently)
    if r.t == "b" then
      error(fname .. ": score_mod returned a condition (a comparison or logic value), not a score: a function that " ..
        "says keep / drop is a mask_mod (pass it as mask_mod=), or select with al.where(cond, score, -math.huge)", 0)
    end
    if r.t ~= "f" then r = S.add(r, const(0, "f")) end
    if r.t ~= "f" then r = node("add", "f", { r, const(0, "f") }) end
    v.score_root = r
  end
  if mask_mod then
    local r = trace(al, mask_mod, { a.b, a.h, a.q, a.kv }, "mask_mod", c)
    v.mask_root = r
  end
  local key = gen_key(v.score_root, v.mask_root, c.caps)
  local g = gen_cache[key]
  if g then return from_cache(v, g) end
  v:_derive()
  v:_generate()
  to_cache(key, v)
  return v
end

-- Each outermost build interns its nodes afresh (a build nested in a trace, a score_mod calling
-- al.attention.variant say, shares its caller's table: a fresh one there would split the caller's nodes in two).
local build_depth = 0
local function build(al, score_mod, mask_mod, fname)
  if build_depth == 0 then
    sym_args()
    sym.fresh_intern(ARG_SEED)
  end
  build_depth = build_depth + 1
  local ok, v = pcall(build_body, al, score_mod, mask_mod, fname)
  build_depth = build_depth - 1
  if not ok then error(v, 0) end
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
    -- a multi-function-unit op (tanh, exp, log, sqrt) in score_mod itself: the Hopper forward may then give the
    -- softmax a third consumer warpgroup (al_attn_variant.score_mufu; score_grad's and mask_mod's math do not count)
    self.score_mufu = uses.mufu == true
    if cval(self.dscore) ~= 1 then
      self.cuda_score_grad = gen_cuda(self.score_grad_root, caps, uses)
      -- and folded as score_pre, so that the backward's logit and gradient share their terms (two multiplies less
      -- per score, flash_common.cuh; soft-capping's backward 1.167 -> 1.149x the plain kernel at 4x16x4096 on an
      -- H100, session 24). ATTNLAB_VARIANT_FOLD_GRAD=0 leaves it out (A/B measurements)
      if self.cuda_score_pre and os.getenv("ATTNLAB_VARIANT_FOLD_GRAD") ~= "0" then
        self.cuda_score_grad_pre = gen_cuda(self.score_grad_root, caps, uses, true)
      end
    end
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
      local off = load_offset(g.load.args, g.rec.strides)
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
    score_post = self.cuda_score_pre and self.score_post or nil, score_grad_pre = self.cuda_score_grad_pre,
    score_lo = self.score_lo, score_hi = self.score_hi,
    score_mufu = self.score_mufu or false }
end

function Variant:__tostring()
  local s = self:source()
  local parts = { "attention variant" }
  for _, k in ipairs({ "score_mod", "score_pre", "score_post", "score_grad", "score_grad_pre", "mask_mod", "capture_grad",
    "prelude" }) do
    if s[k] then   -- (score_grad_pre printed as grad_pre, to keep the column)
      parts[#parts + 1] = string.format("  %-12s %s", k == "score_grad_pre" and "grad_pre" or k,
        ((tostring(s[k]):gsub("%s+$", "")):gsub("\n", "\n               ")))
    end
  end
  if s.score_lo then   -- (score_bounds: where hi - lo <= 64 the bf16 Hopper forward's fixed softmax max)
    parts[#parts + 1] = string.format("  bounds       %.9g <= logit <= %.9g%s", s.score_lo, s.score_hi,
      s.score_hi - s.score_lo <= 64 and " (the Hopper forward's fixed max)" or "")
  end
  if s.score_mufu then parts[#parts + 1] = "  mufu         score_mod uses the MUFU (the Hopper forward may run three consumers)" end
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

-- the captures' CPU copies and the position the generated Lua's error messages report (b, h, q_idx, kv_idx)
function Variant:_bind_cpu(al)
  if self.cpu_caps_ptrs then return end
  self.cpu_caps_keep, self.cpu_caps_ptrs = self:cpu_captures(al)
  self.pos = ffi.new("int64_t[4]")
end

-- (tests: the number of cached forms, and emptying the cache)
local function gen_cache_size() return gen_count end
local function gen_cache_clear() gen_cache, gen_count = {}, 0 end

M.build, M.uses_var, M.gen_cache_size, M.gen_cache_clear = build, uses_var, gen_cache_size, gen_cache_clear
return M
