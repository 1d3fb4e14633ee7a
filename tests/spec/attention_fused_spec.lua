-- The fused (cuDNN SDPA) attention backend against the CPU oracle backend, #gpu only: outputs, LSE and
-- every gradient in bf16/f16 with TE's tolerances (bf16 1.5e-2, f16 1e-3; atol = rtol), over declared
-- packed layouts (bs3hd, bsh3d, sb3hd, sbh3d, bshd_bs2hd, t3hd), strided packed buffers (slices of
-- larger buffers), causal / bottom-right / window / padding / post_scale_bias / ALiBi / GQA / thd,
-- sequence lengths that are not multiples of 128, the deterministic backward, dropout consistency
-- (cuDNN's Philox stream is not the CPU's: same seed -> same result, other seed -> other result),
-- and the no-copy proof for the declared packed path.
local al = require "attnlab"

local function gpu_it(name, fn)
  if HAS_GPU then it(name, fn) else pending(name .. " (no GPU)") end
end

local TOL = { bf16 = 1.5e-2, f16 = 1e-3 }

local function cpu_copy(t) return t ~= nil and t:cpu() or nil end

-- the same call on the CPU backend, with every tensor argument moved to the CPU
local function cpu_args(a)
  local c = {}
  for k, v in pairs(a) do
    if type(v) == "table" and al.is_tensor and al.is_tensor(v) then c[k] = v:cpu()
    elseif type(v) == "cdata" or (type(v) == "table" and v.raw) then c[k] = v:cpu()
    else c[k] = v end
  end
  c.backend = "cpu"
  return c
end

local function close(name, got, want, tol)
  local g, w = got:cpu():float(), want:cpu():float()
  assert(al.allclose(g, w, { atol = tol, rtol = tol }),
    string.format("%s differs from the CPU oracle beyond %g", name, tol))
end

-- forward + backward on fused and cpu, compare out, lse and every gradient
local function compare(a, dtype)
  local tol = TOL[dtype]
  a.backend = "fused"
  local out, ctx = al.attention.forward(a)
  local ca = cpu_args(a)
  local cout, cctx = al.attention.forward(ca)
  close("out", out, cout, tol)
  close("lse", ctx.lse, cctx.lse, tol)
  local dout = al.randn(out:size(), { dtype = dtype, device = "cuda" })
  local g = al.attention.backward(ctx, dout)
  local cg = al.attention.backward(cctx, dout:cpu())
  local n = 0
  for k, v in pairs(cg) do
    assert(g[k] ~= nil, "fused backward did not return " .. k)
    close("grad " .. k, g[k], v, tol * 2)   -- gradients sum over a sequence: TE's bwd tolerance is looser
    n = n + 1
  end
  assert(n > 0)
  return out, ctx, g
end

local function R(shape, dtype) return al.randn(shape, { dtype = dtype, device = "cuda" }) end

describe("attention fused backend (cuDNN) #gpu", function()
  before_each(function() al.manual_seed(7) end)

  for _, dtype in ipairs({ "bf16", "f16" }) do
    gpu_it(dtype .. " bs3hd causal, s=200", function()
      compare({ qkv_layer = R({ 2, 200, 3, 4, 64 }, dtype), qkv_interleave_dim = -3, qkv_format = "bshd",
        attn_mask_type = "causal" }, dtype)
    end)
    gpu_it(dtype .. " bsh3d no_mask, s=136", function()
      compare({ qkv_layer = R({ 2, 136, 4, 3, 64 }, dtype), qkv_interleave_dim = -2, qkv_format = "bshd",
        attn_mask_type = "no_mask" }, dtype)
    end)
  end

  gpu_it("sb3hd and sbh3d causal", function()
    compare({ qkv_layer = R({ 160, 2, 3, 4, 64 }, "bf16"), qkv_interleave_dim = -3, qkv_format = "sbhd",
      attn_mask_type = "causal" }, "bf16")
    compare({ qkv_layer = R({ 160, 2, 4, 3, 64 }, "bf16"), qkv_interleave_dim = -2, qkv_format = "sbhd",
      attn_mask_type = "causal" }, "bf16")
  end)

  gpu_it("strided packed buffer (a slice of a larger buffer), d=128", function()
    local big = R({ 2, 200, 3, 4, 136 }, "bf16")
    local qkv = big:narrow(5, 5, 128):narrow(2, 9, 180)
    compare({ qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal" }, "bf16")
  end)

  gpu_it("bshd_bs2hd GQA (h=8, hg=2) and bottom-right causal with s_q < s_kv", function()
    compare({ query_layer = R({ 2, 96, 8, 64 }, "bf16"), kv_layer = R({ 2, 200, 2, 2, 64 }, "bf16"),
      qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal_bottom_right" }, "bf16")
  end)

  gpu_it("sliding window (64, 0)", function()
    compare({ qkv_layer = R({ 2, 300, 3, 4, 64 }, "bf16"), qkv_interleave_dim = -3, qkv_format = "bshd",
      attn_mask_type = "causal", window_size = { 64, 0 } }, "bf16")
  end)

  gpu_it("padding (right-padded attention_mask) causal", function()
    local b, s = 3, 150
    local lens = { 150, 97, 33 }
    local m = al.zeros({ b, 1, 1, s }, { dtype = "bool" })
    for i = 1, b do if lens[i] < s then m:narrow(1, i, 1):narrow(4, lens[i] + 1, s - lens[i]):fill_(1) end end
    compare({ qkv_layer = R({ b, s, 3, 4, 64 }, "bf16"), qkv_interleave_dim = -3, qkv_format = "bshd",
      attn_mask_type = "padding_causal", attention_mask = m:cuda() }, "bf16")
  end)

  gpu_it("post_scale_bias [1,h,s,s] with dbias", function()
    local _, _, g = compare({ qkv_layer = R({ 2, 128, 3, 4, 64 }, "bf16"), qkv_interleave_dim = -3, qkv_format = "bshd",
      attn_mask_type = "no_mask", core_attention_bias_type = "post_scale_bias",
      core_attention_bias = R({ 1, 4, 128, 128 }, "bf16") }, "bf16")
    assert(g.core_attention_bias ~= nil)
  end)

  gpu_it("ALiBi with causal", function()
    compare({ qkv_layer = R({ 2, 128, 3, 4, 64 }, "bf16"), qkv_interleave_dim = -3, qkv_format = "bshd",
      attn_mask_type = "causal", core_attention_bias_type = "alibi" }, "bf16")
  end)

  gpu_it("thd t3hd with cu_seqlens and cu_seqlens_padded (gaps)", function()
    local cu = al.tensor({ 0, 50, 130, 131 }, { dtype = "i32" }):cuda()
    local cup = al.tensor({ 0, 64, 160, 176 }, { dtype = "i32" }):cuda()
    compare({ qkv_layer = R({ 176, 3, 4, 64 }, "bf16"), qkv_interleave_dim = -3, qkv_format = "thd",
      attn_mask_type = "padding_causal", cu_seqlens_q = cu, cu_seqlens_kv = cu, cu_seqlens_q_padded = cup,
      cu_seqlens_kv_padded = cup }, "bf16")
  end)

  gpu_it("deterministic backward is bit-reproducible and matches the oracle", function()
    local a = { qkv_layer = R({ 2, 128, 3, 4, 64 }, "bf16"), qkv_interleave_dim = -3, qkv_format = "bshd",
      attn_mask_type = "causal", deterministic = true }
    local _, ctx, g1 = compare(a, "bf16")
    local dout = al.randn(ctx.out:size(), { dtype = "bf16", device = "cuda" })
    local x = al.attention.backward(ctx, dout).qkv_layer
    local y = al.attention.backward(ctx, dout).qkv_layer
    assert(al.allclose(x:cpu():float(), y:cpu():float(), { atol = 0, rtol = 0 }))
    assert(g1.qkv_layer ~= nil)
  end)

  gpu_it("dropout: same seed -> same output, other seed -> other output (cuDNN's RNG, not the CPU's)", function()
    local qkv = R({ 2, 128, 3, 4, 64 }, "bf16")
    local function run(seed)
      return al.attention.forward({ qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd",
        attn_mask_type = "causal", attention_dropout = 0.3, dropout_seed = seed, dropout_offset = 0,
        backend = "fused" }):cpu():float()
    end
    local a, b, c = run(11), run(11), run(12)
    assert(al.allclose(a, b, { atol = 0, rtol = 0 }))
    assert(not al.allclose(a, c, { atol = 1e-3, rtol = 1e-3 }))
  end)

  gpu_it("the declared packed path makes no copy of q/k/v", function()
    local b, s, h, d = 2, 512, 8, 128
    local qkv = R({ b, s, 3, h, d }, "bf16")
    local a = { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal", backend = "fused" }
    al.attention.forward(a)                     -- builds and caches the plan
    collectgarbage(); collectgarbage()
    al.cuda.synchronize()
    local before = al.memory().cuda[0].in_use
    al.C.al_memory_reset_peak(1, 0)
    local out, ctx = al.attention.forward(a)
    al.cuda.synchronize()
    local peak = al.memory().cuda[0].peak
    local outputs = b * s * h * d * 2 + b * h * s * 4   -- out + lse
    local q_bytes = b * s * h * d * 2
    assert(peak - before < outputs + q_bytes / 2,
      string.format("peak grew by %d bytes; outputs are %d, one q copy would add %d", peak - before, outputs, q_bytes))
    assert(out ~= nil and ctx ~= nil)
  end)
end)
