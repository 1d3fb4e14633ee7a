-- The fused backend's FP8 path (cuDNN's FP8 SDPA, src/cuda/attn_fused_fp8.cu) against the CPU FP8
-- emulation (the oracle: same inputs, same recipe state, so the same scales) and against bf16
-- attention (RMSE / value range < 0.11, TE's bar): outputs, LSE, every gradient, the amaxes the
-- kernel reports (S, O, dO, dP, dQKV), packed qkv_layer / kv_layer buffers read with their real
-- strides, GQA, current scaling (two cuDNN runs), the plan cache, and explain's verdicts (served at
-- d=128; forward-only note at d=96; declines with reasons for d=72, dropout, padding, ALiBi,
-- per-token and MXFP8 recipes). GPU blocks are tagged #gpu and need Hopper (sm_90+); the measured
-- numbers are printed at the end. One CPU block checks the explain text without a GPU.
local al = require "attnlab"

local function gpu_it(name, fn)   -- (sm_90+: tests/spec/helper.lua's hopper_missing)
  local why = hopper_missing()
  if why then pending(name .. " (" .. why .. ")") else it(name, fn) end
end

-- RMSE of (a - ref) over the value range of ref
local function rel_rmse(a, ref)
  local r = ref:cpu():to("f64")
  local d = a:cpu():to("f64") - r
  local rmse = math.sqrt((d * d):mean():item())
  return rmse / (r:max() - r:min())
end
local function rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-30) end

local log = {}
local function note(fmt, ...) log[#log + 1] = string.format(fmt, ...) end

local function cpu_args(a)
  local c = {}
  for k, v in pairs(a) do
    if al.is_tensor(v) then c[k] = v:cpu() else c[k] = v end
  end
  return c
end

-- args (cuda tensors, no recipe): `steps` forward+backward steps on fused FP8 and on the CPU emulation
-- from one recipe state, plus the bf16 reference on the GPU. Returns a table of everything.
local function run(name, args, make_recipe, opts)
  opts = opts or {}
  local steps = opts.steps or 2
  local rg = make_recipe()
  local rc = rg:clone()
  local ga, ca = {}, cpu_args(args)
  for k, v in pairs(args) do ga[k] = v end
  ga.backend, ga.fp8_recipe = "fused", rg
  ca.backend, ca.fp8_recipe = "cpu", rc
  local out, ctx, cout, cctx, g, cg
  local dout
  for _ = 1, steps do
    out, ctx = al.attention.forward(ga)
    cout, cctx = al.attention.forward(ca)
    if not opts.no_backward then
      if not dout then dout = al.randn(out:size(), { dtype = out:dtype() }):cuda() end
      g = al.attention.backward(ctx, dout)
      cg = al.attention.backward(cctx, dout:cpu())
    end
  end
  rg:settle()   -- a forward-only run leaves the last step's amaxes deferred (al_attn_fp8.amax_deferred)
  local ra = {}
  for k, v in pairs(args) do ra[k] = v end
  ra.backend = "fused"
  local ref, rctx = al.attention.forward(ra)
  local rgr = (not opts.no_backward) and al.attention.backward(rctx, dout) or nil
  local res = { out = out, cout = cout, ref = ref, ctx = ctx, cctx = cctx, g = g, cg = cg, rg = rgr,
    f = ctx.fp8.f, cf = cctx.fp8.f }
  res.e_emul = rel_rmse(out, cout)
  res.e_bf16 = rel_rmse(out, ref)
  note("%-34s out: vs emulation %.4f, vs bf16 %.4f (emulation vs bf16 %.4f); amax S %.4g/%.4g O %.4g/%.4g",
    name, res.e_emul, res.e_bf16, rel_rmse(cout, ref:cpu()), res.f.amax[1], res.cf.amax[1], res.f.amax[2], res.cf.amax[2])
  if g then
    for k, v in pairs(cg) do
      local e1, e2 = rel_rmse(g[k], v), rel_rmse(g[k], rgr[k])
      note("%-34s grad %-12s vs emulation %.4f, vs bf16 %.4f (emulation vs bf16 %.4f)", name, k, e1, e2, rel_rmse(v, rgr[k]:cpu()))
      res["ge_" .. k] = { e1, e2 }
    end
    note("%-34s amax dO %.5g/%.5g dP %.5g/%.5g dQKV %.5g/%.5g", name, res.f.amax[3], res.cf.amax[3], res.f.amax[4],
      res.cf.amax[4], res.f.amax[5], res.cf.amax[5])
  end
  return res
end

-- the assertions every configuration must pass
local function check(res, causal)
  assert.are.equal(res.cout:dtype(), res.out:dtype())
  assert.is_true(res.e_emul < 0.03, "fused FP8 vs the emulation, RMSE/range " .. res.e_emul)
  assert.is_true(res.e_bf16 < 0.11, "fused FP8 vs bf16, RMSE/range " .. res.e_bf16)
  assert.is_true(res.e_bf16 > 0, "FP8 must differ from bf16 (the FP8 path ran)")
  assert.is_true(al.allclose(res.ctx.lse:cpu():float(), res.cctx.lse:float(), { atol = 2e-3, rtol = 2e-3 }), "lse")
  -- S: causal rows 0 hold one element (P = 1 exactly); otherwise cuDNN may report the normalised
  -- maximum (= the emulation's) or the flash kernel's unnormalised one (1): anything else is wrong
  local s, cs = res.f.amax[1], res.cf.amax[1]
  if causal then assert.is_true(math.abs(s - 1) < 1e-6 and math.abs(cs - 1) < 1e-6, "amax_S " .. s .. " / " .. cs)
  else assert.is_true(s >= 0.95 * cs and s <= 1 + 1e-6, "amax_S " .. s .. " vs emulation " .. cs) end
  assert.is_true(rel(res.f.amax[2], res.cf.amax[2]) < 0.05, "amax_O " .. res.f.amax[2] .. " vs " .. res.cf.amax[2])
  -- S scales come from step 1's amax_S: identical when causal (both 1), else as close as the amaxes
  if causal then assert.are.equal(res.cf.scale_used[1], res.f.scale_used[1]) end
  assert.is_true(rel(res.f.scale_used[2], res.cf.scale_used[2]) < 0.05, "O scale")
  if res.g then
    local n = 0
    for k, e in pairs(res) do
      if type(k) == "string" and k:sub(1, 3) == "ge_" then
        assert.is_true(e[1] < 0.05, k .. " vs emulation " .. e[1])
        assert.is_true(e[2] < 0.11, k .. " vs bf16 " .. e[2])
        n = n + 1
      end
    end
    assert.is_true(n >= 1)
    assert.are.equal(res.cf.amax[3], res.f.amax[3])   -- dO: the same tensor, the same amax
    assert.is_true(rel(res.f.amax[4], res.cf.amax[4]) < 0.1, "amax_dP " .. res.f.amax[4] .. " vs " .. res.cf.amax[4])
    assert.is_true(rel(res.f.amax[5], res.cf.amax[5]) < 0.1, "amax_dQKV " .. res.f.amax[5] .. " vs " .. res.cf.amax[5])
    assert.is_true(rel(res.f.scale_used[4], res.cf.scale_used[4]) < 0.1, "dP scale (from step 1's amax_dP)")
  end
end

local function R(shape) return al.randn(shape, { dtype = "bf16" }):cuda() end
-- (the state on the host: these cases check the amaxes and scales each call reports in al_attn_fp8, which the
-- device-state path leaves on the device; that path is fp8_device_scaling_spec's, against this one)
local DS = function() return al.fp8.DelayedScaling{ amax_history_len = 4, device_scaling = false } end

describe("fp8 fused (cuDNN FP8 SDPA) vs the CPU emulation #gpu", function()
  before_each(function() al.manual_seed(41) end)
  teardown(function()
    io.stderr:write("\n[fp8 fused] RMSE / range (TE's bar vs bf16: < 0.11); amax fused/emulation\n")
    for _, l in ipairs(log) do io.stderr:write("  " .. l .. "\n") end
  end)

  for _, mask in ipairs({ "causal", "no_mask" }) do
    gpu_it("bshd separate q/k/v d=128 " .. mask .. ": forward, LSE, gradients and amaxes", function()
      local res = run("bshd d=128 " .. mask, { query_layer = R({ 2, 256, 4, 128 }), key_layer = R({ 2, 256, 4, 128 }),
        value_layer = R({ 2, 256, 4, 128 }), qkv_format = "bshd", attn_mask_type = mask }, DS)
      check(res, mask == "causal")
    end)
  end

  gpu_it("packed qkv_layer bs3hd (one FP8 buffer, q/k/v read with its strides) and its packed gradient", function()
    local qkv = R({ 2, 192, 3, 4, 128 })
    local res = run("bs3hd packed causal", { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd",
      attn_mask_type = "causal" }, DS)
    check(res, true)
    local q8 = res.ctx.refs.q8
    assert.are.same({ 192 * 3 * 4 * 128, 3 * 4 * 128, 128, 1 }, q8:stride())   -- a view of the packed buffer
    assert.are.same(qkv:size(), res.g.qkv_layer:size())
  end)

  gpu_it("packed sbh3d (sbhd, interleave dim -2) no_mask", function()
    local res = run("sbh3d packed no_mask", { qkv_layer = R({ 160, 2, 4, 3, 128 }), qkv_interleave_dim = -2,
      qkv_format = "sbhd", attn_mask_type = "no_mask" }, DS)
    check(res, false)
  end)

  gpu_it("GQA (h=4, hg=2) through kv_layer bs2hd, forward and backward", function()
    local res = run("GQA bshd_bs2hd causal", { query_layer = R({ 2, 128, 4, 128 }), kv_layer = R({ 2, 128, 2, 2, 128 }),
      qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal" }, DS)
    check(res, true)
  end)

  gpu_it("CurrentScaling: O and dQKV current (two cuDNN runs each), S and dP delayed", function()
    local res = run("CurrentScaling bshd causal", { query_layer = R({ 2, 128, 4, 128 }), key_layer = R({ 2, 128, 4, 128 }),
      value_layer = R({ 2, 128, 4, 128 }), qkv_format = "bshd", attn_mask_type = "causal" },
      function() return al.fp8.CurrentScaling{} end)
    check(res, true)
    -- current O: fp8_max / amax_O of this very call
    assert.is_true(rel(res.f.scale_used[2], 448 / res.f.amax[2]) < 1e-6, "current O scale")
    assert.is_true(rel(res.f.scale_used[5], 57344 / res.f.amax[5]) < 1e-6, "current dQKV scale (E5M2, HYBRID)")
  end)

  gpu_it("d=64 forward is served (backward forced onto fused needs d=128 on Hopper: a clear error)", function()
    local args = { query_layer = R({ 1, 128, 2, 64 }), key_layer = R({ 1, 128, 2, 64 }), value_layer = R({ 1, 128, 2, 64 }),
      qkv_format = "bshd", attn_mask_type = "causal" }
    local res = run("bshd d=64 causal (forward only)", args, DS, { no_backward = true })
    check(res, true)
    local ok, err = pcall(al.attention.backward, res.ctx, al.randn(res.out:size(), { dtype = "bf16" }):cuda())
    if al.cuda.device_info(0).capability[1] == 9 then
      assert.is_false(ok)
      assert.truthy(tostring(err):find("needs d_qk = d_v = 128", 1, true), tostring(err))
    end
  end)

  gpu_it("plan cache: a repeated call builds no new FP8 plan", function()
    local function fp8_builds()
      return tonumber(al.cuda.backend_info("fused"):match("fp8_builds=(%d+)"))
    end
    local args = { qkv_layer = R({ 1, 128, 3, 2, 128 }), qkv_format = "bshd", fp8_recipe = DS(), backend = "fused" }
    al.attention.forward(args)
    local n0 = fp8_builds()
    assert.is_true(n0 >= 1)
    al.attention.forward(args)
    al.attention.forward(args)
    assert.are.equal(n0, fp8_builds())
  end)
end)

describe("fp8 fused: deferred amaxes (no stream sync in the call) #gpu", function()
  local T = require "attnlab.tensor"
  local C = require("attnlab.ffi").C
  local function isnan(x) return x ~= x end

  gpu_it("the C call returns with amaxes pending; settle gives exactly the synchronous call's amaxes", function()
    al.manual_seed(7)
    local args = { query_layer = R({ 2, 256, 4, 128 }), key_layer = R({ 2, 256, 4, 128 }), value_layer = R({ 2, 256, 4, 128 }),
      qkv_format = "bshd", attn_mask_type = "no_mask", backend = "fused", fp8_recipe = DS() }
    local _, ctx = al.attention.forward(args)
    local p, inp = ctx.params, ctx.inputs
    local f = inp.fp8
    local function call()
      local o, l = T.new(), T.new()
      T.check(C.al_attn_forward(p, inp, o.raw, l.raw, nil), "al_attn_forward")
      return o
    end
    f.amax_deferred = 0
    local o_sync = call()
    assert.is_true(f.pending == nil)
    local s_sync, o_amax_sync = f.amax[1], f.amax[2]
    assert.is_true(s_sync > 0 and o_amax_sync > 0)
    f.amax_deferred = 1
    local o_def = call()
    assert.is_true(f.pending ~= nil, "the fused forward with every scale given defers its amaxes")
    assert.is_true(isnan(f.amax[1]) and isnan(f.amax[2]), "amax is NaN until settled")
    C.al_attn_fp8_settle(f)
    assert.is_true(f.pending == nil)
    assert.are.equal(s_sync, f.amax[1])
    assert.are.equal(o_amax_sync, f.amax[2])
    assert.are.equal(0, (o_def:float() - o_sync:float()):abs():max())   -- the same output, bit for bit
    -- a second call supersedes an unsettled one (its record is dropped, not waited for)
    call()
    call()
    C.al_attn_fp8_settle(f)
    assert.are.equal(s_sync, f.amax[1])
    assert.are.equal(o_amax_sync, f.amax[2])
    C.al_attn_fp8_settle(f)   -- nothing pending: a no-op
    assert.are.equal(s_sync, f.amax[1])

    -- the backward (every scale given: delayed dO, dP, dQKV) defers dO, dP and dQKV the same way
    local o, l = T.new(), T.new()
    f.amax_deferred = 0
    T.check(C.al_attn_forward(p, inp, o.raw, l.raw, nil), "al_attn_forward")
    local dout = R({ 2, 256, 4, 128 })
    local function bwd()
      local g = {}
      for i = 1, 3 do g[i] = al.empty({ 2, 256, 4, 128 }, { dtype = "bf16", device = "cuda" }) end
      T.check(C.al_attn_backward(p, inp, o.raw, dout.raw, l.raw, g[1].raw, g[2].raw, g[3].raw, nil, nil), "al_attn_backward")
      return g
    end
    local g_sync = bwd()
    assert.is_true(f.pending == nil)
    local a_sync = { f.amax[3], f.amax[4], f.amax[5] }
    for i = 1, 3 do assert.is_true(a_sync[i] > 0, "amax " .. (i + 2)) end
    f.amax_deferred = 1
    local g_def = bwd()
    assert.is_true(f.pending ~= nil, "the FP8 backward with every scale given defers its amaxes")
    assert.is_true(isnan(f.amax[3]) and isnan(f.amax[4]) and isnan(f.amax[5]))
    C.al_attn_fp8_settle(f)
    assert.are.equal(a_sync[1], f.amax[3])                      -- amax(dO): the same tensor
    assert.is_true(rel(f.amax[4], a_sync[2]) < 1e-6, "amax dP " .. f.amax[4] .. " vs " .. a_sync[2])
    assert.is_true(rel(f.amax[5], a_sync[3]) < 1e-2, "amax dQKV " .. f.amax[5] .. " vs " .. a_sync[3])  -- (dQ: atomics)
    for i = 1, 3 do assert.is_true(rel_rmse(g_def[i], g_sync[i]) < 1e-3, "gradient " .. i) end
    -- a forward on f while a backward is pending settles it (other slots), it does not drop it
    bwd()
    local o2, l2 = T.new(), T.new()
    T.check(C.al_attn_forward(p, inp, o2.raw, l2.raw, nil), "al_attn_forward")
    assert.are.equal(a_sync[1], f.amax[3])
    C.al_attn_fp8_settle(f)
    assert.are.equal(s_sync, f.amax[1])
  end)

  gpu_it("a recipe records deferred amaxes in order: the same state as settling after every step", function()
    al.manual_seed(8)
    local q, k, v = R({ 1, 192, 2, 128 }), R({ 1, 192, 2, 128 }), R({ 1, 192, 2, 128 })
    local dout = R({ 1, 192, 2 * 128 })
    local function steps(r, settle_each)
      for i = 1, 4 do
        local args = { query_layer = q * (1 + i / 4), key_layer = k, value_layer = v * (1 + i / 8), qkv_format = "bshd",
          attn_mask_type = "causal", backend = "fused", fp8_recipe = r }
        local _, ctx = al.attention.forward(args)
        if settle_each then r:settle() end
        if i % 2 == 0 then   -- a backward every other step (dO grows: the dO history must come out in order)
          al.attention.backward(ctx, dout * (i / 2))
          if settle_each then r:settle() end
        end
      end
      return r:state()
    end
    local a = steps(DS(), false)
    local b = steps(DS(), true)
    for _, slot in ipairs({ "qkv", "s", "o" }) do
      assert.are.equal(4, #a[slot].amax_history, slot)
      for i = 1, 4 do assert.is_false(isnan(a[slot].amax_history[i]), slot .. " history entry " .. i) end
      assert.are.same(b[slot].amax_history, a[slot].amax_history, slot)
      assert.are.equal(b[slot].scale, a[slot].scale, slot)
    end
    assert.are.equal(4, a.steps)
    -- the O history grows with V's scale (x1.25, 1.5, 1.75, 2): the steps were recorded in order
    for i = 2, 4 do assert.is_true(a.o.amax_history[i] > a.o.amax_history[i - 1], "O amax order") end
    assert.are.equal(2, #a["do"].amax_history)
    assert.are.same(b["do"].amax_history, a["do"].amax_history)
    assert.are.equal(2 * a["do"].amax_history[1], a["do"].amax_history[2])   -- dout, then 2 dout: in order
    assert.are.same(b.dp.amax_history, a.dp.amax_history)
    assert.are.equal(b.dp.scale, a.dp.scale)
    for i = 1, 2 do assert.is_true(rel(a.dqkv.amax_history[i], b.dqkv.amax_history[i]) < 1e-2, "dQKV history") end
  end)
end)

describe("fp8 fused: the same call gives the same output #gpu", function()
  -- Session 30 (H100, cuDNN 9.14.0): it did not, while the bf16 fused forward is bit-identical run to run
  -- (docs/FP8.md, "Open problem"; scripts/fp8_repeat_probe.lua prints the cases). The first step of a recipe (every
  -- scale 1) and the step after it, from clones of one state each time, with the emulation as the witness.
  gpu_it("first and second steps of a recipe, causal: three repeats agree, and agree with the emulation", function()
    al.manual_seed(31)
    local args = { query_layer = R({ 2, 128, 4, 64 }), key_layer = R({ 2, 128, 4, 64 }), value_layer = R({ 2, 128, 4, 64 }),
      qkv_format = "bshd", attn_mask_type = "causal", backend = "fused" }
    local r = DS()
    for step = 1, 2 do
      local outs = {}
      for i = 1, 3 do
        args.fp8_recipe = r:clone()
        outs[i] = al.attention.forward(args):float():cpu()
      end
      for i = 2, 3 do
        local d = (outs[i] - outs[1]):abs():max()
        assert.is_true(d == 0, string.format("step %d: repeat %d differs from the first by up to %g", step, i, d))
      end
      local e = cpu_args(args)
      e.backend, e.fp8_recipe = "cpu", r:clone()
      local err = rel_rmse(outs[1], al.attention.forward(e):float())
      assert.is_true(err < 0.03, string.format("step %d: RMSE/range vs the emulation %g", step, err))
      args.fp8_recipe = r
      al.attention.forward(args)   -- the step itself, on the recipe the clones come from
      r:settle()
    end
  end)
end)

describe("fp8 fused: fp8_output (O returned as its FP8 codes) #gpu", function()
  gpu_it("the codes decode to the dequantised output; the backward from them gives the same gradients", function()
    al.manual_seed(12)
    local qkv = R({ 2, 256, 3, 4, 128 })
    local r = DS()
    al.attention.forward{ qkv_layer = qkv, backend = "fused", fp8_recipe = r }
    local ra, rb, rc = r:clone(), r:clone(), r:clone()
    local oa, ca = al.attention.forward{ qkv_layer = qkv, backend = "fused", fp8_recipe = ra, attn_mask_type = "causal" }
    -- the CPU emulation from the same recipe state: an independent witness of which side is wrong, if one is
    local oc = al.attention.forward{ qkv_layer = qkv:cpu(), backend = "cpu", fp8_recipe = rc, attn_mask_type = "causal" }
    local ob, cb = al.attention.forward{ qkv_layer = qkv, backend = "fused", fp8_recipe = rb, attn_mask_type = "causal",
      fp8_output = true }
    assert.are.equal("fp8_e4m3", ob.data:dtype())
    assert.are.equal("cuda:0", ob.data:device())
    -- the fused path dequantises with the f32 scale cuDNN used; the wrap's scale is the double: 1 ulp apart at most
    local deq, ref = ob:dequantize("f32"):cpu(), oa:float():cpu()
    local d = (deq - ref):abs():max()
    if not (d <= 1e-2 * ref:abs():max()) then -- luacheck: ignore 581 (a NaN d must fail too)
      -- (tensors have no t[i]: the elements as Lua numbers, 1-based)
      local df, rf, w = deq:flat_values(), ref:flat_values(), {}
      for i = 1, 4 do w[#w + 1] = string.format("%.4g/%.4g", df[i], rf[i]) end
      local worst = 1
      for i = 1, #df do
        if not (math.abs(df[i] - rf[i]) <= math.abs(df[worst] - rf[worst])) then worst = i end
      end
      error(string.format("dequantised codes vs bf16 output: max diff %g at %d (%g vs %g); max|ref| %g, max|deq| %g; " ..
        "RMSE/range vs the CPU emulation: codes %.4f, bf16 output %.4f; wrap scale %.9g, scale_used[O] %.9g / %.9g; first %s",
        d, worst, df[worst], rf[worst], ref:abs():max(), deq:abs():max(), rel_rmse(deq, oc:float()), rel_rmse(ref, oc:float()),
        ob.scale, ca.fp8.f.scale_used[2], cb.fp8.f.scale_used[2], table.concat(w, " ")))
    end
    assert.is_true(rel_rmse(deq, oc:float()) < 0.03, "codes vs the CPU emulation")
    local dout = R(oa:size())
    local ga, gb = al.attention.backward(ca, dout), al.attention.backward(cb, dout)
    assert.is_true(rel_rmse(gb.qkv_layer, ga.qkv_layer) < 1e-3, "gradients from the codes vs from the bf16 output")
    rb:settle(); ra:settle()
    assert.are.same(ra:state().o.amax_history, rb:state().o.amax_history)
  end)
end)

describe("fp8 fused explain #gpu", function()
  -- The FP8 graphs serve by default; ATTNLAB_FUSED_FP8=0 switches automatic selection off (attn_fused.cu).
  local function ex(args)
    local text, name = al.attention.explain(args)
    return text, name
  end
  local function base(d, extra)
    local a = { qkv_layer = R({ 2, 128, 3, 2, d }), qkv_format = "bshd", fp8_recipe = al.fp8.DelayedScaling{} }
    for k, v in pairs(extra or {}) do a[k] = v end
    return a
  end

  gpu_it("ATTNLAB_FUSED_FP8=0: automatic selection does not pick the fused FP8 path, and says why", function()
    local text, name, forced_text, forced
    with_env("ATTNLAB_FUSED_FP8", "0", function()
      text, name = ex(base(128))
      forced_text, forced = ex(base(128, { backend = "fused" }))
    end)
    assert.are_not.equal("fused", name, text)
    assert.truthy(text:find("switched off by ATTNLAB_FUSED_FP8=0", 1, true), text)
    assert.are.equal("fused", forced, forced_text)
  end)

  gpu_it("d=128: fused serves FP8 with no caveat", function()
    local text, name = ex(base(128))
    assert.are.equal("fused", name, text)
    assert.truthy(text:find("fused    CHOSEN\n", 1, true), text)
  end)

  gpu_it("d=96: fused serves the forward and says the backward needs d=128 on Hopper", function()
    local text, name = ex(base(96))
    assert.are.equal("fused", name, text)
    if al.cuda.device_info(0).capability[1] == 9 then
      assert.truthy(text:find("FP8 forward only (the backward goes to the unfused backend's emulation): cuDNN's FP8 backward " ..
        "needs d_qk = d_v = 128", 1, true), text)
    end
  end)

  local declines = {
    { "d=72 (not a multiple of 16)", function() return base(72) end, "multiple of 16" },
    { "dropout", function() return base(128, { attention_dropout = 0.1 }) end, "dropout (p=0.1) with FP8 is declined" },
    { "ALiBi", function() return base(128, { core_attention_bias_type = "alibi", attn_mask_type = "causal" }) end, "no bias or ALiBi" },
    { "padding mask", function()
        local m = al.zeros({ 2, 1, 1, 128 }, { dtype = "bool" })
        m:narrow(4, 100, 29):fill_(1)
        return base(128, { attn_mask_type = "padding", attention_mask = m:cuda() })
      end, "padding masks are not served" },
    { "per-token current scaling", function() return base(128, { fp8_recipe = al.fp8.CurrentScaling{ granularity = "token" } }) end,
      "per-token descales" },
    { "MXFP8 recipe", function() return base(128, { fp8_recipe = al.fp8.MXFP8BlockScaling{} }) end, "not FP8 codes" },
  }
  for _, c in ipairs(declines) do
    gpu_it("declines " .. c[1] .. " with the reason", function()
      local text = ex(c[2]())
      local line = text:match("\n  fused    ([^\n]*)")
      assert.truthy(line, text)
      assert.truthy(line:find("^no: "), line)
      assert.truthy(line:find(c[3], 1, true), line)
    end)
  end
end)

describe("fp8: deferred amaxes on the cpu backend", function()
  local T = require "attnlab.tensor"
  local C = require("attnlab.ffi").C
  it("amax_deferred is a permission, not an order: the cpu emulation fills amax on return; settle is a no-op", function()
    al.manual_seed(9)
    local r = al.fp8.DelayedScaling{ amax_history_len = 2 }
    local args = { query_layer = al.randn({ 1, 40, 2, 16 }), key_layer = al.randn({ 1, 40, 2, 16 }),
      value_layer = al.randn({ 1, 40, 2, 16 }), qkv_format = "bshd", backend = "cpu", fp8_recipe = r }
    local _, ctx = al.attention.forward(args)
    local f = ctx.inputs.fp8
    assert.are.equal(1, f.amax_deferred)    -- the Lua front end always allows it
    local o, l = T.new(), T.new()
    T.check(C.al_attn_forward(ctx.params, ctx.inputs, o.raw, l.raw, nil), "al_attn_forward")
    assert.is_true(f.pending == nil)
    local a1, a2 = f.amax[1], f.amax[2]
    assert.is_true(a1 > 0 and a1 <= 1 and a2 > 0)
    C.al_attn_fp8_settle(f)
    C.al_attn_fp8_settle(nil)
    assert.are.equal(a1, f.amax[1])
    assert.are.equal(a2, f.amax[2])
    local st = r:state()
    assert.are.equal(1, #st.s.amax_history)
    assert.are.equal(1, st.steps)
  end)
end)

describe("fp8 fused: explain text without a GPU", function()
  it("the FP8 line names both paths; CPU tensors stay on the cpu emulation", function()
    local qkv = al.randn({ 2, 32, 3, 2, 16 }, { dtype = "bf16" })
    local text, name = al.attention.explain{ qkv_layer = qkv, qkv_format = "bshd", fp8_recipe = al.fp8.DelayedScaling{} }
    assert.are.equal("cpu", name)
    assert.truthy(text:find("the cpu and unfused backends emulate, the fused backend runs cuDNN's FP8 SDPA", 1, true), text)
    -- with the plugin loaded, the fused line says why CPU tensors are not its own
    if al.cuda.available() then assert.truthy(text:find("fused's FP8 path", 1, true) or text:find("FP8 path", 1, true), text) end
  end)
end)
