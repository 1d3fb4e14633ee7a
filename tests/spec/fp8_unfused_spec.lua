-- FP8 attention emulated on the GPU by the unfused backend (src/cuda/attn_unfused.cu, ua_forward_fp8 /
-- ua_backward_fp8; the S and dP slots inside src/cuda/attn_unfused_kernels.cu) against the CPU emulation, its
-- oracle: the same recipe state on both, then outputs, LSE, every gradient and every amax and scale the calls
-- report. The two differ only in f32 summation order and the exp's last bit, which can move a value across an
-- FP8 rounding boundary now and then, so values are compared by RMSE over the value range (1e-3) and the
-- amaxes within 1e-3. Covered: per-tensor delayed scaling on packed and separate inputs, causal and padding
-- masks, a sliding window (the S slot's key tiles start at the window's edge), ALiBi, GQA, current scaling (O
-- and dQKV), per-token scaling (the causal-safe recipe: cuDNN declines it), MXFP8 (fake-quantised float
-- inputs), dropout, fp8_output, thd. Tagged #gpu.
local al = require "attnlab"

local function gpu_it(name, fn)
  if al.cuda.available() then it(name, fn) else pending(name .. " (no GPU)") end
end

local function rel_rmse(a, ref)
  local r = ref:cpu():to("f64")
  local d = a:cpu():to("f64") - r
  local rmse = math.sqrt((d * d):mean():item())
  local range = r:max() - r:min()
  return range > 0 and rmse / range or rmse
end
local function rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-30) end

local function on(args, dev)
  local c = {}
  for k, v in pairs(args) do
    if al.is_tensor(v) then c[k] = dev == "cpu" and v:cpu() or v:cuda() else c[k] = v end
  end
  return c
end

-- two steps (the second with the scales the first's amaxes set) on the unfused backend and on the CPU
local function compare(name, args, make_recipe, opts)
  opts = opts or {}
  local rg = make_recipe()
  local rc = rg:clone()
  local ga, ca = on(args, "cuda"), on(args, "cpu")
  ga.backend, ga.fp8_recipe = "unfused", rg
  ca.backend, ca.fp8_recipe = "cpu", rc
  local out, ctx, cout, cctx, g, cg
  for _ = 1, 2 do
    out, ctx = al.attention.forward(ga)
    cout, cctx = al.attention.forward(ca)
    if not opts.no_backward then
      local dout = al.randn(al.is_tensor(out) and out:size() or out.data:size(), { dtype = "f32" })
      g = al.attention.backward(ctx, dout:cuda())
      cg = al.attention.backward(cctx, dout)
    end
  end
  local f, cf = ctx.fp8.f, cctx.fp8.f
  if al.is_tensor(out) then
    assert.are.equal(cout:dtype(), out:dtype())
    assert.is_true(rel_rmse(out, cout) < 1e-3, name .. ": output RMSE/range " .. rel_rmse(out, cout))
  else   -- fp8_output: the codes, decoded with their scales
    assert.are.equal(cout.scale, out.scale)
    assert.is_true(rel_rmse(out:dequantize(), cout:dequantize()) < 1e-3, name .. ": fp8_output codes")
  end
  -- (rows with nothing to see hold -inf on both sides: compared as 0)
  local function finite(t)
    local c = t:cpu():to("f64")
    return al.where(c:gt(-1e300), c, al.zeros(c:size(), { dtype = "f64" }))
  end
  assert.is_true(rel_rmse(finite(ctx.lse), finite(cctx.lse)) < 1e-5, name .. ": lse")
  local slots = opts.no_backward and { 1, 2 } or { 1, 2, 3, 4, 5 }
  for _, i in ipairs(slots) do
    assert.is_true(rel(f.amax[i], cf.amax[i]) < 1e-3, name .. ": amax slot " .. i .. " " .. f.amax[i] .. " vs " .. cf.amax[i])
    assert.is_true(rel(f.scale_used[i], cf.scale_used[i]) < 1e-3 or f.scale_used[i] == cf.scale_used[i],
      name .. ": scale slot " .. i)
  end
  if g then
    local n = 0
    for k, v in pairs(cg) do
      if al.is_tensor(v) then
        local e = rel_rmse(g[k], v)
        assert.is_true(e < 1e-3, name .. ": gradient " .. k .. " RMSE/range " .. e)
        n = n + 1
      end
    end
    assert.is_true(n >= 1)
  end
  -- the two recipes recorded the same histories
  local sa, sb = rg:state(), rc:state()
  for _, slot in ipairs(al.fp8.SLOTS) do
    assert.are.equal(#sb[slot].amax_history, #sa[slot].amax_history, name .. " " .. slot)
  end
  return ctx, cctx
end

local function R(shape) return al.randn(shape) end
local DS = function() return al.fp8.DelayedScaling{ amax_history_len = 4, device_scaling = false } end

describe("fp8 on the unfused backend (GPU emulation) vs the cpu emulation #gpu", function()
  gpu_it("delayed scaling, packed qkv_layer bs3hd causal, and the device-state recipe", function()
    al.manual_seed(21)
    local a = { qkv_layer = R({ 2, 150, 3, 2, 32 }), qkv_format = "bshd", attn_mask_type = "causal" }
    compare("packed causal", a, DS)
    compare("packed causal, state on the device", a, function() return al.fp8.DelayedScaling{ amax_history_len = 4 } end)
  end)

  gpu_it("separate q/k/v with GQA (h 4, hg 2), no mask, 300 keys (three S-slot key tiles)", function()
    al.manual_seed(22)
    compare("gqa", { query_layer = R({ 1, 200, 4, 32 }), key_layer = R({ 1, 300, 2, 32 }), value_layer = R({ 1, 300, 2, 32 }),
      qkv_format = "bshd", attn_mask_type = "no_mask" }, DS)
  end)

  gpu_it("a sliding window (the S slot's key tiles start at the window's left edge) and ALiBi", function()
    al.manual_seed(23)
    local a = { qkv_layer = R({ 1, 400, 3, 2, 32 }), qkv_format = "bshd", attn_mask_type = "causal", window_size = { 150, 0 } }
    compare("window", a, DS)
    local b = { qkv_layer = R({ 1, 130, 3, 2, 32 }), qkv_format = "bshd", attn_mask_type = "causal",
      core_attention_bias_type = "alibi" }
    compare("alibi", b, DS)
  end)

  gpu_it("CurrentScaling (O and dQKV current) and per-token scaling (cuDNN declines it: the unfused backend serves it)", function()
    al.manual_seed(24)
    local a = { qkv_layer = R({ 2, 96, 3, 2, 32 }), qkv_format = "bshd", attn_mask_type = "causal" }
    compare("current", a, function() return al.fp8.CurrentScaling{} end)
    compare("per token", a, function() return al.fp8.CurrentScaling{ granularity = "token" } end)
    local text, name = al.attention.explain{ qkv_layer = a.qkv_layer:cuda(), qkv_format = "bshd", attn_mask_type = "causal",
      fp8_recipe = al.fp8.CurrentScaling{ granularity = "token" } }
    assert.are.equal("unfused", name, text)
  end)

  gpu_it("MXFP8 (fake-quantised float inputs), padding mask, and dropout", function()
    al.manual_seed(25)
    compare("mxfp8", { qkv_layer = R({ 1, 64, 3, 2, 64 }), qkv_format = "bshd" }, function() return al.fp8.MXFP8BlockScaling{} end)
    local m = al.zeros({ 2, 1, 1, 80 }, { dtype = "bool" })
    m:narrow(4, 61, 20):fill_(1)
    compare("padding", { qkv_layer = R({ 2, 80, 3, 2, 32 }), qkv_format = "bshd", attn_mask_type = "padding", attention_mask = m }, DS)
    compare("dropout", { qkv_layer = R({ 1, 64, 3, 2, 32 }), qkv_format = "bshd", attention_dropout = 0.2, dropout_seed = 5, dropout_offset = 0 }, DS)
  end)

  gpu_it("fp8_output: the codes and their scale; the backward from them", function()
    al.manual_seed(26)
    compare("fp8_output", { qkv_layer = R({ 1, 70, 3, 2, 32 }), qkv_format = "bshd", attn_mask_type = "causal", fp8_output = true }, DS)
  end)

  gpu_it("thd with two sequences of different lengths", function()
    al.manual_seed(27)
    local cu = al.tensor({ 0, 50, 130 }, { dtype = "i32" })
    compare("thd", { qkv_layer = R({ 130, 3, 2, 32 }), qkv_format = "thd", attn_mask_type = "padding_causal",
      cu_seqlens_q = cu, cu_seqlens_kv = cu, max_seqlen_q = 80, max_seqlen_kv = 80 }, DS)
  end)

  gpu_it("d=64 on Hopper: the forward runs on fused (cuDNN), the backward falls to the unfused emulation by itself", function()
    if al.cuda.device_info(0).capability[1] ~= 9 then pending("Hopper only") return end
    al.manual_seed(28)
    local qkv = al.randn({ 1, 128, 3, 2, 64 }, { dtype = "bf16" })
    local rg = DS()
    local rc = rg:clone()
    local out, ctx = al.attention.forward{ qkv_layer = qkv:cuda(), qkv_format = "bshd", attn_mask_type = "causal", fp8_recipe = rg }
    local cout, cctx = al.attention.forward{ qkv_layer = qkv, qkv_format = "bshd", attn_mask_type = "causal", fp8_recipe = rc }
    local dout = al.randn(out:size(), { dtype = "bf16" })
    local g = al.attention.backward(ctx, dout:cuda())
    local cg = al.attention.backward(cctx, dout)
    assert.is_true(rel_rmse(out, cout) < 0.03, "fused forward vs the emulation")
    local e = rel_rmse(g.qkv_layer, cg.qkv_layer)
    assert.is_true(e < 0.05, "gradients (unfused backward after a fused forward) vs the cpu: " .. e)
    local bt = al.attention.explain{ qkv_layer = qkv:cuda(), qkv_format = "bshd", attn_mask_type = "causal", fp8_recipe = DS() }
    assert.truthy(bt:find("fused    CHOSEN", 1, true), bt)
  end)

  gpu_it("softmax sinks with FP8: declined with the reason (the cpu backend emulates them)", function()
    local text = al.attention.explain{ qkv_layer = R({ 1, 16, 3, 2, 32 }):cuda(), qkv_format = "bshd", softmax_type = "off-by-one",
      fp8_recipe = DS() }
    local line = text:match("\n  unfused  ([^\n]*)")
    assert.truthy(line and line:find("FP8 with softmax sinks", 1, true), text)
  end)
end)
