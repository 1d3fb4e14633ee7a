-- Delayed scaling kept on the device (al_fp8_ds, src/fp8_delayed.c, numeric/fp8_delayed.h; the recipe side in
-- lua/attnlab/fp8.lua): a DelayedScaling recipe's amax histories and scales live beside the data, the quantise
-- kernels and the fused graph read the scales there and add their amaxes to accumulators, and an update after
-- each call folds them into the histories. The oracle is the host recipe (device_scaling = false), which must
-- give the same bits: outputs, gradients, histories and scales, over more steps than the history holds (the
-- ring wraps), for both built-in algos, with a margin, packed and separate inputs. The C API is checked against
-- a naive Lua formula, and its errors. GPU blocks (#gpu, Hopper) compare the fused FP8 path and the device
-- update / quantise kernels with the CPU.
local al = require "attnlab"
local lffi = require "attnlab.ffi"
local ffi, C = lffi.ffi, lffi.C

local function gpu_it(name, fn)   -- (sm_90+: tests/spec/helper.lua's hopper_missing)
  local why = hopper_missing()
  if why then pending(name .. " (" .. why .. ")") else it(name, fn) end
end

local function maxdiff(a, b) return (a:cpu():to("f64") - b:cpu():to("f64")):abs():max() end
local function isnan(x) return x ~= x end

-- `steps` forward + backward steps of one recipe over fresh random inputs (seeded: two runs see the same data);
-- the inputs of step i are scaled by i so that the amaxes and scales move. Returns the recipe, every output and
-- gradient, and the state.
local function train(make_recipe, opts)
  opts = opts or {}
  al.manual_seed(opts.seed or 11)
  local r = make_recipe()
  local dev = opts.device or "cpu"
  local dt = opts.dtype or "f32"
  local b, s, h, d = opts.b or 2, opts.s or 9, opts.h or 2, opts.d or 16
  local outs, grads = {}, {}
  for i = 1, opts.steps or 6 do
    local o = { dtype = dt, device = dev }
    local args = { qkv_format = "bshd", attn_mask_type = opts.mask or "causal", fp8_recipe = r, backend = opts.backend }
    if opts.packed then
      args.qkv_layer = al.randn({ b, s, 3, h, d }, o) * (0.5 * i)
    else
      args.query_layer = al.randn({ b, s, h, d }, o) * (0.5 * i)
      args.key_layer, args.value_layer = al.randn({ b, s, h, d }, o), al.randn({ b, s, h, d }, o) * (1 + i / 4)
    end
    local out, ctx = al.attention.forward(args)
    if opts.mid_state and i == 3 then r:state() end
    outs[i] = out
    grads[i] = al.attention.backward(ctx, al.randn({ b, s, h * d }, o) * i)
  end
  return r, outs, grads, r:state()
end

local function same_state(a, b, what)
  for _, slot in ipairs(al.fp8.SLOTS) do
    assert.are.equal(#b[slot].amax_history, #a[slot].amax_history, what .. " " .. slot .. " history length")
    for j = 1, #b[slot].amax_history do
      assert.are.equal(b[slot].amax_history[j], a[slot].amax_history[j], what .. " " .. slot .. " history " .. j)
    end
    assert.are.equal(b[slot].scale, a[slot].scale, what .. " " .. slot .. " scale")
    assert.are.equal(b[slot].last_amax, a[slot].last_amax, what .. " " .. slot .. " last amax")
    assert.are.equal(b[slot].last_scale, a[slot].last_scale, what .. " " .. slot .. " last scale")
  end
  assert.are.equal(b.steps, a.steps)
end

local function same_run(ra, rb, what)
  local _, oa, ga, sa = unpack(ra)
  local _, ob, gb, sb = unpack(rb)
  for i = 1, #ob do
    assert.are.equal(0, maxdiff(oa[i], ob[i]), what .. " output of step " .. i)
    for k, g in pairs(gb[i]) do assert.are.equal(0, maxdiff(ga[i][k], g), what .. " gradient " .. k .. " of step " .. i) end
  end
  same_state(sa, sb, what)
end

describe("fp8 delayed scaling on the device: the cpu state against the host recipe", function()
  for _, c in ipairs({
    { "max, history 3 (the ring wraps), separate q/k/v", { amax_history_len = 3 }, {} },
    { "most_recent, margin 1, packed qkv_layer", { amax_history_len = 2, amax_compute_algo = "most_recent", margin = 1 }, { packed = true } },
    { "E4M3, history 1, no mask", { amax_history_len = 1, fp8_format = "E4M3" }, { mask = "no_mask" } },
  }) do
    it(c[1] .. ": the same outputs, gradients, histories and scales bit for bit", function()
      local function mk(dsc) return function()
        local cfg = { device_scaling = dsc }
        for k, v in pairs(c[2]) do cfg[k] = v end
        return al.fp8.DelayedScaling(cfg)
      end end
      local dev = { train(mk(true), c[3]) }
      local host = { train(mk(false), c[3]) }
      assert.is_not_nil(rawget(dev[1], "_ds"), "the recipe keeps its state in an al_fp8_ds")
      assert.is_nil(rawget(host[1], "_ds"))
      same_run(dev, host, c[1])
      -- the histories really hold the steps (6 steps, history_len entries, newest last)
      local st = dev[4]
      assert.are.equal(c[2].amax_history_len, #st.qkv.amax_history)
      assert.is_true(st.qkv.scale ~= 1 and st.dqkv.scale ~= 1, "the scales moved")
    end)
  end

  it("r:state() in the middle of a run does not change the run", function()
    local a = { train(function() return al.fp8.DelayedScaling{ amax_history_len = 2 } end, { mid_state = true }) }
    local b = { train(function() return al.fp8.DelayedScaling{ amax_history_len = 2, device_scaling = false } end, {}) }
    same_run(a, b, "mid-run state()")
  end)

  it("clone() copies the state at that point; the clone and the original then go their own ways", function()
    local r = train(function() return al.fp8.DelayedScaling{ amax_history_len = 4 } end, { steps = 2 })
    local c = r:clone()
    assert.is_nil(rawget(c, "_ds"))
    same_state(c:state(), r:state(), "clone")
    local before = r:state().qkv.scale
    local q = al.randn({ 1, 5, 2, 16 }) * 100
    al.attention.forward{ query_layer = q, key_layer = q, value_layer = q, qkv_format = "bshd", fp8_recipe = c }
    assert.are.equal(before, r:state().qkv.scale, "the original did not move")
    assert.is_true(c:state().qkv.scale < before, "the clone's QKV scale followed the larger amax")
  end)

  it("reset() between a forward and its backward: the backward's amaxes land in the fresh host state", function()
    local r = al.fp8.DelayedScaling{ amax_history_len = 4 }
    local q = al.randn({ 1, 5, 2, 16 })
    local out, ctx = al.attention.forward{ query_layer = q, key_layer = q, value_layer = q, qkv_format = "bshd", fp8_recipe = r }
    r:reset()
    local dout = al.randn({ 1, 5, 32 })
    al.attention.backward(ctx, dout)
    local st = r:state()
    assert.are.equal(0, #st.qkv.amax_history)
    assert.are.equal(1, #st["do"].amax_history)
    assert.are.equal(al.fp8.amax(dout), st["do"].amax_history[1])
    assert.are.equal(out:size(1), 1)
  end)

  it("fp8_output: the FP8 tensor's scale (read from the device record on first use) is the host recipe's", function()
    local function one(dsc)
      al.manual_seed(5)
      local r = al.fp8.DelayedScaling{ amax_history_len = 2, device_scaling = dsc }
      local qkv = al.randn({ 1, 7, 3, 2, 16 })
      local o
      for _ = 1, 2 do o = al.attention.forward{ qkv_layer = qkv, qkv_format = "bshd", fp8_recipe = r, fp8_output = true } end
      return o
    end
    local a, b = one(true), one(false)
    assert.is_nil(rawget(a, "scale"), "not read yet")
    assert.are.equal(b.scale, a.scale)
    assert.are.equal(b.scale_inv, a.scale_inv)
    assert.are.equal(0, maxdiff(a:dequantize(), b:dequantize()))
    assert.is_true(tostring(a):find("scale", 1, true) ~= nil)
  end)

  it("device_scaling is a boolean; a Lua amax_compute_algo keeps the state on the host", function()
    assert.has_error(function() al.fp8.DelayedScaling{ device_scaling = 1 } end,
      "fp8.DelayedScaling: device_scaling: expected a boolean, got number")
    local r = al.fp8.DelayedScaling{ amax_compute_algo = function(h) return h[#h] or 0 end }
    assert.is_false(r.device_scaling)
    assert.is_true(al.fp8.DelayedScaling{}.device_scaling)
    local q = al.randn({ 1, 5, 2, 16 })
    al.attention.forward{ query_layer = q, key_layer = q, value_layer = q, qkv_format = "bshd", fp8_recipe = r }
    assert.is_nil(rawget(r, "_ds"))
    assert.are.equal(1, #r:state().qkv.amax_history)
  end)

  it("explain says where the scaling state lives", function()
    local q = al.randn({ 1, 5, 2, 16 })
    local text = al.attention.explain{ query_layer = q, key_layer = q, value_layer = q, qkv_format = "bshd",
      fp8_recipe = al.fp8.DelayedScaling{} }
    assert.is_truthy(text:find("fp8 scaling state: with the data on cpu (amax histories and scales updated there after each call; read directly)", 1, true), text)
    text = al.attention.explain{ query_layer = q, key_layer = q, value_layer = q, qkv_format = "bshd",
      fp8_recipe = al.fp8.DelayedScaling{ device_scaling = false } }
    assert.is_nil(text:find("fp8 scaling state", 1, true))
  end)
end)

-- the C API, against a naive formula written here
local function new_ds(dev, H, algo, margin, hist, count, scale)
  local ds = ffi.gc(ffi.new("al_fp8_ds"), C.al_fp8_ds_release)
  local fm, cnt, sc = ffi.new("double[6]"), ffi.new("int64_t[6]"), ffi.new("double[6]")
  local h = ffi.new("double[?]", 6 * H)
  for s = 0, 5 do
    fm[s] = s < 3 and 448 or 57344
    cnt[s] = count[s + 1]
    sc[s] = scale[s + 1]
    for j = 1, #(hist[s + 1] or {}) do h[s * H + j - 1] = hist[s + 1][j] end
  end
  local dt, di = 0, 0
  if dev ~= "cpu" then dt, di = 1, 0 end
  local st = C.al_fp8_ds_init(ds, dt, di, H, algo, 2 ^ margin, fm, h, cnt, sc)
  return ds, st
end
local function read_ds(ds)
  local H = ds.history_len
  local h, sc, used = ffi.new("double[?]", 6 * H), ffi.new("double[6]"), ffi.new("double[6]")
  assert.are.equal(0, C.al_fp8_ds_read(ds, h, sc, used))
  local r = { hist = {}, scale = {}, used = {} }
  for s = 0, 5 do
    r.hist[s + 1] = {}
    for j = 0, math.min(tonumber(ds.count[s]), H) - 1 do r.hist[s + 1][j + 1] = h[s * H + j] end
    r.scale[s + 1], r.used[s + 1] = sc[s], used[s]
  end
  return r
end
-- what the host recipe does, written out: append, trim, algo, scale (kept for 0 / inf / NaN)
local function naive_update(hist, H, scale, amax, algo, fmax, margin)
  local h = {}
  for i, v in ipairs(hist) do h[i] = v end
  h[#h + 1] = amax
  while #h > H do table.remove(h, 1) end
  local m
  if algo == 1 then m = amax
  else
    m = 0
    for _, v in ipairs(h) do
      if v ~= v then m = v break end
      if v > m then m = v end
    end
  end
  if m ~= m or m <= 0 or m == math.huge then return h, scale end
  return h, fmax / m / 2 ^ margin
end

describe("al_fp8_ds (C API)", function()
  it("quantise + update against the naive formula: 7 updates of a history of 3, zero and NaN amaxes kept out of the scale", function()
    for algo = 0, 1 do
      local H, margin = 3, 2
      local ds = new_ds("cpu", H, algo, margin, { { 5, 7 } }, { 2, 0, 0, 0, 0, 0 }, { 3, 1, 1, 1, 1, 1 })
      local hist, scale = { 5, 7 }, 3
      al.manual_seed(3)
      for step = 1, 7 do
        local x = al.randn({ 40 }) * step
        if step == 3 then x = al.zeros({ 40 }) end
        if step == 5 then x:narrow(1, 7, 1):fill_(0 / 0) end
        local out = require("attnlab.tensor").new()
        assert.are.equal(0, C.al_fp8_ds_quantize(out.raw, x.raw, 4, ds, 0))
        -- the codes are al.fp8.quantize's with the scale the state held
        local ref = al.fp8.quantize(x, { format = "e4m3", scale = scale })
        if step ~= 5 then assert.are.equal(0, maxdiff(out:to("f32"), ref.data:to("f32"))) end   -- (5: a NaN code)
        local am = al.fp8.amax(x)
        assert.are.equal(0, C.al_fp8_ds_update(ds, 1))
        local used = scale
        hist, scale = naive_update(hist, H, scale, am, algo, 448, margin)
        local got = read_ds(ds)
        assert.are.equal(#hist, #got.hist[1], "history length, step " .. step)
        for j = 1, #hist do
          if isnan(hist[j]) then assert.is_true(isnan(got.hist[1][j]))
          else assert.are.equal(hist[j], got.hist[1][j], "algo " .. algo .. " step " .. step .. " entry " .. j) end
        end
        assert.are.equal(scale, got.scale[1], "algo " .. algo .. " scale after step " .. step)
        assert.are.equal(used, got.used[1])
        assert.are.equal(0, #got.hist[2], "other slots untouched")
      end
    end
  end)

  it("two quantisations before one update: the accumulator keeps their max", function()
    local ds = new_ds("cpu", 4, 0, 0, {}, { 0, 0, 0, 0, 0, 0 }, { 1, 1, 1, 1, 1, 1 })
    local T = require "attnlab.tensor"
    local a, b = al.randn({ 16 }), al.randn({ 16 }) * 3
    assert.are.equal(0, C.al_fp8_ds_quantize(T.new().raw, a.raw, 5, ds, 3))
    assert.are.equal(0, C.al_fp8_ds_quantize(T.new().raw, b.raw, 5, ds, 3))
    assert.are.equal(0, C.al_fp8_ds_update(ds, 8))
    local got = read_ds(ds)
    assert.are.equal(math.max(al.fp8.amax(a), al.fp8.amax(b)), got.hist[4][1])
    assert.are.equal(57344 / got.hist[4][1], got.scale[4])
  end)

  it("errors name the argument, the expectation and the value", function()
    local T = require "attnlab.tensor"
    local function err(st) assert.are_not.equal(0, st); return T.last_error() end
    local _, st = new_ds("cpu", 0, 0, 0, {}, { 0, 0, 0, 0, 0, 0 }, { 1, 1, 1, 1, 1, 1 })
    assert.is_truthy(err(st):find("history_len must be 1..", 1, true))
    _, st = new_ds("cpu", 2, 7, 0, {}, { 0, 0, 0, 0, 0, 0 }, { 1, 1, 1, 1, 1, 1 })
    assert.is_truthy(err(st):find("algo must be AL_FP8_ALGO_MAX (0) or AL_FP8_ALGO_MOST_RECENT (1), got 7", 1, true))
    _, st = new_ds("cpu", 2, 0, 0, {}, { 0, 0, 0, 0, 0, 0 }, { 1, -2, 1, 1, 1, 1 })
    assert.is_truthy(err(st):find("scale[1] must be finite and > 0, got -2", 1, true))
    _, st = new_ds("cpu", 2, 0, 0, {}, { 0, -1, 0, 0, 0, 0 }, { 1, 1, 1, 1, 1, 1 })
    assert.is_truthy(err(st):find("count[1] must be >= 0, got -1", 1, true))
    local ds = new_ds("cpu", 2, 0, 0, {}, { 0, 0, 0, 0, 0, 0 }, { 1, 1, 1, 1, 1, 1 })
    assert.is_truthy(err(C.al_fp8_ds_update(ds, 0x40)):find("slot_mask must use bits 0..5", 1, true))
    local x = al.randn({ 4 })
    assert.is_truthy(err(C.al_fp8_ds_quantize(T.new().raw, x.raw, 4, ds, 6)):find("slot must be 0..5", 1, true))
    assert.is_truthy(err(C.al_fp8_ds_quantize(T.new().raw, x.raw, 1, ds, 0)):find("format must be fp8_e4m3 or fp8_e5m2", 1, true))
    local x8 = al.fp8.quantize(x, { scale = 1 }).data
    assert.is_truthy(err(C.al_fp8_ds_quantize(T.new().raw, x8.raw, 4, ds, 0)):find("x must be f32, f64, f16 or bf16", 1, true))
    C.al_fp8_ds_release(ds)
    assert.is_truthy(err(C.al_fp8_ds_update(ds, 1)):find("ds is not initialised", 1, true))
    assert.is_truthy(err(C.al_fp8_ds_read(ds, nil, nil, nil)):find("ds is not initialised", 1, true))
  end)

  it("attention with fp8.ds checks ds_used and says what it needs", function()
    local r = al.fp8.DelayedScaling{}
    local q = al.randn({ 1, 5, 2, 16 })
    local args = { query_layer = q, key_layer = q, value_layer = q, qkv_format = "bshd", fp8_recipe = r }
    local _, ctx = al.attention.forward(args)
    local f = ctx.fp8.f
    local used = f.ds_used
    f.ds_used = nil
    local T = require "attnlab.tensor"
    local o, l = T.new(), T.new()
    assert.are_not.equal(0, C.al_attn_forward(ctx.params, ctx.inputs, o.raw, l.raw, nil))
    assert.is_truthy(T.last_error():find("fp8.ds_used must be a contiguous f64 [6] tensor", 1, true), T.last_error())
    f.ds_used = used
    f.scale[2] = 0
    assert.are_not.equal(0, C.al_attn_forward(ctx.params, ctx.inputs, o.raw, l.raw, nil))
    assert.is_truthy(T.last_error():find("with fp8.ds every fp8.scale[] must say 'given'", 1, true), T.last_error())
    f.scale[2] = 1
    assert.are.equal(0, C.al_attn_forward(ctx.params, ctx.inputs, o.raw, l.raw, nil))
  end)
end)

describe("fp8 delayed scaling on the device #gpu", function()
  gpu_it("fused FP8: the device state gives the host recipe's outputs, gradients, histories and scales", function()
    for _, mask in ipairs({ "causal", "no_mask" }) do
      local opts = { device = "cuda", dtype = "bf16", b = 1, s = 160, h = 2, d = 128, backend = "fused", mask = mask, steps = 5 }
      local dev = { train(function() return al.fp8.DelayedScaling{ amax_history_len = 3 } end, opts) }
      local host = { train(function() return al.fp8.DelayedScaling{ amax_history_len = 3, device_scaling = false } end, opts) }
      assert.are.equal("cuda", dev[1]._ds_device:sub(1, 4))
      -- outputs bit for bit (the same scales, the same graph); gradients and the dQKV history: cuDNN's dQ may
      -- sum in another order from run to run, so they are compared within a few bf16 ulps
      local _, oa, ga, sa = unpack(dev)
      local _, ob, gb, sb = unpack(host)
      for i = 1, #ob do
        assert.are.equal(0, maxdiff(oa[i], ob[i]), mask .. " output of step " .. i)
        for k, g in pairs(gb[i]) do
          local d = maxdiff(ga[i][k], g)
          assert.is_true(d <= 0.02 * g:cpu():to("f64"):abs():max() + 1e-6, mask .. " gradient " .. k .. " step " .. i .. ": " .. d)
        end
      end
      for _, slot in ipairs({ "qkv", "s", "o", "do" }) do
        assert.are.same(sb[slot].amax_history, sa[slot].amax_history, mask .. " " .. slot)
        assert.are.equal(sb[slot].scale, sa[slot].scale, mask .. " " .. slot)
      end
      for _, slot in ipairs({ "dp", "dqkv" }) do
        for j = 1, #sb[slot].amax_history do
          local a, b = sa[slot].amax_history[j], sb[slot].amax_history[j]
          assert.is_true(math.abs(a - b) <= 1e-2 * b, mask .. " " .. slot .. " history " .. j .. ": " .. a .. " vs " .. b)
        end
      end
      assert.are.equal(5, sa.steps)
    end
  end)

  gpu_it("fused FP8 fp8_output: the device record's O scale is the host recipe's", function()
    local function one(dsc)
      al.manual_seed(6)
      local r = al.fp8.DelayedScaling{ amax_history_len = 2, device_scaling = dsc }
      local qkv = al.randn({ 1, 128, 3, 2, 128 }, { dtype = "bf16" }):cuda()
      local o
      for _ = 1, 3 do o = al.attention.forward{ qkv_layer = qkv, qkv_format = "bshd", fp8_recipe = r, fp8_output = true, backend = "fused" } end
      return o
    end
    local a, b = one(true), one(false)
    assert.are.equal(b.scale, a.scale)
    assert.are.equal(0, maxdiff(a.data:to("f32"), b.data:to("f32")))
  end)

  gpu_it("the device update and quantise give the CPU's state and codes (histories with 0, NaN, ring wrap)", function()
    local T = require "attnlab.tensor"
    for algo = 0, 1 do
      local seed = { { 2, 9 }, {}, { 0.5 }, {}, { 1, 2, 3 }, {} }
      local counts, scales = { 2, 0, 1, 0, 5, 0 }, { 3, 1, 2, 1, 7, 1 }
      local dc = new_ds("cpu", 3, algo, 1, seed, counts, scales)
      local dg = new_ds("cuda", 3, algo, 1, seed, counts, scales)
      al.manual_seed(9)
      for step = 1, 6 do
        for slot = 0, 5 do
          local x = al.randn({ 1000 + 37 * slot }) * (step + slot)
          if step == 2 then x = x * 0 end
          if step == 4 and slot == 1 then x:narrow(1, 3, 1):fill_(0 / 0) end
          local oc, og = T.new(), T.new()
          assert.are.equal(0, C.al_fp8_ds_quantize(oc.raw, x.raw, slot < 3 and 4 or 5, dc, slot))
          local xg = x:cuda()
          assert.are.equal(0, C.al_fp8_ds_quantize(og.raw, xg.raw, slot < 3 and 4 or 5, dg, slot))
          if not (step == 4 and slot == 1) then   -- (a NaN code: compared in fp8_spec's parity case)
            assert.are.equal(0, maxdiff(og:cpu():to("f32"), oc:to("f32")), "codes, slot " .. slot .. " step " .. step)
          end
        end
        local mask = step % 2 == 1 and 0x3F or 0x15
        assert.are.equal(0, C.al_fp8_ds_update(dc, mask))
        assert.are.equal(0, C.al_fp8_ds_update(dg, mask))
        local a, b = read_ds(dg), read_ds(dc)
        for s = 1, 6 do
          assert.are.equal(#b.hist[s], #a.hist[s])
          for j = 1, #b.hist[s] do
            if isnan(b.hist[s][j]) then assert.is_true(isnan(a.hist[s][j]))
            else assert.are.equal(b.hist[s][j], a.hist[s][j], "algo " .. algo .. " slot " .. s .. " entry " .. j) end
          end
          assert.are.equal(b.scale[s], a.scale[s], "algo " .. algo .. " slot " .. s .. " scale, step " .. step)
          assert.are.equal(b.used[s], a.used[s])
        end
      end
    end
  end)
end)
