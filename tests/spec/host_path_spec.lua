-- The lean host path of al.attention.forward (bench/host_overhead.lua): what it reuses between calls
-- must never go stale. The packed-view cache (per qkv_layer handle), the module's reused defaults
-- table, the in-place flattening, the cheap backend choice and the plan's inline per-sequence arrays
-- are each exercised with a change after a cached call, against the independent Lua oracle.
package.path = "tests/spec/?.lua;" .. package.path
local al = require "attnlab"
local oracle = require "attention_oracle"
local C = al.C or require("attnlab.ffi").C

local function rnd(shape) return al.randn(shape, { dtype = "f64" }) end

local maxdiff = require("nn_check").maxdiff   -- max |a[i] - b[i]| over two lists, NaN as +inf

-- the oracle of a packed call: the buffer's select views as separate tensors
local function oracle_packed(qkv, dim, fmt, mask, extra)
  local nd = qkv:dim()
  local d = dim < 0 and nd + dim + 1 or dim
  local a = { query_layer = qkv:select(d, 1), key_layer = qkv:select(d, 2), value_layer = qkv:select(d, 3),
    qkv_format = fmt, attn_mask_type = mask }
  for k, v in pairs(extra or {}) do a[k] = v end
  return oracle.run(al, a)
end

local function check_packed(args, label)
  local flat, ctx = al.attention.forward(args)
  local want = oracle_packed(args.qkv_layer, args.qkv_interleave_dim or -3, args.qkv_format, args.attn_mask_type)
  local got = ctx.out:flat_values()
  local d = maxdiff(got, want)
  assert(d <= 1e-5, string.format("%s: max |forward - oracle| = %.3g", label, d))
  -- the flattened result is the same memory as ctx.out, with the last two dims merged
  local os, fs = ctx.out:size(), flat:size()
  assert.equal(#os - 1, #fs)
  assert.equal(os[#os - 1] * os[#os], fs[#fs])
  assert.same(got, flat:flat_values())
  return ctx
end

describe("host path: packed views reused per qkv_layer handle", function()
  local base = { qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal", backend = "cpu" }
  local function args(qkv, extra)
    local a = { qkv_layer = qkv }
    for k, v in pairs(base) do a[k] = v end
    for k, v in pairs(extra or {}) do a[k] = v end
    return a
  end

  it("reuses the views for the same unchanged buffer, and they are right", function()
    local qkv = rnd({ 2, 5, 3, 2, 8 })
    local a = args(qkv)
    local c1 = check_packed(a, "first call")
    local c2 = check_packed(a, "cached call")
    assert.equal(c1.refs.q, c2.refs.q)     -- the same view handles: the cache hit
    -- new data in the same buffer is seen (views, not copies)
    qkv:copy_(rnd({ 2, 5, 3, 2, 8 }))
    check_packed(a, "after an in-place write")
  end)

  it("notices a changed qkv_interleave_dim, qkv_format and mask on the same buffer", function()
    local qkv = rnd({ 4, 4, 3, 3, 8 })   -- valid as [.., 3, h=3, d] and [.., h=3, 3, d], bshd and sbhd
    local a = args(qkv)
    check_packed(a, "bshd -3")
    a.qkv_interleave_dim = -2
    check_packed(a, "bshd -2 after -3")
    a.qkv_format = "sbhd"
    check_packed(a, "sbhd -2 after bshd")
    a.qkv_interleave_dim = -3
    check_packed(a, "sbhd -3")
    a.attn_mask_type = "no_mask"
    check_packed(a, "no_mask after causal")
  end)

  it("notices a handle whose descriptor changed in place (other storage, other shape)", function()
    local qkv = rnd({ 1, 4, 3, 2, 8 })
    local a = args(qkv)
    check_packed(a, "before")
    local other = rnd({ 1, 6, 3, 2, 8 })
    C.al_tensor_release(qkv.raw)
    assert.equal(0, C.al_tensor_alias(qkv.raw, other.raw))   -- the same Lua handle now describes `other`
    local ctx = check_packed(a, "after the handle changed")
    assert.equal(6, ctx.out:size(2))
    -- a released handle is refused, not served from the cache
    C.al_tensor_release(qkv.raw)
    assert.has_error(function() al.attention.forward(a) end)
  end)

  it("a different buffer, kv_layer inputs and inference_params take the uncached path", function()
    local q1, q2 = rnd({ 1, 4, 3, 2, 8 }), rnd({ 1, 4, 3, 2, 8 })
    check_packed(args(q1), "buffer 1")
    check_packed(args(q2), "buffer 2")
    check_packed(args(q1), "buffer 1 again")
    -- the same buffer with a stray extra input is an error every time (never a cache hit)
    local bad = args(q1, { query_layer = rnd({ 1, 4, 2, 8 }) })
    assert.has_error(function() al.attention.forward(bad) end)
    assert.has_error(function() al.attention.forward(bad) end)
    local kv = rnd({ 1, 4, 2, 2, 8 })
    local q = rnd({ 1, 4, 2, 8 })
    local ka = { query_layer = q, kv_layer = kv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal",
      backend = "cpu" }
    local _, ctx = al.attention.forward(ka)
    local want = oracle.run(al, { query_layer = q, key_layer = kv:select(3, 1), value_layer = kv:select(3, 2),
      qkv_format = "bshd", attn_mask_type = "causal" })
    assert(maxdiff(ctx.out:flat_values(), want) <= 1e-5)
  end)

  it("gradients of a cached packed call still land in one packed gradient", function()
    local qkv = rnd({ 1, 4, 3, 2, 8 })
    local a = args(qkv)
    al.attention.forward(a)
    local flat, ctx = al.attention.forward(a)
    local g = al.attention.backward(ctx, rnd(flat:size()))
    assert.same(qkv:size(), g.qkv_layer:size())
  end)
end)

describe("host path: DotProductAttention reuses its defaults table", function()
  it("sees every setting changed between calls", function()
    local q, k, v = rnd({ 1, 5, 2, 8 }), rnd({ 1, 5, 2, 8 }), rnd({ 1, 5, 2, 8 })
    local dpa = al.DotProductAttention{ num_attention_heads = 2, kv_channels = 8, qkv_format = "bshd",
      attn_mask_type = "causal", backend = "cpu" }
    local input = { query_layer = q, key_layer = k, value_layer = v }
    local function want(mask, scale)
      return oracle.run(al, { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd", attn_mask_type = mask,
        softmax_scale = scale })
    end
    dpa:forward(input)
    assert(maxdiff(dpa.ctx.out:flat_values(), want("causal")) <= 1e-5)
    dpa.attn_mask_type = "no_mask"
    dpa:forward(input)
    assert(maxdiff(dpa.ctx.out:flat_values(), want("no_mask")) <= 1e-5)
    dpa.softmax_scale = 0.5
    dpa:forward(input)
    assert(maxdiff(dpa.ctx.out:flat_values(), want("no_mask", 0.5)) <= 1e-5)
    -- dropout follows training/evaluate on every call
    dpa.attention_dropout = 0.5
    dpa:evaluate()
    dpa:forward(input)
    assert(maxdiff(dpa.ctx.out:flat_values(), want("no_mask", 0.5)) <= 1e-5)
    dpa:training()
    dpa:forward(input)
    assert(maxdiff(dpa.ctx.out:flat_values(), want("no_mask", 0.5)) > 1e-3)
    -- a per-call argument still overrides the module without sticking
    dpa.attention_dropout = 0
    dpa:forward({ query_layer = q, key_layer = k, value_layer = v, attn_mask_type = "causal" })
    assert(maxdiff(dpa.ctx.out:flat_values(), want("causal", 0.5)) <= 1e-5)
    dpa:forward(input)
    assert(maxdiff(dpa.ctx.out:flat_values(), want("no_mask", 0.5)) <= 1e-5)
  end)
end)

describe("host path: forward outputs and backend choice", function()
  local q, k, v = rnd({ 1, 3, 2, 8 }), rnd({ 1, 3, 2, 8 }), rnd({ 1, 3, 2, 8 })
  local a = { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd", attn_mask_type = "causal" }

  it("returns max_logit only when asked, and then right", function()
    local r = { al.attention.forward(a) }
    assert.equal(2, #r)
    local a2 = {}
    for key, x in pairs(a) do a2[key] = x end
    a2.return_max_logit = true
    local out, ml, ctx = al.attention.forward(a2)
    assert.same({ 2 }, ml:size())
    assert.equal(ctx.max_logit, ml)
    assert.same({ 1, 3, 16 }, out:size())
  end)

  it("a forced backend that cannot serve is still an error quoting its reason", function()
    local a2 = {}
    for key, x in pairs(a) do a2[key] = x end
    for _, be in ipairs({ "fused", "flash", "unfused" }) do
      a2.backend = be
      local ok, err = pcall(al.attention.forward, a2)
      assert.is_false(ok)
      assert.matches("forced backend '" .. be .. "' cannot serve this call", tostring(err), 1, true)
    end
    a2.backend = "nope"
    assert.has_error(function() al.attention.forward(a2) end)
  end)

  it("explain still gives every backend its verdict", function()
    local text, name = al.attention.explain(a)
    assert.equal("cpu", name)
    for _, be in ipairs({ "fused", "flash", "unfused", "cpu" }) do
      assert.matches("\n  " .. be .. " ", text, 1, true)
    end
  end)

  it("padding via cu_seqlens at b = 4 (inline plan arrays) and b = 5 (heap) matches the oracle", function()
    for _, b in ipairs({ 4, 5, 9 }) do
      local qq, kk, vv = rnd({ b, 6, 2, 8 }), rnd({ b, 6, 2, 8 }), rnd({ b, 6, 2, 8 })
      local cu = { 0 }
      for i = 1, b do cu[i + 1] = cu[i] + (i % 6) + 1 end
      local cus = al.tensor(cu, { dtype = "i32" })
      local pa = { query_layer = qq, key_layer = kk, value_layer = vv, qkv_format = "bshd",
        attn_mask_type = "padding_causal", cu_seqlens_q = cus, cu_seqlens_kv = cus, backend = "cpu" }
      local _, ctx = al.attention.forward(pa)
      local d = maxdiff(ctx.out:flat_values(), oracle.run(al, pa))
      assert(d <= 1e-5, string.format("b=%d: max diff %.3g", b, d))
    end
  end)
end)

-- The cached call compiles under LuaJIT: a fresh process runs 3000 calls of each path in
-- bench/host_path_loop.lua, and every trace recording LuaJIT aborts during that loop must be one cut
-- short by a tensor finaliser (the collector runs them in the interpreter, so such aborts are expected
-- and harmless). "trace too long", "leaving loop in root trace", "loop unroll limit reached",
-- "blacklisted" or an NYI operation there means the hot path no longer compiles as one trace: that is
-- what made DotProductAttention:forward cost 28k to 98k instructions per call, depending on the traces
-- LuaJIT happened to form (bench/host_path_instr.sh counts them).
describe("host path: the cached call compiles under LuaJIT", function()
  local shell = require "shell"
  for _, path in ipairs({ "func", "module", "func_packed", "module_packed" }) do
    it(path .. ": no trace abort in the hot loop but a finaliser's, and the loop compiles", function()
      if not (jit and jit.status()) then pending("LuaJIT's compiler is off") return end
      local out, rc = shell.sh("luajit bench/host_path_loop.lua " .. path .. " 3000")
      assert.equal(0, rc, out)
      local n, others, compiled = out:match("(%d+) trace aborts %((%d+) other than a finaliser's%), loop compiled: (%a+)")
      assert(n, "unexpected output: " .. out)
      assert(tonumber(others) == 0, "aborts other than a finaliser's:\n" .. out)
      assert.equal("yes", compiled, out)
    end)
  end
end)

-- On the GPU: a cached fused call followed by changed shapes, strides and masks; each result against
-- the CPU backend, and the plan cache builds exactly once per new graph.
describe("host path: cached fused call sees every change #gpu", function()
  local ok_gpu = al.cuda and al.cuda.available()
  local function fused_info()
    local _, builds = al.cuda.backend_info("fused")
    return builds
  end
  local function close(label, gpu_args, tol)
    local _, gctx = al.attention.forward(gpu_args)
    local cpu = {}
    for key, x in pairs(gpu_args) do cpu[key] = x end
    for _, key in ipairs({ "qkv_layer", "query_layer", "key_layer", "value_layer" }) do
      if cpu[key] then cpu[key] = cpu[key]:to({ dtype = "f32", device = "cpu" }) end
    end
    cpu.backend = "cpu"
    local _, cctx = al.attention.forward(cpu)
    local d = maxdiff(gctx.out:to({ dtype = "f32", device = "cpu" }):flat_values(), cctx.out:flat_values())
    assert(d <= tol, string.format("%s: max |fused - cpu| = %.3g", label, d))
  end

  it("changed shape, interleave dim, mask and buffer after a cached call", function()
    if not ok_gpu then pending("no usable GPU") return end
    local opts = { dtype = "bf16", device = "cuda" }
    local qkv = al.randn({ 1, 64, 3, 2, 64 }, opts)
    local a = { qkv_layer = qkv, qkv_interleave_dim = -3, qkv_format = "bshd", attn_mask_type = "causal", backend = "fused" }
    close("first", a, 2e-2)
    local b0 = fused_info()
    for _ = 1, 20 do al.attention.forward(a) end
    assert.equal(b0, fused_info())             -- cached: no build
    close("cached", a, 2e-2)
    a.attn_mask_type = "no_mask"
    close("mask changed", a, 2e-2)
    a.qkv_layer = al.randn({ 1, 128, 3, 2, 64 }, opts)
    close("longer sequence", a, 2e-2)
    a.qkv_layer = al.randn({ 1, 64, 2, 3, 64 }, opts)
    a.qkv_interleave_dim = -2
    close("bsh3d", a, 2e-2)
    a.qkv_layer = qkv
    a.qkv_interleave_dim = -3
    a.softmax_scale = 0.05
    close("scale changed (by value, same plan)", a, 2e-2)
    -- the same handle re-pointed at another buffer
    local other = al.randn({ 1, 32, 3, 2, 64 }, opts)
    C.al_tensor_release(qkv.raw)
    assert.equal(0, C.al_tensor_alias(qkv.raw, other.raw))
    close("handle re-pointed", a, 2e-2)
  end)
end)
