-- The fused (cuDNN SDPA) attention backend against the CPU oracle backend, #gpu only: outputs, LSE and
-- every gradient in bf16/f16 with TE's tolerances (outputs bf16 1.5e-2, f16 1e-3; atol = rtol;
-- gradients see TOL), over declared packed layouts (bs3hd, bsh3d, sb3hd, sbh3d, bshd_bs2hd, t3hd),
-- strided packed buffers (16-byte aligned slices of larger buffers; an unaligned slice is declined
-- with its reason and served by another backend), causal / bottom-right / window / padding /
-- post_scale_bias / ALiBi / GQA / thd, sequence lengths that are not multiples of 128, the
-- deterministic backward, dropout (cuDNN's Philox stream is not the CPU's, so it is probed directly:
-- the mask is read off the output with a one-hot V, its keep rate and scaling checked, and the
-- backward checked against that same mask), and the no-copy proof for the declared packed path.
local al = require "attnlab"

local function gpu_it(name, fn)
  if HAS_GPU then it(name, fn) else pending(name .. " (no GPU)") end
end

-- grad: bf16 keeps the earlier 2x of the output tolerance (gradients sum over a sequence); f16 uses
-- 2.5e-3 because cuDNN rounds P and dS to f16 before the gradient matmuls while the CPU oracle keeps
-- them in f32: ~10 f16 ulps at magnitude 0.25 (ulp 2^-12), about twice the drift measured on an H200
-- (1.0e-3 .. 1.3e-3); see attention_gpu_spec.lua, GRAD_TOL_FUSED_F16.
local TOL = { bf16 = { out = 1.5e-2, grad = 3e-2 }, f16 = { out = 1e-3, grad = 2.5e-3 } }

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

-- forward + backward on fused (or backend, nil = automatic selection) and cpu, compare out, lse and
-- every gradient
local function compare(a, dtype, backend)
  local tol = TOL[dtype]
  a.backend = backend == nil and "fused" or backend
  if a.backend == "auto" then a.backend = nil end
  local out, ctx = al.attention.forward(a)
  local ca = cpu_args(a)
  local cout, cctx = al.attention.forward(ca)
  close("out", out, cout, tol.out)
  close("lse", ctx.lse, cctx.lse, tol.out)
  local dout = al.randn(out:size(), { dtype = dtype, device = "cuda" })
  local g = al.attention.backward(ctx, dout)
  local cg = al.attention.backward(cctx, dout:cpu())
  local n = 0
  for k, v in pairs(cg) do
    assert(g[k] ~= nil, "fused backward did not return " .. k)
    close("grad " .. k, g[k], v, tol.grad)
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

  -- cuDNN takes 16-byte aligned addresses only: with bf16 (2 bytes) a slice must start at a multiple
  -- of 8 elements. Here: head-dim offset 8, sequence offset 8*3*4*136 = 13056 (both multiples of 8),
  -- row strides 136 elements = 272 bytes (a multiple of 16).
  gpu_it("strided packed buffer (a 16-byte aligned slice of a larger buffer), d=128", function()
    local big = R({ 2, 200, 3, 4, 136 }, "bf16")
    local qkv = big:narrow(5, 9, 128):narrow(2, 9, 180)
    assert.equal(13064, qkv:storage_offset())
    compare({ qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal" }, "bf16")
  end)

  gpu_it("an unaligned slice (offset 13060 elements = 26120 bytes) is declined by fused, served elsewhere", function()
    local big = R({ 2, 200, 3, 4, 136 }, "bf16")
    local qkv = big:narrow(5, 5, 128):narrow(2, 9, 180)
    local a = { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal" }
    local text, chosen = al.attention.explain(a)
    assert(text:find("fused%s+no: q: its first element is not 16%-byte aligned %(offset 13060 elements%)"), text)
    assert(chosen ~= nil and chosen ~= "fused" and chosen ~= "cpu", "chosen: " .. tostring(chosen) .. "\n" .. text)
    a.backend = "fused"
    local ok, err = pcall(al.attention.forward, a)
    assert.is_false(ok)
    assert(tostring(err):find("forced backend 'fused' cannot serve this call", 1, true), tostring(err))
    assert(tostring(err):find("16-byte aligned", 1, true), tostring(err))
    -- the automatic choice serves it, forward and backward, like the CPU oracle
    compare(a, "bf16", "auto")
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

  -- Dropout, probed directly (cuDNN's Philox stream is not the CPU's, so no CPU comparison applies).
  -- With s_kv = d and V[b,j,g,:] = e_j (one-hot; q and k stay random), out[b,i,h,j] is exactly the
  -- (dropped, rescaled) probability Pd[b,h,i,j] = P[b,h,i,j] * keep[b,h,i,j] / (1-p): the mask can be
  -- read off the output. P comes from the same call without dropout. Checked:
  --   forward   every entry is 0 (dropped) or P/(1-p) (kept); the keep rate is 1-p (5 sigma);
  --             masked (future) entries stay 0; same seed and offset -> bit-identical output, another
  --             seed or another offset -> another mask
  --   backward  dV[b,j,g,:] = sum_{h in g} sum_i Pd[b,h,i,j] dO[b,i,h,:] with the Pd read off the
  --             forward (the backward regenerates the forward's mask), and sum_j dK[b,j,g,:] = 0:
  --             softmax is invariant to adding one vector to every key, which holds only when the
  --             backward's dP mask matches the D = rowsum(dO*O) of the forward's O
  gpu_it("dropout: the mask read off the output (one-hot V), keep rate, scaling, and the backward on that mask", function()
    local b, s, h, hg, d, p = 2, 64, 4, 2, 64, 0.3
    local q, k = R({ b, s, h, d }, "f16"), R({ b, s, hg, d }, "f16")
    local v = al.zeros({ b, s, hg, d }, { dtype = "f16" })
    for j = 1, s do v:narrow(2, j, 1):narrow(4, j, 1):fill_(1) end
    v = v:cuda()
    local function fwd(dropout, seed, offset)
      local out, ctx = al.attention.forward({ query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd",
        attn_mask_type = "causal", attention_dropout = dropout, dropout_seed = seed, dropout_offset = offset,
        backend = "fused" })
      return out, ctx
    end
    local P = fwd(0, 0, 0):cpu():flat_values()
    local out, ctx = fwd(p, 11, 0)
    local Pd = out:cpu():flat_values()
    local function at(bb, i, hh, j) return ((bb * s + i) * h + hh) * d + j + 1 end   -- out is [b, s, h*d]
    local kept, decided = 0, 0
    for bb = 0, b - 1 do
      for i = 0, s - 1 do
        for hh = 0, h - 1 do
          for j = 0, s - 1 do
            local x, pj = Pd[at(bb, i, hh, j)], P[at(bb, i, hh, j)]
            if j > i then
              assert(x == 0 and pj == 0, string.format("masked entry b=%d i=%d h=%d j=%d: %g, %g", bb, i, hh, j, x, pj))
            elseif pj > 0 then
              decided = decided + 1
              if x ~= 0 then
                kept = kept + 1
                local want = pj / (1 - p)   -- each side rounded once to f16: 2 ulps of slack
                assert(math.abs(x - want) <= 2e-3 * want,
                  string.format("kept entry b=%d i=%d h=%d j=%d: %g, want P/(1-p) = %g", bb, i, hh, j, x, want))
              end
            end
          end
        end
      end
    end
    assert(decided > 0.95 * b * h * s * (s + 1) / 2, "too many probabilities underflowed: " .. decided)
    local rate, sigma = kept / decided, math.sqrt(p * (1 - p) / decided)
    assert(math.abs(rate - (1 - p)) < 5 * sigma,
      string.format("keep rate %.4f, want %.2f +- %.4f (5 sigma)", rate, 1 - p, 5 * sigma))

    local function same(x, y) return al.allclose(x:cpu():float(), y:cpu():float(), { atol = 0, rtol = 0 }) end
    assert(same(out, fwd(p, 11, 0)), "same seed and offset gave another output")
    assert(not same(out, fwd(p, 12, 0)), "another seed gave the same output")
    assert(not same(out, fwd(p, 11, 1000)), "another offset gave the same output")

    local dout = R(out:size(), "f16")
    local g = al.attention.backward(ctx, dout)
    local g2 = al.attention.backward(ctx, dout)
    assert(same(g.value_layer, g2.value_layer) and same(g.key_layer, g2.key_layer), "backward not reproducible")
    local o = dout:cpu():flat_values()
    local dv = g.value_layer:cpu():flat_values()
    local group = h / hg
    local num, den = 0, 0
    for bb = 0, b - 1 do
      for j = 0, s - 1 do
        for gg = 0, hg - 1 do
          for e = 0, d - 1 do
            local want = 0
            for hh = gg * group, (gg + 1) * group - 1 do
              for i = j, s - 1 do want = want + Pd[at(bb, i, hh, j)] * o[at(bb, i, hh, e)] end
            end
            local got = dv[((bb * s + j) * hg + gg) * d + e + 1]
            assert(math.abs(got - want) <= TOL.f16.grad * (1 + math.abs(want)),
              string.format("dV b=%d j=%d g=%d e=%d: %g, want %g from the forward's mask", bb, j, gg, e, got, want))
            num, den = num + (got - want) ^ 2, den + want ^ 2
          end
        end
      end
    end
    assert(math.sqrt(num) <= 5e-3 * math.sqrt(den), "dV: relative norm error " .. math.sqrt(num / den))
    local dk = g.key_layer:cpu():flat_values()
    local ksum, knorm = 0, 0
    for bb = 0, b - 1 do
      for gg = 0, hg - 1 do
        for e = 0, d - 1 do
          local acc = 0
          for j = 0, s - 1 do
            local x = dk[((bb * s + j) * hg + gg) * d + e + 1]
            acc, knorm = acc + x, knorm + x * x
          end
          ksum = ksum + acc * acc
        end
      end
    end
    -- a consistent mask leaves only rounding (~1e-3 of the norm); a mask differing between the
    -- forward's O and the backward's dP leaves row sums of dS of the order of dS itself (~0.5)
    assert(math.sqrt(ksum) <= 2e-2 * math.sqrt(knorm),
      string.format("sum over keys of dK is %.3g of |dK| (want ~0): the backward's mask is not the forward's",
        math.sqrt(ksum / knorm)))
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
