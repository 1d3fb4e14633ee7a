-- DotProductAttention on the GPU backends against the CPU oracle backend (#gpu).
--
-- A table of CASES x BACKENDS: every case builds its arguments twice from one seed, once on the cpu
-- and once on cuda (al.randn / al.rand give the same numbers on every device), runs forward and
-- backward on the cpu backend and on each GPU backend, and compares the output, the lse, max_logit
-- and every gradient (packed qkv/kv gradients whole, dbias, d softmax_offset) with TransformerEngine's
-- tolerances: f16 1e-3, bf16 1.5e-2 (atol = rtol), f32 2e-5 (outputs) / 1e-4 (gradients); fused f16
-- gradients 2.5e-3 (see GRAD_TOL_FUSED_F16). Every q/k/v gradient must also match the cpu in relative
-- Frobenius norm (NORM_TOL), which catches structural errors (a wrong GQA head group, a missing row)
-- that an elementwise tolerance can hide on small entries.
--
-- "unfused" (the GPU reference) must serve every case; another GPU backend ("fused", ...) is run on
-- the cases its supports() accepts and skipped, with its reason, on the others. To add cases for a
-- backend, append to CASES; to add a backend, append to BACKENDS.
local al = require "attnlab"
local ffi = require "ffi"

local BACKENDS = { "unfused", "fused" }
local TOL = { f32 = { out = 2e-5, grad = 1e-4 }, f16 = { out = 1e-3, grad = 1e-3 }, bf16 = { out = 1.5e-2, grad = 1.5e-2 } }
-- cuDNN's fused backward rounds P (and dS) to f16 before the P^T.dO, dS^T.Q and dS.K products (its
-- matmul inputs are in the I/O type); the cpu oracle keeps them in f32. One rounding is <= 2^-11
-- relative per term, and a gradient entry sums s such terms, so entries of magnitude ~0.25 drift by
-- a few f16 ulps (ulp(0.25) = 2^-12 = 2.44e-4); the first H200 run measured 1.04e-3 .. 1.33e-3.
-- 2.5e-3 is about 10 f16 ulps at 0.25: twice the measured drift, still ~6x tighter than bf16's 1.5e-2.
-- Outputs keep TE's 1e-3 (P is rounded once, not summed over a sequence of rounded products).
local GRAD_TOL_FUSED_F16 = 2.5e-3
local function tolerance(backend, dt)
  if backend == "fused" and dt == "f16" then return { out = TOL.f16.out, grad = GRAD_TOL_FUSED_F16 } end
  return TOL[dt]
end
-- relative Frobenius-norm error allowed for whole gradients (an O(1) error for any structural bug)
local NORM_TOL = { f32 = 1e-3, f16 = 5e-3, bf16 = 1.5e-2 }
-- backends whose dropout mask is the cpu's al_attn_dropout_uniform stream, bit for bit; the others
-- (fused: cuDNN's own Philox) are checked for dropout by attention_fused_spec.lua instead
local SAME_DROPOUT_RNG_AS_CPU = { unfused = true }

-- dims: batch, q and kv sequence lengths (not multiples of 64), heads, kv heads, head dim
local B, S, SK, H, HG, D = 2, 75, 93, 4, 2, 40

---------------------------------------------------------------------------------------------------
-- builders: R = rng(dev, dt) draws tensors on dev; the same seed gives the same values on every device
---------------------------------------------------------------------------------------------------
local function rng(dev, dt)
  local R = {}
  function R.randn(shape, dtype) return al.randn(shape, { dtype = dtype or dt, device = dev }) end
  function R.mask(shape, p) return al.rand(shape, { device = dev }):gt(p or 0.6) end
  function R.i32(list) return al.tensor(list, { dtype = "i32" }):to(dev) end
  function R.bools(list) return al.tensor(list, { dtype = "bool" }):to(dev) end
  R.dev, R.dt = dev, dt
  return R
end

local function shp(fmt, b, s, ...)
  local t = fmt == "bshd" and { b, s } or { s, b }
  for _, x in ipairs({ ... }) do t[#t + 1] = x end
  return t
end

local function sep(R, fmt, o)
  o = o or {}
  local b, sq, skv, h, hg, dqk, dv = o.b or B, o.sq or S, o.skv or SK, o.h or H, o.hg or HG, o.dqk or D, o.dv or o.dqk or D
  return { query_layer = R.randn(shp(fmt, b, sq, h, dqk)), key_layer = R.randn(shp(fmt, b, skv, hg, dqk)),
    value_layer = R.randn(shp(fmt, b, skv, hg, dv)), qkv_format = fmt }
end

local function with(a, extra)
  for k, v in pairs(extra) do a[k] = v end
  return a
end

---------------------------------------------------------------------------------------------------
-- the cases: { name, dtypes, build = function(R) -> args, check = optional extra assertions }
---------------------------------------------------------------------------------------------------
local ALL = { "f32", "f16", "bf16" }
local CASES = {}
local function case(name, dtypes, build, check)
  CASES[#CASES + 1] = { name = name, dtypes = dtypes, build = build, check = check }
end

local function values(t) return t:to("cpu"):to("f64"):flat_values() end

local function rel_norm_err(got, want)
  local num, den = 0, 0
  for i = 1, #want do num = num + (got[i] - want[i]) ^ 2; den = den + want[i] ^ 2 end
  return math.sqrt(num), math.sqrt(den)
end

-- GQA dV check against an identity, independent of the cpu backend: every softmax row sums to 1 (no
-- dropout, no sink, no empty row), so summing dV[b,j,g,:] = sum_{h in g} sum_i P[b,h,i,j] dO[b,i,h,:]
-- over the keys j gives sum_{h in g} sum_i dO[b,i,h,:]. Query head h belongs to kv head
-- floor(h / (H/HG)) (TE's grouping); a wrong grouping, a lost head or lost rows breaks it by O(1).
-- dv: [b, skv, hg, d] (bshd), dout: [b, sq, h*d] (the flattened output's gradient).
local function check_dv_key_sum(label, dv, dout, h, dt)
  local sz = dv:size()
  local b, skv, hg, d = sz[1], sz[2], sz[3], sz[4]
  local sq = dout:size(2)
  local group = h / hg
  local v, o = values(dv), values(dout)
  local got, want = {}, {}
  for bb = 0, b - 1 do
    for g = 0, hg - 1 do
      for e = 0, d - 1 do
        local sg, sw = 0, 0
        for j = 0, skv - 1 do sg = sg + v[((bb * skv + j) * hg + g) * d + e + 1] end
        for hh = g * group, (g + 1) * group - 1 do
          for i = 0, sq - 1 do sw = sw + o[((bb * sq + i) * h + hh) * d + e + 1] end
        end
        got[#got + 1], want[#want + 1] = sg, sw
      end
    end
  end
  local num, den = rel_norm_err(got, want)
  assert(num <= NORM_TOL[dt] * den, string.format(
    "%s: sum over keys of dV per kv head differs from sum over the group's query heads of dO by %.3g (relative norm; limit %g)",
    label, num / den, NORM_TOL[dt]))
end

-- the 8 dense packed declarative layouts
for _, fmt in ipairs({ "bshd", "sbhd" }) do
  for _, dim in ipairs({ -3, -2 }) do
    local tag = (fmt == "bshd" and "bs" or "sb") .. (dim == -3 and "3hd" or "h3d")
    case("layout " .. tag .. " (qkv_layer, causal)", ALL, function(R)
      local inner = dim == -3 and { 3, H, D } or { H, 3, D }
      return { qkv_layer = R.randn(shp(fmt, B, S, unpack(inner))), qkv_interleave_dim = dim, qkv_format = fmt,
        attn_mask_type = "causal" }
    end)
    local ktag = fmt .. "_" .. (fmt == "bshd" and "bs" or "sb") .. (dim == -3 and "2hd" or "h2d")
    case("layout " .. ktag .. " (kv_layer, GQA, cross, no_mask)", ALL, function(R)
      local inner = dim == -3 and { 2, HG, D } or { HG, 2, D }
      return { query_layer = R.randn(shp(fmt, B, S, H, D)), kv_layer = R.randn(shp(fmt, B, SK, unpack(inner))),
        qkv_interleave_dim = dim, qkv_format = fmt, attn_mask_type = "no_mask" }
    end)
  end
end

-- the 4 thd packed layouts
local CU_Q, CU_KV = { 0, 30, 75 }, { 0, 41, 93 }
for _, dim in ipairs({ -3, -2 }) do
  case("layout " .. (dim == -3 and "t3hd" or "th3d") .. " (qkv_layer, padding_causal)", ALL, function(R)
    local inner = dim == -3 and { 3, H, D } or { H, 3, D }
    return { qkv_layer = R.randn({ 75, unpack(inner) }), qkv_interleave_dim = dim, qkv_format = "thd",
      attn_mask_type = "padding_causal", cu_seqlens_q = R.i32(CU_Q), cu_seqlens_kv = R.i32(CU_Q) }
  end)
  case("layout " .. (dim == -3 and "thd_t2hd" or "thd_th2d") .. " (kv_layer, GQA, padding_causal_bottom_right)", ALL,
    function(R)
      local inner = dim == -3 and { 2, HG, D } or { HG, 2, D }
      return { query_layer = R.randn({ 75, H, D }), kv_layer = R.randn({ 93, unpack(inner) }), qkv_interleave_dim = dim,
        qkv_format = "thd", attn_mask_type = "padding_causal_bottom_right", cu_seqlens_q = R.i32(CU_Q),
        cu_seqlens_kv = R.i32(CU_KV) }
    end)
end

-- separate, detected and strided inputs; head dims; GQA/MQA/MLA
-- sq = skv with a top-left causal mask: key j is seen by every query i >= j, so no key's dV is zero
-- by masking (key 0 by all S queries, the last key by the last query only); a zero dV entry can only
-- be an (almost) cancelling sum. check_dv_key_sum is the structural GQA check.
case("separate bshd, GQA, causal", ALL, function(R) return with(sep(R, "bshd", { skv = S }), { attn_mask_type = "causal" }) end,
  function(label, args, grads, cgrads, gdout, dt)
    check_dv_key_sum(label .. " (gpu)", grads.value_layer, gdout, H, dt)
    check_dv_key_sum(label .. " (cpu oracle)", cgrads.value_layer, gdout, H, dt)
  end)
case("separate sbhd, MQA, cross, no_mask", { "f16" }, function(R)
  return with(sep(R, "sbhd", { hg = 1 }), { attn_mask_type = "no_mask" })
end)
case("detected: select views of one packed buffer passed as separate tensors", { "f16", "f32" }, function(R)
  local qkv = R.randn({ B, S, H, 3, D })
  return { query_layer = qkv:select(4, 1), key_layer = qkv:select(4, 2), value_layer = qkv:select(4, 3),
    qkv_format = "bshd", attn_mask_type = "causal" }
end)
case("strided packed buffer: a slice of a larger one (bs3hd, padded head dim)", { "f16", "bf16", "f32" }, function(R)
  local big = R.randn({ B, 2 * S, 3, H, D + 8 })
  return { qkv_layer = big:narrow(2, 3, S):narrow(5, 5, D), qkv_interleave_dim = -3, qkv_format = "bshd",
    attn_mask_type = "causal" }
end)
case("strided packed buffer: sbh3d slice in the sequence dim, kv slice", { "f16" }, function(R)
  local big = R.randn({ S + 9, B, H, 3, D })
  return { qkv_layer = big:narrow(1, 5, S), qkv_interleave_dim = -2, qkv_format = "sbhd", attn_mask_type = "no_mask" }
end)
case("strided kv_layer slice with a separate strided query", { "f16" }, function(R)
  local bq = R.randn({ B, S, H, D + 4 })
  local bkv = R.randn({ B, SK + 3, 2, HG, D })
  return { query_layer = bq:narrow(4, 2, D), kv_layer = bkv:narrow(2, 2, SK), qkv_interleave_dim = -3,
    qkv_format = "bshd", attn_mask_type = "causal_bottom_right" }
end)
case("odd head dim 33 (2-byte aligned views of a packed buffer)", { "f16", "bf16", "f32" }, function(R)
  return { qkv_layer = R.randn({ B, S, 3, H, 33 }), qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal" }
end)
case("head dim 128 and 8 heads", { "bf16" }, function(R)
  return with(sep(R, "bshd", { h = 8, hg = 8, dqk = 128, skv = S }), { attn_mask_type = "causal" })
end)
case("MLA: d_qk 48, d_v 32, GQA", ALL, function(R)
  return with(sep(R, "bshd", { dqk = 48, dv = 32 }), { attn_mask_type = "causal_bottom_right" })
end)
case("MLA in thd: d_qk 24, d_v 40", { "f16" }, function(R)
  return { query_layer = R.randn({ 75, H, 24 }), key_layer = R.randn({ 93, HG, 24 }), value_layer = R.randn({ 93, HG, 40 }),
    qkv_format = "thd", attn_mask_type = "padding", cu_seqlens_q = R.i32(CU_Q), cu_seqlens_kv = R.i32(CU_KV) }
end)
case("decode: sq = 1", { "f16" }, function(R)
  return with(sep(R, "bshd", { sq = 1 }), { attn_mask_type = "causal_bottom_right" })
end)
case("sq > skv bottom-right causal: empty rows are zero", { "f32", "f16" }, function(R)
  return with(sep(R, "bshd", { sq = 77, skv = 40 }), { attn_mask_type = "causal_bottom_right" })
end)

-- every mask type
for _, mask in ipairs({ "no_mask", "causal", "causal_bottom_right" }) do
  case("mask " .. mask .. " (cross, sbhd)", { "f16" }, function(R)
    return with(sep(R, "sbhd"), { attn_mask_type = mask })
  end)
end
for _, mask in ipairs({ "padding", "padding_causal", "padding_causal_bottom_right" }) do
  case("mask " .. mask .. " from cu_seqlens (bshd)", { "f16", "f32" }, function(R)
    return with(sep(R, "bshd"), { attn_mask_type = mask, cu_seqlens_q = R.i32({ 0, 60, 131 }),
      cu_seqlens_kv = R.i32({ 0, 93, 170 }) })
  end)
  case("mask " .. mask .. " from attention_mask tensors (cross)", { "f16" }, function(R)
    local mq, mk = {}, {}
    for b = 1, B do
      local rq, rk = {}, {}
      for i = 1, S do rq[i] = (i > S - 7 * b) and 1 or 0 end
      for j = 1, SK do rk[j] = (j > SK - 11 * b) and 1 or 0 end
      mq[b], mk[b] = { { rq } }, { { rk } }
    end
    return with(sep(R, "bshd"), { attn_mask_type = mask, attention_mask = { R.bools(mq), R.bools(mk) } })
  end)
end
case("mask padding from one self-attention mask (sbhd)", { "f16" }, function(R)
  local m = {}
  for b = 1, B do
    local r = {}
    for i = 1, S do r[i] = (i % 9 == 0 or i > S - 5 * b) and 1 or 0 end
    m[b] = { { r } }
  end
  return with(sep(R, "sbhd", { skv = S }), { attn_mask_type = "padding", attention_mask = R.bools(m) })
end)
for _, shape in ipairs({ { B, H, S, SK }, { B, 1, S, SK }, { S, SK } }) do
  case("mask arbitrary " .. table.concat(shape, "x"), { "f16", "f32" }, function(R)
    return with(sep(R, "bshd"), { attn_mask_type = "arbitrary", attention_mask = R.mask(shape) })
  end)
end
case("mask arbitrary given on the cpu with cuda inputs", { "f16" }, function(R)
  local m = al.rand({ B, 1, S, SK }):gt(0.5)     -- drawn on the cpu for both runs
  return with(sep(R, "bshd"), { attn_mask_type = "arbitrary", attention_mask = m })
end)

-- sliding windows
for _, w in ipairs({ { "no_mask", { 10, 5 } }, { "no_mask", { 3, 4 }, false }, { "causal", { 17, 0 } },
  { "causal_bottom_right", { 7, 0 } }, { "padding", { 5, 9 } }, { "padding_causal_bottom_right", { 12, 0 } } }) do
  case("window " .. w[1] .. " (" .. w[2][1] .. "," .. w[2][2] .. ")" .. (w[3] == false and " top-left" or ""), { "f16" },
    function(R)
      local a = with(sep(R, "bshd"), { attn_mask_type = w[1], window_size = w[2] })
      if w[3] ~= nil then a.bottom_right_diagonal = w[3] end
      if w[1]:find("padding") then a.cu_seqlens_q, a.cu_seqlens_kv = R.i32({ 0, 60, 131 }), R.i32({ 0, 93, 170 }) end
      return a
    end)
end

-- bias of every TE shape, pre and post scale
for _, bt in ipairs({ "pre_scale_bias", "post_scale_bias" }) do
  for _, bs in ipairs({ { B, H, S, SK }, { 1, H, S, SK }, { B, 1, S, SK }, { 1, 1, S, SK }, { 1, 1, 1, SK } }) do
    case(bt .. " " .. table.concat(bs, "x"), { "f16" }, function(R)
      return with(sep(R, "bshd"), { attn_mask_type = "causal_bottom_right", core_attention_bias_type = bt,
        core_attention_bias = R.randn(bs) })
    end)
  end
end
case("post_scale_bias bhss in f32 and bf16", { "f32", "bf16" }, function(R)
  return with(sep(R, "sbhd"), { attn_mask_type = "no_mask", core_attention_bias_type = "post_scale_bias",
    core_attention_bias = R.randn({ B, H, S, SK }) })
end)

-- ALiBi
for _, mask in ipairs({ "causal", "padding_causal", "no_mask" }) do
  case("alibi default slopes, " .. mask, { "f16" }, function(R)
    local a = with(sep(R, "bshd", { h = 6, hg = 3 }), { attn_mask_type = mask, core_attention_bias_type = "alibi" })
    if mask:find("padding") then a.cu_seqlens_q, a.cu_seqlens_kv = R.i32({ 0, 60, 131 }), R.i32({ 0, 93, 170 }) end
    return a
  end)
end
for _, ss in ipairs({ { H }, { B, H } }) do
  case("alibi custom slopes " .. table.concat(ss, "x"), { "f32" }, function(R)
    return with(sep(R, "bshd"), { attn_mask_type = "causal_bottom_right", core_attention_bias_type = "alibi",
      alibi_slopes = al.rand(ss, { dtype = "f32", device = R.dev }) })
  end)
end

-- softmax types and max_logit
case("softmax off-by-one, padding_causal", { "f16", "f32" }, function(R)
  return with(sep(R, "bshd"), { attn_mask_type = "padding_causal", softmax_type = "off-by-one",
    cu_seqlens_q = R.i32({ 0, 60, 131 }), cu_seqlens_kv = R.i32({ 0, 93, 170 }) })
end)
case("softmax learnable sink (d softmax_offset), causal, GQA", { "f16", "f32" }, function(R)
  return with(sep(R, "bshd", { skv = S }), { attn_mask_type = "causal", softmax_type = "learnable",
    softmax_offset = R.randn({ H }, "f32") })
end)
case("learnable sink with fully masked rows", { "f32" }, function(R)
  return with(sep(R, "bshd", { sq = 50, skv = 20 }), { attn_mask_type = "causal_bottom_right", softmax_type = "learnable",
    softmax_offset = R.randn({ H }, "f32") })
end)
case("return_max_logit with post_scale_bias", { "f16", "f32" }, function(R)
  return with(sep(R, "bshd"), { attn_mask_type = "causal", return_max_logit = true,
    core_attention_bias_type = "post_scale_bias", core_attention_bias = R.randn({ 1, H, S, SK }) })
end)

-- dropout: the same (seed, offset) gives the same mask as the cpu (backends in SAME_DROPOUT_RNG_AS_CPU)
case("dropout 0.3, causal, GQA", ALL, function(R)
  return with(sep(R, "bshd"), { attn_mask_type = "causal", attention_dropout = 0.3, dropout_seed = 42, dropout_offset = 7 })
end)
case("dropout 0.5 in thd with learnable sink", { "f16" }, function(R)
  return { query_layer = R.randn({ 75, H, D }), key_layer = R.randn({ 93, HG, D }), value_layer = R.randn({ 93, HG, D }),
    qkv_format = "thd", attn_mask_type = "padding_causal_bottom_right", cu_seqlens_q = R.i32(CU_Q),
    cu_seqlens_kv = R.i32(CU_KV), attention_dropout = 0.5, dropout_seed = 1234567, dropout_offset = 99,
    softmax_type = "learnable", softmax_offset = R.randn({ H }, "f32") }
end)

-- thd details
case("thd with cu_seqlens_padded gaps", { "f16", "f32" }, function(R)
  return { query_layer = R.randn({ 85, H, D }), key_layer = R.randn({ 101, HG, D }), value_layer = R.randn({ 101, HG, D }),
    qkv_format = "thd", attn_mask_type = "padding_causal", cu_seqlens_q = R.i32(CU_Q), cu_seqlens_kv = R.i32(CU_KV),
    cu_seqlens_q_padded = R.i32({ 0, 36, 85 }), cu_seqlens_kv_padded = R.i32({ 0, 46, 101 }) }
end)
case("thd with an empty sequence", { "f32" }, function(R)
  return { query_layer = R.randn({ 75, H, D }), key_layer = R.randn({ 93, HG, D }), value_layer = R.randn({ 93, HG, D }),
    qkv_format = "thd", attn_mask_type = "padding", cu_seqlens_q = R.i32({ 0, 30, 30, 75 }),
    cu_seqlens_kv = R.i32({ 0, 41, 41, 93 }) }
end)

---------------------------------------------------------------------------------------------------
-- running and comparing
---------------------------------------------------------------------------------------------------
local function forward(args)
  local r = { al.attention.forward(args) }
  local ctx = r[#r]
  return r[1], ctx, #r == 3 and r[2] or nil
end

-- |got - want| <= tol + tol*|want| elementwise; -inf only where the cpu has -inf
local function close_values(name, got, want, tol)
  assert.equal(#want, #got, name .. ": element count")
  local worst, at = 0, 0
  for i = 1, #want do
    local g, w = got[i], want[i]
    if w == -math.huge or w == math.huge then
      assert(g == w, string.format("%s[%d]: gpu %g where the cpu has %g", name, i, g, w))
    else
      assert(g == g, string.format("%s[%d]: NaN on the gpu", name, i))
      local e = math.abs(g - w) - tol * math.abs(w)
      if e > worst then worst, at = e, i end
    end
  end
  assert(worst <= tol, string.format("%s: element %d differs by %.3g beyond rtol (atol = rtol = %.3g): gpu %.8g, cpu %.8g",
    name, at, worst, tol, got[at] or 0, want[at] or 0))
end

local function close(name, got, want, tol)
  assert.are.same(want:size(), got:size(), name .. ": shape")
  assert.equal(want:dtype(), got:dtype(), name .. ": dtype")
  assert(got:is_cuda(), name .. ": the gpu result is not on cuda")
  close_values(name, values(got), values(want), tol)
end

local function run_case(c, backend, dt)
  local label = c.name .. " [" .. backend .. ", " .. dt .. "]"
  local seed = 1000 + #c.name
  al.manual_seed(seed)
  local ca = c.build(rng("cpu", dt))
  al.manual_seed(seed)
  local ga = c.build(rng("cuda", dt))
  ga.backend = backend
  ca.backend = "cpu"
  if (ga.attention_dropout or 0) > 0 and not SAME_DROPOUT_RNG_AS_CPU[backend] then
    return false, backend .. " draws its own dropout mask: compared with the cpu only without dropout"
  end
  local text, chosen = al.attention.explain(ga)
  if chosen == nil then
    assert(backend ~= "unfused", label .. ": the unfused backend must serve every case, but:\n" .. text)
    return false, text
  end
  assert.equal(backend, chosen)

  local co, cctx, cml = forward(ca)
  local go, gctx, gml = forward(ga)
  local tol = tolerance(backend, dt)
  close(label .. " out", go, co, tol.out)
  close_values(label .. " lse", values(gctx.lse), values(cctx.lse), 1e-4)
  if cml then close_values(label .. " max_logit", values(gml), values(cml), 1e-4) end

  al.manual_seed(seed + 1)
  local cdout = al.randn(co:size(), { dtype = co:dtype() })
  al.manual_seed(seed + 1)
  local gdout = al.randn(go:size(), { dtype = go:dtype(), device = "cuda" })
  local cg = al.attention.backward(cctx, cdout)
  local gg = al.attention.backward(gctx, gdout)
  local n = 0
  for key, want in pairs(cg) do
    assert(gg[key] ~= nil, label .. ": no gradient " .. key .. " from the gpu backend")
    local t = (key == "core_attention_bias" or key == "softmax_offset") and math.max(tol.grad, 1e-4) or tol.grad
    if key == "softmax_offset" or key == "core_attention_bias" then
      -- reductions over many rows: compare relative to the largest entry
      local w = values(want)
      local m = 0
      for i = 1, #w do m = math.max(m, math.abs(w[i])) end
      t = t * math.max(1, m)
    end
    close(label .. " d" .. key, gg[key], want, t)
    if key ~= "softmax_offset" and key ~= "core_attention_bias" then
      local num, den = rel_norm_err(values(gg[key]), values(want))
      -- (an all-zero cpu gradient is left to the elementwise check)
      assert(den == 0 or num <= NORM_TOL[dt] * den, string.format("%s d%s: relative norm error %.3g beyond %g",
        label, key, den > 0 and num / den or num, NORM_TOL[dt]))
    end
    n = n + 1
  end
  if c.check then c.check(label, ga, gg, cg, gdout, dt) end
  for key in pairs(gg) do assert(cg[key] ~= nil, label .. ": unexpected gradient " .. key) end
  assert(n >= 1, label .. ": no gradients compared")
  return true
end

describe("attention on cuda #gpu", function()
  for _, c in ipairs(CASES) do
    it(c.name, function()
      if not HAS_GPU then pending("no GPU") return end
      local ran = 0
      for _, backend in ipairs(BACKENDS) do
        for _, dt in ipairs(c.dtypes) do
          if run_case(c, backend, dt) then ran = ran + 1 end
        end
      end
      assert(ran >= #c.dtypes, c.name .. ": the unfused backend did not run every dtype")
    end)
  end

  it("dropout on the gpu: same seed same output, another seed another", function()
    if not HAS_GPU then pending("no GPU") return end
    al.manual_seed(5)
    local a = with(sep(rng("cuda", "f32"), "bshd"), { attn_mask_type = "causal", attention_dropout = 0.4,
      dropout_seed = 77, dropout_offset = 0, backend = "unfused" })
    local o1 = al.attention.forward(a):clone()
    assert.equal(0, al.max_abs_diff(o1, al.attention.forward(a)))
    a.dropout_offset = 1000
    assert(al.max_abs_diff(o1, al.attention.forward(a)) > 1e-3, "a different offset gave the same mask")
  end)

  it("cuda tensors never run on the cpu: explain names a gpu backend, a forced cpu is an error", function()
    if not HAS_GPU then pending("no GPU") return end
    al.manual_seed(3)
    local a = with(sep(rng("cuda", "f16"), "bshd"), { attn_mask_type = "causal" })
    local text, chosen = al.attention.explain(a)
    assert(chosen ~= nil and chosen ~= "cpu", "chosen: " .. tostring(chosen) .. "\n" .. text)
    assert(text:find("cpu%s+no:"), "the cpu backend should decline cuda tensors:\n" .. text)
    local out = al.attention.forward(a)
    assert(out:is_cuda())
    a.backend = "cpu"
    local ok, err = pcall(al.attention.forward, a)
    assert.is_false(ok)
    assert(tostring(err):find("forced backend 'cpu'", 1, true), tostring(err))
    -- f64 cuda tensors: no GPU backend takes them, and that is an error, not a silent cpu run
    al.manual_seed(3)
    local b = with(sep(rng("cuda", "f64"), "bshd", { b = 1, sq = 5, skv = 5, h = 2, hg = 2, dqk = 8 }),
      { attn_mask_type = "causal" })
    local ok2, err2 = pcall(al.attention.forward, b)
    assert.is_false(ok2, "f64 on cuda ran somewhere")
    assert(tostring(err2):find("no attention backend", 1, true), tostring(err2))
  end)

  it("a forced backend that cannot serve is an error quoting its reason", function()
    if not HAS_GPU then pending("no GPU") return end
    al.manual_seed(4)
    local a = with(sep(rng("cpu", "f32"), "bshd", { b = 1, sq = 5, skv = 5, h = 2, hg = 2, dqk = 8 }),
      { attn_mask_type = "causal", backend = "unfused" })
    local ok, err = pcall(al.attention.forward, a)
    assert.is_false(ok)
    assert(tostring(err):find("forced backend 'unfused'", 1, true), tostring(err))
    assert(tostring(err):find("tensors are on the cpu", 1, true), tostring(err))
    al.manual_seed(4)
    local b = with(sep(rng("cuda", "f64"), "bshd", { b = 1, sq = 5, skv = 5, h = 2, hg = 2, dqk = 8 }),
      { attn_mask_type = "causal", backend = "unfused" })
    local ok2, err2 = pcall(al.attention.forward, b)
    assert.is_false(ok2)
    assert(tostring(err2):find("f64 inputs", 1, true), tostring(err2))
  end)

  it("the unfused backend declines a score matrix above its memory limit, saying so", function()
    if not HAS_GPU then pending("no GPU") return end
    pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite); int unsetenv(const char *name);")
    al.manual_seed(6)
    local a = with(sep(rng("cuda", "f16"), "bshd"), { attn_mask_type = "causal", backend = "unfused" })
    ffi.C.setenv("ATTNLAB_UNFUSED_MAX_SCORE_BYTES", "1000", 1)
    local ok, text, chosen = pcall(al.attention.explain, a)
    ffi.C.unsetenv("ATTNLAB_UNFUSED_MAX_SCORE_BYTES")
    assert(ok, tostring(text))
    assert.is_nil(chosen)
    assert(text:find("ATTNLAB_UNFUSED_MAX_SCORE_BYTES", 1, true), text)
    local _, chosen2 = al.attention.explain(a)
    assert.equal("unfused", chosen2)
  end)

  it("gradients of a packed buffer land in one packed gradient (views written in place)", function()
    if not HAS_GPU then pending("no GPU") return end
    al.manual_seed(8)
    local qkv = al.randn({ B, S, 3, H, D }, { dtype = "f16", device = "cuda" })
    local out, ctx = al.attention.forward{ qkv_layer = qkv, qkv_format = "bshd", attn_mask_type = "causal", backend = "unfused" }
    local g = al.attention.backward(ctx, al.randn(out:size(), { dtype = "f16", device = "cuda" }))
    assert.are.same(qkv:size(), g.qkv_layer:size())
    assert(g.qkv_layer:is_cuda())
    for i = 1, 3 do
      local v = values(g.qkv_layer:select(3, i))
      local nz = 0
      for _, x in ipairs(v) do if x ~= 0 then nz = nz + 1 end end
      assert(nz > #v / 2, "packed gradient slice " .. i .. " is mostly zero")
    end
  end)
end)
