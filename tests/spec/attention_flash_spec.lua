-- The `flash` backend (our NVRTC-compiled FA2-class kernels, src/cuda/attn_flash.cu) against the CPU
-- oracle (#gpu): output, lse and every gradient, with TransformerEngine's tolerances (atol = rtol:
-- f16 1e-3, bf16 1.5e-2; lse 1e-4 with -inf exactly where the cpu has it).
--
-- Matrix: head dims 64/128/256; sequence lengths that are not multiples of the tiles (77, 200, 1000;
-- q tiles are 64 forward / 32 backward, kv tiles 64 (32 at d=256 forward)); declared packed
-- (qkv_layer bs3hd/bsh3d/sb3hd, kv_layer), detected (select views of one buffer passed separately),
-- separate bshd/sbhd/thd; strided packed buffers (slices of larger ones); every mask the backend
-- takes (no_mask, causal, causal_bottom_right, padding* from cu_seqlens) and sliding windows; GQA and
-- MQA; ALiBi (default and custom slopes); thd varlen with cu_seqlens_padded gaps and an empty
-- sequence; fully masked rows (sq > skv, bottom-right); the deterministic backward (bit-identical
-- reruns). Every case first asserts that flash serves it (explain), so a silent decline fails.
-- The declines (f32, d=40, dropout, arbitrary masks, bias, mask-tensor padding) must name their reason.
local al = require "attnlab"

local TOL = { f16 = 1e-3, bf16 = 1.5e-2 }
-- Gradients in f16: the kernel rounds P and dS to f16 before the dV/dK/dQ products, the CPU oracle
-- keeps them in f32; ulp(0.25) in f16 is 2^-12 ~ 2.4e-4, so 2.5e-3 is ~10 ulps (as for the fused
-- backend). Outputs keep TE's 1e-3. Measured drift on the H200: 1.07e-3 .. 1.4e-3.
local GRAD_TOL = { f16 = 2.5e-3, bf16 = 1.5e-2 }
local BOTH = { "f16", "bf16" }

local function rng(dev, dt)
  local R = {}
  function R.randn(shape, dtype) return al.randn(shape, { dtype = dtype or dt, device = dev }) end
  function R.i32(list) return al.tensor(list, { dtype = "i32" }):to(dev) end
  R.dev, R.dt = dev, dt
  return R
end

local function shp(fmt, b, s, ...)
  local t = fmt == "bshd" and { b, s } or { s, b }
  for _, x in ipairs({ ... }) do t[#t + 1] = x end
  return t
end

local function with(a, extra)
  for k, v in pairs(extra) do a[k] = v end
  return a
end

-- separate tensors: o = { b, sq, skv, h, hg, d }
local function sep(R, fmt, o)
  local b, sq, skv, h, hg, d = o.b or 2, o.sq or 77, o.skv or o.sq or 77, o.h or 4, o.hg or 2, o.d or 64
  return { query_layer = R.randn(shp(fmt, b, sq, h, d)), key_layer = R.randn(shp(fmt, b, skv, hg, d)),
    value_layer = R.randn(shp(fmt, b, skv, hg, d)), qkv_format = fmt }
end

local CASES = {}
local function case(name, dtypes, build, extra)
  CASES[#CASES + 1] = { name = name, dtypes = dtypes, build = build, deterministic = extra and extra.deterministic }
end

-- head dims x lengths, causal and not, separate bshd with GQA
for _, d in ipairs({ 64, 128, 256 }) do
  for _, s in ipairs({ 77, 200 }) do
    for _, mask in ipairs({ "no_mask", "causal" }) do
      case(string.format("d=%d s=%d %s, bshd, GQA", d, s, mask), BOTH, function(R)
        return with(sep(R, "bshd", { sq = s, d = d }), { attn_mask_type = mask })
      end)
    end
  end
end
case("d=128 s=1000 causal, bshd, GQA", BOTH, function(R)
  return with(sep(R, "bshd", { b = 1, sq = 1000, d = 128 }), { attn_mask_type = "causal" })
end)
case("d=64 s=1000 no_mask, sbhd, MQA", { "bf16" }, function(R)
  return with(sep(R, "sbhd", { b = 1, sq = 1000, hg = 1, d = 64 }), { attn_mask_type = "no_mask" })
end)
case("d=256 cross sq=77 skv=200, causal_bottom_right", BOTH, function(R)
  return with(sep(R, "bshd", { sq = 77, skv = 200, d = 256 }), { attn_mask_type = "causal_bottom_right" })
end)

-- layouts: declared packed, detected, strided
for _, L in ipairs({ { "bshd", -3 }, { "bshd", -2 }, { "sbhd", -3 }, { "sbhd", -2 } }) do
  local fmt, dim = L[1], L[2]
  local tag = (fmt == "bshd" and "bs" or "sb") .. (dim == -3 and "3hd" or "h3d")
  case("packed qkv_layer " .. tag .. ", causal, d=64 s=200", BOTH, function(R)
    local inner = dim == -3 and { 3, 4, 64 } or { 4, 3, 64 }
    return { qkv_layer = R.randn(shp(fmt, 2, 200, unpack(inner))), qkv_interleave_dim = dim, qkv_format = fmt,
      attn_mask_type = "causal" }
  end)
end
case("packed kv_layer bshd_bs2hd, GQA cross, no_mask, d=128", BOTH, function(R)
  return { query_layer = R.randn({ 2, 77, 4, 128 }), kv_layer = R.randn({ 2, 200, 2, 2, 128 }), qkv_interleave_dim = -3,
    qkv_format = "bshd", attn_mask_type = "no_mask" }
end)
case("detected: select views of one bs3hd buffer passed separately", BOTH, function(R)
  local qkv = R.randn({ 2, 200, 3, 4, 64 })
  return { query_layer = qkv:select(3, 1), key_layer = qkv:select(3, 2), value_layer = qkv:select(3, 3),
    qkv_format = "bshd", attn_mask_type = "causal" }
end)
case("strided packed buffer: bs3hd slice of a longer buffer with extra heads", BOTH, function(R)
  local big = R.randn({ 2, 300, 3, 6, 64 })
  return { qkv_layer = big:narrow(2, 9, 200):narrow(4, 2, 4), qkv_interleave_dim = -3, qkv_format = "bshd",
    attn_mask_type = "causal" }
end)
case("strided packed buffer: sbh3d slice, d=128", { "bf16" }, function(R)
  local big = R.randn({ 220, 2, 4, 3, 128 })
  return { qkv_layer = big:narrow(1, 5, 200), qkv_interleave_dim = -2, qkv_format = "sbhd", attn_mask_type = "no_mask" }
end)

-- masks and windows
case("causal_bottom_right sq=200 skv=77: fully masked rows are zero, lse -inf", BOTH, function(R)
  return with(sep(R, "bshd", { sq = 200, skv = 77 }), { attn_mask_type = "causal_bottom_right" })
end)
for _, mask in ipairs({ "padding", "padding_causal", "padding_causal_bottom_right" }) do
  case(mask .. " from cu_seqlens (bshd, cross)", BOTH, function(R)
    return with(sep(R, "bshd", { sq = 200, skv = 150 }), { attn_mask_type = mask, cu_seqlens_q = R.i32({ 0, 130, 330 }),
      cu_seqlens_kv = R.i32({ 0, 150, 227 }) })
  end)
end
for _, w in ipairs({ { "no_mask", { 10, 5 } }, { "no_mask", { 3, 40 }, false }, { "causal", { 17, 0 } },
  { "causal_bottom_right", { 70, 0 } }, { "padding", { 5, 9 } }, { "padding_causal_bottom_right", { 12, 0 } } }) do
  case("window " .. w[1] .. " (" .. w[2][1] .. "," .. w[2][2] .. ")" .. (w[3] == false and " top-left" or ""), BOTH,
    function(R)
      local a = with(sep(R, "bshd", { sq = 200, skv = 230, d = 128 }), { attn_mask_type = w[1], window_size = w[2] })
      if w[3] ~= nil then a.bottom_right_diagonal = w[3] end
      if w[1]:find("padding") then a.cu_seqlens_q, a.cu_seqlens_kv = R.i32({ 0, 150, 350 }), R.i32({ 0, 230, 400 }) end
      return a
    end)
end

-- ALiBi
for _, mask in ipairs({ "causal", "no_mask", "padding_causal" }) do
  case("alibi default slopes, " .. mask, BOTH, function(R)
    local a = with(sep(R, "bshd", { sq = 200, skv = 200, h = 6, hg = 3 }), { attn_mask_type = mask,
      core_attention_bias_type = "alibi" })
    if mask:find("padding") then a.cu_seqlens_q, a.cu_seqlens_kv = R.i32({ 0, 150, 350 }), R.i32({ 0, 200, 380 }) end
    return a
  end)
end
case("alibi custom slopes [b,h], causal_bottom_right cross", { "bf16" }, function(R)
  return with(sep(R, "bshd", { sq = 77, skv = 200 }), { attn_mask_type = "causal_bottom_right",
    core_attention_bias_type = "alibi", alibi_slopes = al.rand({ 2, 4 }, { dtype = "f32", device = R.dev }) })
end)

-- thd varlen
case("thd padding_causal, GQA, d=128", BOTH, function(R)
  return { query_layer = R.randn({ 277, 4, 128 }), key_layer = R.randn({ 277, 2, 128 }), value_layer = R.randn({ 277, 2, 128 }),
    qkv_format = "thd", attn_mask_type = "padding_causal", cu_seqlens_q = R.i32({ 0, 77, 277 }),
    cu_seqlens_kv = R.i32({ 0, 77, 277 }) }
end)
case("thd with cu_seqlens_padded gaps, bottom-right cross", BOTH, function(R)
  return { query_layer = R.randn({ 300, 4, 64 }), key_layer = R.randn({ 330, 2, 64 }), value_layer = R.randn({ 330, 2, 64 }),
    qkv_format = "thd", attn_mask_type = "padding_causal_bottom_right", cu_seqlens_q = R.i32({ 0, 77, 277 }),
    cu_seqlens_kv = R.i32({ 0, 90, 300 }), cu_seqlens_q_padded = R.i32({ 0, 96, 300 }),
    cu_seqlens_kv_padded = R.i32({ 0, 100, 330 }) }
end)
case("thd packed t3hd with an empty sequence", { "f16" }, function(R)
  return { qkv_layer = R.randn({ 277, 3, 4, 64 }), qkv_interleave_dim = -3, qkv_format = "thd", attn_mask_type = "padding",
    cu_seqlens_q = R.i32({ 0, 77, 77, 277 }), cu_seqlens_kv = R.i32({ 0, 77, 77, 277 }) }
end)

-- deterministic backward
case("deterministic backward, GQA, s=1000 causal", { "bf16" }, function(R)
  return with(sep(R, "bshd", { b = 1, sq = 1000, d = 64 }), { attn_mask_type = "causal", deterministic = true })
end, { deterministic = true })

---------------------------------------------------------------------------------------------------
local function forward(args)
  local r = { al.attention.forward(args) }
  return r[1], r[#r]
end

local function values(t) return t:to("cpu"):to("f64"):flat_values() end

-- the flash backend's NVRTC log: which specialisations were compiled or loaded
local function flash_info() return (al.cuda.backend_info("flash")) end

local function close_values(name, got, want, tol)
  assert.equal(#want, #got, name .. ": element count")
  local worst, at = -math.huge, 0
  for i = 1, #want do
    local g, w = got[i], want[i]
    if w == -math.huge or w == math.huge then
      assert(g == w, string.format("%s[%d]: gpu %g where the cpu has %g", name, i, g, w))
    else
      assert(g == g and g ~= math.huge and g ~= -math.huge, string.format("%s[%d]: %g on the gpu (cpu %g)", name, i, g, w))
      local e = math.abs(g - w) - tol * math.abs(w)
      if e > worst then worst, at = e, i end
    end
  end
  assert(worst <= tol, string.format("%s: element %d differs by %.3g beyond rtol (atol = rtol = %.3g): gpu %.8g, cpu %.8g",
    name, at, worst + tol * math.abs(want[at] or 0), tol, got[at] or 0, want[at] or 0))
end

local function close(name, got, want, tol)
  assert.are.same(want:size(), got:size(), name .. ": shape")
  assert(got:is_cuda(), name .. ": the gpu result is not on cuda")
  close_values(name, values(got), values(want), tol)
end

-- the same case built twice from one seed: on the CPU (backend "cpu", the oracle) and on the GPU ("flash")
local function cpu_gpu_args(build, dt, seed)
  al.manual_seed(seed)
  local ca = build(rng("cpu", dt))
  al.manual_seed(seed)
  local ga = build(rng("cuda", dt))
  ca.backend, ga.backend = "cpu", "flash"
  return ca, ga
end

-- opts.out_dtype: the GPU ctx's out converted to that dtype before the backward (the pre pass's element-wise path)
local function run_case(c, dt, opts)
  local label = c.name .. " [flash, " .. dt .. (opts and opts.out_dtype and ", out " .. opts.out_dtype or "") .. "]"
  local seed = 2000 + #c.name
  local ca, ga = cpu_gpu_args(c.build, dt, seed)
  local text, chosen = al.attention.explain(ga)
  assert(chosen == "flash", label .. ": flash must serve this case:\n" .. text)

  local co, cctx = forward(ca)
  local go, gctx = forward(ga)
  local tol = TOL[dt]
  close(label .. " out", go, co, tol)
  close_values(label .. " lse", values(gctx.lse), values(cctx.lse), 1e-4)

  if opts and opts.out_dtype then gctx.out = gctx.out:to(opts.out_dtype) end
  al.manual_seed(seed + 1)
  local cdout = al.randn(co:size(), { dtype = co:dtype() })
  al.manual_seed(seed + 1)
  local gdout = al.randn(go:size(), { dtype = go:dtype(), device = "cuda" })
  local cg = al.attention.backward(cctx, cdout)
  local gg = al.attention.backward(gctx, gdout)
  local n = 0
  for key, want in pairs(cg) do
    assert(gg[key] ~= nil, label .. ": no gradient " .. key)
    close(label .. " d" .. key, gg[key], want, GRAD_TOL[dt])
    n = n + 1
  end
  assert(n >= 1, label .. ": no gradients compared")
  if c.deterministic then
    local again = al.attention.backward(gctx, gdout)
    for key, t in pairs(gg) do
      assert.equal(0, al.max_abs_diff(t, again[key]), label .. ": deterministic backward differs between runs in d" .. key)
    end
  end
end

describe("attention flash backend #gpu", function()
  for _, c in ipairs(CASES) do
    it(c.name, function()
      if not HAS_GPU then pending("no GPU") return end
      for _, dt in ipairs(c.dtypes) do run_case(c, dt) end
    end)
  end

  it("declines what it does not implement, naming the reason", function()
    if not HAS_GPU then pending("no GPU") return end
    local R = rng("cuda", "bf16")
    local function reason(a, needle)
      a.backend = nil
      local text = al.attention.explain(a)
      local line = text:match("\n%s*flash%s+no: ([^\n]*)")
      assert(line, "flash should decline:\n" .. text)
      assert(line:find(needle, 1, true), "flash's reason lacks '" .. needle .. "':\n" .. text)
    end
    al.manual_seed(1)
    reason(with(sep(rng("cuda", "f32"), "bshd", {}), { attn_mask_type = "causal" }), "f32 inputs")
    reason(with(sep(R, "bshd", { d = 40 }), { attn_mask_type = "causal" }), "d_qk == d_v in {64, 128, 256}")
    reason(with(sep(R, "bshd", {}), { attn_mask_type = "causal", attention_dropout = 0.1 }), "dropout")
    reason(with(sep(R, "bshd", {}), { attn_mask_type = "arbitrary",
      attention_mask = al.rand({ 2, 1, 77, 77 }, { device = "cuda" }):gt(0.5) }), "arbitrary")
    reason(with(sep(R, "bshd", {}), { attn_mask_type = "no_mask", core_attention_bias_type = "post_scale_bias",
      core_attention_bias = R.randn({ 1, 4, 77, 77 }) }), "post_scale_bias")
    local m = {}
    for b = 1, 2 do local r = {} for i = 1, 77 do r[i] = i > 70 and 1 or 0 end m[b] = { { r } } end
    reason(with(sep(R, "bshd", {}), { attn_mask_type = "padding",
      attention_mask = al.tensor(m, { dtype = "bool" }):to("cuda") }), "cu_seqlens")
    -- a head dim that is not 16-byte aligned in a packed buffer: the views are fine, the tiles are not
    local big = R.randn({ 2, 77, 3, 4, 68 })
    reason({ qkv_layer = big:narrow(5, 3, 64), qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal" },
      "16 bytes")
  end)

  -- Two backwards serve d 64 / 128 on sm_90: the Hopper kernels (kernels/flash_bwd_sm90.cu, the default,
  -- which the cases above ran) and the stage-1 kernels (ATTNLAB_FLASH_SM90_BWD=0). Both must give the CPU
  -- oracle's outputs and every gradient; al_flash_info must name the Hopper kernels from the default runs.
  it("the sm_90 backward (default) and the stage-1 backward (ATTNLAB_FLASH_SM90_BWD=0) give the CPU oracle's gradients", function()
    if not HAS_GPU then pending("no GPU") return end
    if al.cuda.device_info(0).capability[1] ~= 9 then pending("not an sm_90 device") return end
    local function hopper_bwd_case(c) return not c.name:find("d=256", 1, true) and not c.name:find("alibi", 1, true) end
    for _, c in ipairs(CASES) do   -- one default run here too, so the check holds when this test runs alone
      if hopper_bwd_case(c) then run_case(c, c.dtypes[1]) break end
    end
    local text = flash_info()
    assert(text:find("bwd-sm90-dkdv", 1, true) and text:find("bwd-sm90-dq", 1, true), text)
    local n = 0
    with_env("ATTNLAB_FLASH_SM90_BWD", "0", function()
      for _, c in ipairs(CASES) do
        if hopper_bwd_case(c) then
          for _, dt in ipairs(c.dtypes) do run_case(c, dt) end
          n = n + 1
        end
      end
    end)
    assert(n >= 20, "only " .. n .. " cases ran")
  end)

  -- The three-consumer Hopper forward (ATTNLAB_FLASH_SM90_CONSUMERS=3, an experiment: BM = 192, 64-key tiles,
  -- d = 64 / 128; src/cuda/flash_sm90_specs.h) on every such case the Hopper kernels serve (formats, packed inputs,
  -- GQA, thd, masks, windows; not ALiBi): the CPU oracle's outputs, LSE and gradients; al_flash_info must name its
  -- " c3" kernels.
  it("the three-consumer sm_90 forward (ATTNLAB_FLASH_SM90_CONSUMERS=3) gives the CPU oracle's results", function()
    if not HAS_GPU then pending("no GPU") return end
    if al.cuda.device_info(0).capability[1] ~= 9 then pending("not an sm_90 device") return end
    local n = 0
    with_env("ATTNLAB_FLASH_SM90_CONSUMERS", "3", function()
      for _, c in ipairs(CASES) do
        if not c.name:find("d=256", 1, true) and not c.name:find("alibi", 1, true) then
          for _, dt in ipairs(c.dtypes) do run_case(c, dt) end
          n = n + 1
        end
      end
    end)
    assert(n >= 30, "only " .. n .. " cases ran")
    local text = flash_info()
    assert(text:find("fwd%-sm90 d128 b?f16 %S+ c3") and text:find("fwd%-sm90 d64 b?f16 %S+ c3"),
      "no three-consumer forward at d = 64 and 128 in the NVRTC log:\n" .. text)
  end)

  -- The backward's pre pass (D = rowsum(dO O), flash_bwd.cu's al_flash_bwd_pre) reads a row of out and dout
  -- 16 bytes a lane when both are in the kernel's dtype with unit column stride and aligned rows (every case
  -- above); anything else goes element by element through al_ld_elem. An out in f32 (a ctx whose out was
  -- converted) takes that path, under the Hopper backward and the stage-1 one, for dense, GQA and thd cases.
  it("the backward's pre pass reads an out in another dtype (its element-wise path)", function()
    if not HAS_GPU then pending("no GPU") return end
    local names = { ["d=128 s=1000 causal, bshd, GQA"] = true, ["d=64 s=1000 no_mask, sbhd, MQA"] = true,
      ["d=256 cross sq=77 skv=200, causal_bottom_right"] = true, ["thd with cu_seqlens_padded gaps, bottom-right cross"] = true }
    local n = 0
    for _, c in ipairs(CASES) do
      if names[c.name] then
        run_case(c, c.dtypes[1], { out_dtype = "f32" })
        with_env("ATTNLAB_FLASH_SM90_BWD", "0", function() run_case(c, c.dtypes[1], { out_dtype = "f32" }) end)
        n = n + 1
      end
    end
    assert.equal(4, n, "cases found")
  end)

  -- The Hopper kernels' launch order (p.sched_hb; causal launches go longest block first, across heads, in
  -- sections of (head, batch) pairs; ATTNLAB_FLASH_SCHED overrides it): a CTA's work does not depend on when
  -- it runs, so every order must give the same bits, and a section size that leaves a short last section
  -- (4 of 9 and 18 pairs here) must still visit every block exactly once.
  it("every launch order of the sm_90 kernels (ATTNLAB_FLASH_SCHED) gives the same bits", function()
    if not HAS_GPU then pending("no GPU") return end
    if al.cuda.device_info(0).capability[1] ~= 9 then pending("not an sm_90 device") return end
    local shapes = {
      { "bshd d=128 causal GQA b=3 h=6 hg=3 s=333", function(R)
        return with(sep(R, "bshd", { b = 3, sq = 333, h = 6, hg = 3, d = 128 }), { attn_mask_type = "causal" }) end },
      { "sbhd d=64 no_mask MQA b=2 h=5 s=300", function(R)
        return with(sep(R, "sbhd", { b = 2, sq = 300, h = 5, hg = 1, d = 64 }), { attn_mask_type = "no_mask" }) end },
    }
    for _, sh in ipairs(shapes) do
      local ca, ga = cpu_gpu_args(sh[2], "bf16", 91)
      local co, cctx = forward(ca)
      al.manual_seed(92)
      local cdout = al.randn(co:size(), { dtype = co:dtype() })
      local gdout = cdout:to("cuda")
      local cg = al.attention.backward(cctx, cdout)
      local first
      for _, mode in ipairs({ "0", "default", "1", "4", "all" }) do
        with_env("ATTNLAB_FLASH_SCHED", mode ~= "default" and mode or nil, function()
          local label = sh[1] .. " (ATTNLAB_FLASH_SCHED=" .. mode .. ")"
          local go, gctx = forward(ga)
          local gg = al.attention.backward(gctx, gdout)
          local got = { out = go, lse = gctx.lse }
          for key, t in pairs(gg) do got["d" .. key] = t end
          if not first then   -- the grid's order against the CPU oracle, the others bit for bit against it
            close(label .. " out", go, co, TOL.bf16)
            close_values(label .. " lse", values(gctx.lse), values(cctx.lse), 1e-4)
            for key, want in pairs(cg) do close(label .. " d" .. key, gg[key], want, GRAD_TOL.bf16) end
            first = got
          else
            local n = 0
            for key, t in pairs(first) do
              assert.equal(0, al.max_abs_diff(got[key], t), label .. ": " .. key .. " differs from the grid's order")
              n = n + 1
            end
            assert.equal(5, n)   -- out, lse and the three gradients
          end
        end)
      end
    end
  end)

  -- The five-GEMM backward (kernels/flash_bwd_sm90.cu's AL_SM90_DQ_ATOMIC, opt-in while it is measured): the
  -- dK/dV kernel also computes dQ and adds it into an f32 accumulator. d = 128: every d = 128 case above (the
  -- windows are d = 128) and, at d = 128, packed bs3hd, fully masked rows, padding from cu_seqlens and thd
  -- with padded gaps. Not bit-reproducible (atomics), so only against the CPU oracle.
  it("the five-GEMM backward (ATTNLAB_FLASH_SM90_BWD_FUSED=1) gives the CPU oracle's gradients", function()
    if not HAS_GPU then pending("no GPU") return end
    if al.cuda.device_info(0).capability[1] ~= 9 then pending("not an sm_90 device") return end
    local extra = {
      { name = "fused: packed qkv_layer bs3hd causal d=128 s=333", dtypes = BOTH, build = function(R)
        return { qkv_layer = R.randn({ 2, 333, 3, 4, 128 }), qkv_interleave_dim = -3, qkv_format = "bshd",
          attn_mask_type = "causal" } end },
      { name = "fused: causal_bottom_right sq=200 skv=77 d=128 (fully masked rows)", dtypes = { "bf16" }, build = function(R)
        return with(sep(R, "bshd", { sq = 200, skv = 77, d = 128 }), { attn_mask_type = "causal_bottom_right" }) end },
      { name = "fused: padding_causal from cu_seqlens, sbhd cross d=128", dtypes = { "bf16" }, build = function(R)
        return with(sep(R, "sbhd", { sq = 200, skv = 150, d = 128 }), { attn_mask_type = "padding_causal",
          cu_seqlens_q = R.i32({ 0, 130, 330 }), cu_seqlens_kv = R.i32({ 0, 150, 227 }) }) end },
      { name = "fused: thd with cu_seqlens_padded gaps, GQA d=128", dtypes = { "bf16" }, build = function(R)
        return { query_layer = R.randn({ 300, 4, 128 }), key_layer = R.randn({ 330, 2, 128 }),
          value_layer = R.randn({ 330, 2, 128 }), qkv_format = "thd", attn_mask_type = "padding_causal_bottom_right",
          cu_seqlens_q = R.i32({ 0, 77, 277 }), cu_seqlens_kv = R.i32({ 0, 90, 300 }),
          cu_seqlens_q_padded = R.i32({ 0, 96, 300 }), cu_seqlens_kv_padded = R.i32({ 0, 100, 330 }) } end },
    }
    local n = 0
    with_env("ATTNLAB_FLASH_SM90_BWD_FUSED", "1", function()
      for _, c in ipairs(CASES) do
        if (c.name:find("d=128", 1, true) or c.name:find("^window")) and not c.deterministic then
          for _, dt in ipairs(c.dtypes) do run_case(c, dt) end
          n = n + 1
        end
      end
      for _, c in ipairs(extra) do
        for _, dt in ipairs(c.dtypes) do run_case(c, dt) end
        n = n + 1
      end
    end)
    assert(n >= 16, "only " .. n .. " cases ran")
    local text = flash_info()
    assert(text:find("bwd-sm90-dkdvq d128 bf16", 1, true) and text:find("bwd-sm90-dkdvq d128 f16", 1, true), text)
  end)

  it("reports NVRTC compiles and cache loads through al_flash_info", function()
    if not HAS_GPU then pending("no GPU") return end
    al.manual_seed(3)
    local a = with(sep(rng("cuda", "bf16"), "bshd", {}), { attn_mask_type = "causal", backend = "flash" })
    al.attention.forward(a)
    local s = flash_info()
    -- sm_90 serves this forward with its wgmma kernel; other devices (or ATTNLAB_FLASH_SM90=0) use stage 1
    local sm90 = al.cuda.device_info(0).capability[1] == 9 and os.getenv("ATTNLAB_FLASH_SM90") ~= "0"
    assert(s:find("nvrtc=", 1, true) and s:find(sm90 and "fwd-sm90 d64 bf16 causal-tl" or "fwd d64 bf16 causal-tl", 1, true), s)
  end)

  -- The Hopper forward (wgmma/TMA) and the stage-1 forward (mma.sync) are two implementations of one
  -- contract: on an sm_90 device both must give the CPU oracle's output and lse, on the same inputs.
  it("the sm_90 forward and the stage-1 forward agree with the CPU oracle (ATTNLAB_FLASH_SM90=0 / default)", function()
    if not HAS_GPU then pending("no GPU") return end
    if al.cuda.device_info(0).capability[1] ~= 9 then pending("not an sm_90 device") return end
    local shapes = {
      { "bshd d=128 causal GQA", function(R) return with(sep(R, "bshd", { sq = 300, d = 128 }), { attn_mask_type = "causal" }) end },
      { "sbhd d=64 window", function(R) return with(sep(R, "sbhd", { sq = 200, d = 64 }),
        { attn_mask_type = "causal_bottom_right", window_size = { 40, 0 } }) end },
      { "bshd d=256 sq<skv bottom-right", function(R) return with(sep(R, "bshd", { sq = 70, skv = 190, d = 256 }),
        { attn_mask_type = "causal_bottom_right" }) end },
    }
    for _, sh in ipairs(shapes) do
      local ca, ga = cpu_gpu_args(sh[2], "bf16", 77)
      local co, cctx = forward(ca)
      local outs = {}
      for _, mode in ipairs({ "0", "1" }) do
        with_env("ATTNLAB_FLASH_SM90", mode, function()
          local go, gctx = forward(ga)
          close(sh[1] .. " out (ATTNLAB_FLASH_SM90=" .. mode .. ")", go, co, TOL.bf16)
          close_values(sh[1] .. " lse (ATTNLAB_FLASH_SM90=" .. mode .. ")", values(gctx.lse), values(cctx.lse), 1e-4)
          outs[mode] = go
        end)
      end
      -- two kernels, two summation orders: close, and not the same bits by accident of a fallback
      assert(al.max_abs_diff(outs["0"], outs["1"]) <= 2 * TOL.bf16, sh[1] .. ": the two forwards disagree")
    end
    -- both kernels ran: the info log names a stage-1 forward and an sm90 forward of the last shape
    local s = flash_info()
    assert(s:find("fwd-sm90 d256 bf16 causal-br", 1, true) and s:find("fwd d256 bf16 causal-br", 1, true), s)
  end)
end)
