-- cp_spec.lua — context parallelism (lua/attnlab/cp.lua): with simulated ranks (al.cp.SimGroup) on the
-- CPU, every mode (p2p, all_gather, a2a) x mask (no_mask, causal) x format (bshd, sbhd, thd with padded
-- cu_seqlens) x MHA/GQA: the gathered per-rank outputs and dq/dk/dv equal one single-process
-- al.attention.forward/backward on the full sequence (f64: 1e-10; f32: 1e-5); DualChunkSwap split/gather
-- round trips; error paths; the module entry (DotProductAttention / MultiheadAttention with cp_group) against
-- the plain modules. #gpu: SimGroup on one GPU with the flash/fused backends (bf16, TE's CP tolerances), the
-- module with a caller's cp_stream, and NCCL groups (>= 2 GPUs).
package.path = "tests/spec/?.lua;" .. package.path
local al = require "attnlab"

local function err_of(f, ...)
  local ok, e = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(e)
end

local GRADS = { "query_layer", "key_layer", "value_layer" }

-- full-sequence inputs: bshd/sbhd {b, s, h, d}; thd: sequences with actual lengths L and padded P
local function make_inputs(fmt, o, dtype, device)
  local opts = { dtype = dtype, device = device }
  local h, hg, d, dv = o.h, o.hg, o.d, o.dv or o.d
  local a = { qkv_format = fmt }
  if fmt == "thd" then
    local cu, cup = { 0 }, { 0 }
    for i, L in ipairs(o.L) do cu[i + 1] = cu[i] + L cup[i + 1] = cup[i] + o.P[i] end
    local t = cup[#cup]
    a.query_layer, a.key_layer, a.value_layer = al.randn({ t, h, d }, opts), al.randn({ t, hg, d }, opts), al.randn({ t, hg, dv }, opts)
    a.cu, a.cup = cu, cup
  else
    local function shp(hh, dd) return fmt == "bshd" and { o.b, o.s, hh, dd } or { o.s, o.b, hh, dd } end
    a.query_layer, a.key_layer, a.value_layer = al.randn(shp(h, d), opts), al.randn(shp(hg, d), opts), al.randn(shp(hg, dv), opts)
  end
  return a
end

local function i32(t, device) return al.tensor(t, { dtype = "i32" }):to(device or "cpu") end

-- single-process reference and CP run; returns the max differences {out, dq, dk, dv}
local function compare(comm, fmt, mask, cp, o, dtype, extra)
  extra = extra or {}
  local device = extra.device or "cpu"
  local a = make_inputs(fmt, o, dtype, device)
  local ref_args = { query_layer = a.query_layer, key_layer = a.key_layer, value_layer = a.value_layer, qkv_format = fmt,
    attn_mask_type = mask, compute_dtype = extra.compute_dtype, backend = extra.backend }
  local sopts = { cp_size = cp, qkv_format = fmt, load_balance = extra.load_balance }
  local cp_args = { group = extra.group or al.cp.SimGroup(cp), cp_comm_type = comm, qkv_format = fmt, attn_mask_type = mask,
    compute_dtype = extra.compute_dtype, backend = extra.backend, load_balance = extra.load_balance, overlap = extra.overlap }
  if fmt == "thd" then
    ref_args.attn_mask_type = mask == "causal" and "padding_causal" or "padding"
    ref_args.cu_seqlens_q, ref_args.cu_seqlens_kv = i32(a.cu, device), i32(a.cu, device)
    ref_args.cu_seqlens_q_padded, ref_args.cu_seqlens_kv_padded = i32(a.cup, device), i32(a.cup, device)
    sopts.cu_seqlens_padded = a.cup
    cp_args.cu_seqlens_q, cp_args.cu_seqlens_q_padded = a.cu, a.cup
  end
  local ref, rctx = al.attention.forward(ref_args)
  local dout = al.randn(ref:size(), { dtype = dtype, device = device })
  local rg = al.attention.backward(rctx, dout)
  cp_args.query_layer, cp_args.key_layer = al.cp.split(a.query_layer, sopts), al.cp.split(a.key_layer, sopts)
  cp_args.value_layer = al.cp.split(a.value_layer, sopts)
  local outs, ctx = al.cp.attention_forward(cp_args)
  local gopts = { cp_size = cp, qkv_format = fmt, load_balance = extra.load_balance, cu_seqlens_padded = sopts.cu_seqlens_padded }
  local out = al.cp.gather(outs, gopts)
  local douts = al.cp.split(dout, gopts)
  local g = al.cp.attention_backward(ctx, douts)
  local diffs = { out = al.max_abs_diff(out:to("f64"), ref:to("f64")), out_t = out, ref = ref }
  for _, n in ipairs(GRADS) do
    local parts = {}
    for r = 1, cp do parts[r] = g[r][n] end
    local full = al.cp.gather(parts, gopts)
    diffs[n] = al.max_abs_diff(full:to("f64"), rg[n]:to("f64"))
    diffs[n .. "_t"], diffs[n .. "_ref"] = full, rg[n]
  end
  return diffs
end

local function assert_close(diffs, tol, label)
  for _, n in ipairs { "out", "query_layer", "key_layer", "value_layer" } do
    assert(diffs[n] <= tol, string.format("%s: %s differs by %.3e (tolerance %.1e)", label, n, diffs[n], tol))
  end
end

describe("context parallelism, simulated ranks (CPU)", function()
  local COMMS = { "p2p", "all_gather", "a2a" }
  local MASKS = { "no_mask", "causal" }

  for _, cp in ipairs { 2, 4 } do
    for _, comm in ipairs(COMMS) do
      for _, fmt in ipairs { "bshd", "sbhd", "thd" } do
        for _, gqa in ipairs { false, true } do
          it(string.format("cp=%d %s %s %s: out and dq/dk/dv equal single-process attention (f64, 1e-10)", cp, comm, fmt,
            gqa and "GQA" or "MHA"), function()
            local h, hg = 4, gqa and (comm == "a2a" and cp or 2) or 4
            if gqa and comm == "a2a" and cp == 4 then h, hg = 8, 4 end
            for _, mask in ipairs(MASKS) do
              al.manual_seed(100 + cp)
              local o = { b = 2, s = 4 * cp, h = h, hg = hg, d = 8, dv = 6 }
              -- thd: padded lengths multiples of 2*cp; actual lengths ending inside various chunks (and one empty)
              o.L = { 4 * cp - 1, 1, 2 * cp + 1, 0 }
              o.P = { 4 * cp, 2 * cp, 4 * cp, 2 * cp }
              assert_close(compare(comm, fmt, mask, cp, o, "f64", { compute_dtype = "f64" }), 1e-10,
                string.format("cp=%d %s %s %s", cp, comm, fmt, mask))
            end
          end)
        end
      end
    end
  end

  it("cp=3 (p2p, all_gather: bshd, sbhd, thd) and a2a with 3 | heads (f64)", function()
    al.manual_seed(7)
    for _, comm in ipairs(COMMS) do
      for _, fmt in ipairs { "bshd", "sbhd", "thd" } do
        for _, mask in ipairs(MASKS) do
          local o = { b = 1, s = 12, h = 6, hg = 3, d = 8, L = { 11, 4 }, P = { 12, 6 } }
          assert_close(compare(comm, fmt, mask, 3, o, "f64", { compute_dtype = "f64" }), 1e-10, "cp=3 " .. comm .. " " .. fmt .. " " .. mask)
        end
      end
    end
  end)

  it("f32 inputs (f32 compute) match within 1e-5, every mode, causal and no_mask, GQA", function()
    al.manual_seed(11)
    for _, comm in ipairs(COMMS) do
      for _, mask in ipairs(MASKS) do
        local o = { b = 2, s = 16, h = 4, hg = 2, d = 16 }
        local diffs = compare(comm, "bshd", mask, 2, o, "f32")
        assert_close(diffs, 1e-5, "f32 " .. comm .. " " .. mask)
        assert.equals("f32", diffs.out_t:dtype())
        assert.equals("f32", diffs.key_layer_t:dtype())
      end
    end
  end)

  it("contiguous load balancing (p2p and all_gather, causal and no_mask) is also exact", function()
    al.manual_seed(12)
    for _, comm in ipairs { "p2p", "all_gather" } do
      for _, mask in ipairs(MASKS) do
        for _, fmt in ipairs { "bshd", "thd" } do
          local o = { b = 2, s = 12, h = 2, hg = 2, d = 8, L = { 5, 12 }, P = { 6, 12 } }
          assert_close(compare(comm, fmt, mask, 3, o, "f64", { compute_dtype = "f64", load_balance = "contiguous" }), 1e-10,
            "contiguous " .. comm .. " " .. mask .. " " .. fmt)
        end
      end
    end
  end)

  it("p2p with overlap = false gives the same result (the CPU never overlaps)", function()
    al.manual_seed(13)
    local o = { b = 1, s = 8, h = 2, hg = 2, d = 8 }
    assert_close(compare("p2p", "bshd", "causal", 2, o, "f64", { compute_dtype = "f64", overlap = false }), 1e-10, "no overlap")
  end)

  it("padded thd rows of the output and of dq/dk/dv are exactly zero", function()
    al.manual_seed(14)
    for _, comm in ipairs(COMMS) do
      local o = { h = 2, hg = 2, d = 8, L = { 5, 2 }, P = { 8, 4 } }
      local d = compare(comm, "thd", "causal", 2, o, "f64", { compute_dtype = "f64" })
      local out = d.out_t
      for _, row in ipairs { 6, 7, 8, 11, 12 } do
        assert.equals(0, out:select(1, row):abs():sum():item())
        assert.equals(0, d.query_layer_t:select(1, row):abs():sum():item())
        assert.equals(0, d.key_layer_t:select(1, row):abs():sum():item())
      end
      assert.is_true(out:select(1, 5):abs():sum():item() > 0)
    end
  end)
end)

describe("cp.split / cp.gather", function()
  it("DualChunkSwap puts chunks r and 2cp-1-r on rank r and round-trips (bshd, sbhd, thd)", function()
    local x = al.arange(0, 16, { dtype = "f64" }):view({ 1, 16, 1, 1 })
    local parts = al.cp.split(x, { cp_size = 4, qkv_format = "bshd" })
    assert.equals(4, #parts)
    assert.same({ 0, 1, 14, 15 }, parts[1]:view({ 4 }):totable())
    assert.same({ 2, 3, 12, 13 }, parts[2]:view({ 4 }):totable())
    assert.same({ 6, 7, 8, 9 }, parts[4]:view({ 4 }):totable())
    assert.equals(0, al.max_abs_diff(al.cp.gather(parts, { cp_size = 4, qkv_format = "bshd" }), x))
    local c = al.cp.split(x, { cp_size = 4, qkv_format = "bshd", load_balance = "contiguous" })
    assert.same({ 4, 5, 6, 7 }, c[2]:view({ 4 }):totable())
    local y = al.randn({ 12, 3, 2, 4 })
    local ps = al.cp.split(y, { cp_size = 3, qkv_format = "sbhd" })
    assert.same({ 4, 3, 2, 4 }, ps[1]:size())
    assert.equals(0, al.max_abs_diff(ps[2]:narrow(1, 1, 2), y:narrow(1, 3, 2)))
    assert.equals(0, al.max_abs_diff(al.cp.gather(ps, { cp_size = 3, qkv_format = "sbhd" }), y))
    -- thd: two sequences of padded lengths 8 and 4 (cp = 2: chunks of 2 and 1)
    local t = al.arange(0, 12, { dtype = "f64" }):view({ 12, 1, 1 })
    local pt = al.cp.split(t, { cp_size = 2, qkv_format = "thd", cu_seqlens_padded = { 0, 8, 12 } })
    assert.same({ 0, 1, 6, 7, 8, 11 }, pt[1]:view({ 6 }):totable())
    assert.same({ 2, 3, 4, 5, 9, 10 }, pt[2]:view({ 6 }):totable())
    assert.equals(0, al.max_abs_diff(al.cp.gather(pt, { cp_size = 2, qkv_format = "thd", cu_seqlens_padded = { 0, 8, 12 } }), t))
  end)

  it("errors: lengths not divisible by 2*cp, missing cu_seqlens_padded, bad options", function()
    local x = al.randn({ 1, 10, 1, 2 })
    assert.truthy(err_of(al.cp.split, x, { cp_size = 2, qkv_format = "bshd" }):find("divisible by 2*cp_size = 4", 1, true))
    assert.truthy(err_of(al.cp.split, al.randn({ 12, 1, 1 }), { cp_size = 2, qkv_format = "thd", cu_seqlens_padded = { 0, 6, 12 } })
      :find("cu_seqlens_padded: sequence 1 has (padded) length 6", 1, true))
    assert.truthy(err_of(al.cp.split, al.randn({ 8, 1, 1 }), { cp_size = 2, qkv_format = "thd" }):find("cu_seqlens_padded: required", 1, true))
    assert.truthy(err_of(al.cp.split, x, { cp_size = 0 }):find("cp_size", 1, true))
    for _, n in ipairs({ 0, -1, 2.5, 2 ^ 62, "2" }) do
      assert.truthy(err_of(al.cp.SimGroup, n):find("cp.SimGroup: n: expected an integer in 1..1024", 1, true), tostring(n))
    end
    assert.truthy(err_of(al.cp.split, x, { cp_size = 2, load_balance = "zigzag" }):find("load_balance", 1, true))
    assert.truthy(err_of(al.cp.gather, { x, x }, { cp_size = 3, qkv_format = "bshd" }):find("expected 3 tensors", 1, true))
  end)
end)

describe("cp.attention_forward errors", function()
  local function args(extra)
    al.manual_seed(3)
    local g = al.cp.SimGroup(2)
    local a = { group = g, qkv_format = "bshd", attn_mask_type = "causal",
      query_layer = { al.randn({ 1, 4, 3, 8 }), al.randn({ 1, 4, 3, 8 }) },
      key_layer = { al.randn({ 1, 4, 3, 8 }), al.randn({ 1, 4, 3, 8 }) },
      value_layer = { al.randn({ 1, 4, 3, 8 }), al.randn({ 1, 4, 3, 8 }) } }
    for k, v in pairs(extra or {}) do a[k] = v end
    return a
  end
  it("names the argument", function()
    assert.truthy(err_of(al.cp.attention_forward, args { cp_comm_type = "a2a" }):find("divisible by cp_size = 2", 1, true))
    assert.truthy(err_of(al.cp.attention_forward, args { cp_comm_type = "ring" }):find("cp_comm_type: expected 'p2p', 'all_gather' or 'a2a', got ring", 1, true))
    assert.truthy(err_of(al.cp.attention_forward, args { cp_comm_type = "a2a+p2p" }):find("not implemented", 1, true))
    assert.truthy(err_of(al.cp.attention_forward, args { group = 3 }):find("group: expected", 1, true))
    local bad = args()
    bad.key_layer[2] = al.randn({ 1, 6, 3, 8 })
    assert.truthy(err_of(al.cp.attention_forward, bad):find("key_layer[2]: mismatched per-rank inputs", 1, true))
    bad = args()
    bad.value_layer[2] = al.randn({ 1, 4, 3, 8 }, { dtype = "f64" })
    assert.truthy(err_of(al.cp.attention_forward, bad):find("value_layer[2]: mismatched", 1, true))
    bad = args()
    bad.query_layer[2] = nil
    assert.truthy(err_of(al.cp.attention_forward, bad):find("query_layer[2]: expected a tensor for rank 1", 1, true))
    local odd = args()
    for _, n in ipairs { "query_layer", "key_layer", "value_layer" } do odd[n] = { al.randn({ 1, 3, 3, 8 }), al.randn({ 1, 3, 3, 8 }) } end
    assert.truthy(err_of(al.cp.attention_forward, odd):find("sequence divisible by 2*cp_size", 1, true))
    assert.truthy(err_of(al.cp.attention_forward, args { window_size = { 2, 0 } }):find("only supported with cp_comm_type = 'a2a'", 1, true))
    assert.truthy(err_of(al.cp.attention_forward, args { attn_mask_type = "causal_bottom_right" }):find("attn_mask_type", 1, true))
    assert.truthy(err_of(al.cp.attention_forward, args { attention_dropout = 0.1 }):find("dropout", 1, true))
    assert.truthy(err_of(al.cp.attention_forward, args { core_attention_bias = al.randn({ 1, 3, 8, 8 }) }):find("core_attention_bias: not supported", 1, true))
    assert.truthy(err_of(al.cp.attention_forward, args { qkv_format = "thd", query_layer = { al.randn({ 8, 3, 8 }), al.randn({ 8, 3, 8 }) },
      key_layer = { al.randn({ 8, 3, 8 }), al.randn({ 8, 3, 8 }) }, value_layer = { al.randn({ 8, 3, 8 }), al.randn({ 8, 3, 8 }) },
      cu_seqlens_q = { 0, 16 } }):find("cu_seqlens_q_padded: required", 1, true))
    assert.truthy(err_of(al.cp.attention_forward, args { qkv_format = "thd", query_layer = { al.randn({ 8, 3, 8 }), al.randn({ 8, 3, 8 }) },
      key_layer = { al.randn({ 8, 3, 8 }), al.randn({ 8, 3, 8 }) }, value_layer = { al.randn({ 8, 3, 8 }), al.randn({ 8, 3, 8 }) },
      cu_seqlens_q = { 0, 5, 16 }, cu_seqlens_q_padded = { 0, 6, 16 } }):find("sequence 1 has padded length 6, which must be divisible by 2*cp_size = 4", 1, true))
    local _, ctx = al.cp.attention_forward(args())
    assert.truthy(err_of(al.cp.attention_backward, ctx, { al.randn({ 1, 4, 24 }) }):find("douts[2]", 1, true))
    assert.truthy(err_of(al.cp.attention_backward, {}, {}):find("ctx: expected", 1, true))
  end)

  it("a2a passes a sliding window through (equal to single-process attention)", function()
    al.manual_seed(21)
    local q, k, v = al.randn({ 1, 16, 2, 8 }, { dtype = "f64" }), al.randn({ 1, 16, 2, 8 }, { dtype = "f64" }), al.randn({ 1, 16, 2, 8 }, { dtype = "f64" })
    local ref = al.attention.forward { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd", attn_mask_type = "causal",
      window_size = { 3, 0 }, compute_dtype = "f64" }
    local so = { cp_size = 2, qkv_format = "bshd" }
    local outs = al.cp.attention_forward { group = al.cp.SimGroup(2), cp_comm_type = "a2a", qkv_format = "bshd", attn_mask_type = "causal",
      window_size = { 3, 0 }, compute_dtype = "f64", query_layer = al.cp.split(q, so), key_layer = al.cp.split(k, so), value_layer = al.cp.split(v, so) }
    assert.is_true(al.max_abs_diff(al.cp.gather(outs, so), ref) < 1e-12)
  end)

  it("init: single process without options, or a launcher environment without NCCL, is an error saying what is missing", function()
    assert.truthy(err_of(al.cp.init):find("sim = n", 1, true))
    assert.equals("sim", al.cp.init { sim = 3 }.kind)
    local lib, why = al.cp.nccl_version()
    if lib == nil then assert.truthy(tostring(why):find("libnccl", 1, true)) else assert.is_true(lib >= 20000) end
  end)
end)

describe("context parallelism on one GPU (SimGroup) #gpu", function()
  for _, backend in ipairs { "flash", "fused" } do
    it(backend .. ": bf16 p2p (overlapped and not), all_gather, a2a within TE's CP tolerances", function()
      if not HAS_GPU then pending("no GPU") return end
      for _, comm in ipairs { "p2p", "all_gather", "a2a" } do
        for _, fmt in ipairs { "bshd", "sbhd", "thd" } do
          for _, gqa in ipairs { false, true } do
            for _, mask in ipairs { "no_mask", "causal" } do
              for _, overlap in ipairs(comm == "p2p" and { true, false } or { true }) do
                al.manual_seed(31)
                local o = { b = 2, s = 512, h = 8, hg = gqa and 2 or 8, d = 64, L = { 500, 256, 1 }, P = { 512, 256, 128 } }
                local tol = gqa and 3.5e-2 or 2.5e-2
                local ok, d = pcall(compare, comm, fmt, mask, 2, o, "bf16", { device = "cuda", backend = backend, overlap = overlap })
                if not ok and tostring(d):find("cannot serve", 1, true) then
                  print("skipped: " .. backend .. " " .. comm .. " " .. fmt .. ": " .. tostring(d))
                else
                  assert(ok, d)
                  -- TE's check: |a - b| <= atol + rtol*|b| with atol = rtol = tol
                  for _, n in ipairs { "out", "query_layer", "key_layer", "value_layer" } do
                    local a, b = n == "out" and d.out_t or d[n .. "_t"], n == "out" and d.ref or d[n .. "_ref"]
                    assert(al.allclose(a:to("f32"), b:to("f32"), { atol = tol, rtol = tol }),
                      string.format("%s %s %s %s %s overlap=%s: %s max diff %.3e", backend, comm, fmt, mask, gqa and "GQA" or "MHA",
                        tostring(overlap), n, d[n]))
                  end
                end
              end
            end
          end
        end
      end
    end)
  end
end)

describe("DotProductAttention with cp_group and cp_stream on one GPU (SimGroup) #gpu", function()
  it("bf16 p2p through the module with a caller's cp_stream equals the plain module (TE's CP tolerance)", function()
    if not HAS_GPU then pending("no GPU") return end
    al.manual_seed(51)
    local o = { dtype = "bf16", device = "cuda" }
    local q, k, v = al.randn({ 2, 512, 8, 64 }, o), al.randn({ 2, 512, 8, 64 }, o), al.randn({ 2, 512, 8, 64 }, o)
    local cfg = { num_attention_heads = 8, kv_channels = 64, qkv_format = "bshd", attn_mask_type = "causal" }
    local plain = al.DotProductAttention(cfg)
    local ref = plain:forward { query_layer = q, key_layer = k, value_layer = v }
    local dout = al.randn(ref:size(), o)
    local rg = plain:backward(nil, dout)
    local dpa = al.DotProductAttention(cfg)
    dpa:set_context_parallel_group(al.cp.SimGroup(2), { 0, 1 }, al.cuda.Stream(0), "p2p")
    local so = { cp_size = 2, qkv_format = "bshd" }
    local inp = { query_layer = al.cp.split(q, so), key_layer = al.cp.split(k, so), value_layer = al.cp.split(v, so) }
    local outs = dpa:forward(inp)
    local gr = dpa:backward(inp, al.cp.split(dout, so))
    al.cuda.synchronize(0)
    assert.is_true(al.allclose(al.cp.gather(outs, so):to("f32"), ref:to("f32"), { atol = 2.5e-2, rtol = 2.5e-2 }))
    for _, n in ipairs(GRADS) do
      assert.is_true(al.allclose(al.cp.gather(gr[n], so):to("f32"), rg[n]:to("f32"), { atol = 2.5e-2, rtol = 2.5e-2 }), n)
    end
  end)
end)

describe("context parallelism through NCCL (one process, >= 2 GPUs) #gpu", function()
  it("NcclGroup{devices} collectives and p2p/all_gather/a2a attention equal single-GPU attention (bf16)", function()
    if not HAS_GPU or al.cuda.device_count() < 2 then pending("needs >= 2 GPUs (found " .. (HAS_GPU and al.cuda.device_count() or 0) .. ")") return end
    local lib, why = al.cp.nccl_version()
    if not lib then pending("NCCL not loadable: " .. tostring(why)) return end
    local n = al.cuda.device_count() >= 4 and 4 or 2
    local devs = {}
    for i = 1, n do devs[i] = i - 1 end
    local g = al.cp.NcclGroup { devices = devs }
    -- collectives: all_reduce and sendrecv against the same ops on the host
    local xs = {}
    for r = 1, n do xs[r] = al.full({ 3 }, r, { dtype = "f32", device = "cuda:" .. (r - 1) }) end
    local s = g:all_reduce(xs)
    for r = 1, n do al.cuda.synchronize(r - 1) assert.same({ n * (n + 1) / 2, n * (n + 1) / 2, n * (n + 1) / 2 }, s[r]:cpu():totable()) end
    local rv = g:sendrecv((function() local t = {} for r = 1, n do t[r] = { xs[r] } end return t end)(), 1)
    for r = 1, n do al.cuda.synchronize(r - 1) assert.equals((r - 2) % n + 1, rv[r][1]:cpu():totable()[1]) end
    -- attention: per-rank inputs on their own GPU; reference on cuda:0
    for _, comm in ipairs { "p2p", "all_gather", "a2a" } do
      for _, mask in ipairs { "no_mask", "causal" } do
        al.manual_seed(41)
        local q = al.randn({ 2, 256 * n, 8, 64 }, { dtype = "bf16", device = "cuda:0" })
        local k = al.randn({ 2, 256 * n, 4, 64 }, { dtype = "bf16", device = "cuda:0" })
        local v = al.randn({ 2, 256 * n, 4, 64 }, { dtype = "bf16", device = "cuda:0" })
        local ref, rctx = al.attention.forward { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd", attn_mask_type = mask }
        local dout = al.randn(ref:size(), { dtype = "bf16", device = "cuda:0" })
        local rg = al.attention.backward(rctx, dout)
        local so = { cp_size = n, qkv_format = "bshd" }
        local function on_ranks(t) local p = al.cp.split(t, so) for r = 1, n do p[r] = p[r]:to("cuda:" .. (r - 1)) end return p end
        local outs, ctx = al.cp.attention_forward { group = g, cp_comm_type = comm, qkv_format = "bshd", attn_mask_type = mask,
          query_layer = on_ranks(q), key_layer = on_ranks(k), value_layer = on_ranks(v) }
        local gr = al.cp.attention_backward(ctx, on_ranks(dout))
        for r = 1, n do al.cuda.synchronize(r - 1) outs[r] = outs[r]:to("cuda:0") end
        local out = al.cp.gather(outs, so)
        assert(al.allclose(out:to("f32"), ref:to("f32"), { atol = 3.5e-2, rtol = 3.5e-2 }), comm .. " " .. mask .. " out")
        for _, nm in ipairs(GRADS) do
          local parts = {}
          for r = 1, n do parts[r] = gr[r][nm]:to("cuda:0") end
          assert(al.allclose(al.cp.gather(parts, so):to("f32"), rg[nm]:to("f32"), { atol = 3.5e-2, rtol = 3.5e-2 }), comm .. " " .. mask .. " " .. nm)
        end
      end
    end
    g:destroy()
  end)

  it("scripts/attnlab-launch -n 2 runs one process per GPU (NCCL id through a file)", function()
    if not HAS_GPU or al.cuda.device_count() < 2 then pending("needs >= 2 GPUs") return end
    if not al.cp.nccl_version() then pending("NCCL not loadable") return end
    local script = os.tmpname() .. ".lua"
    local f = assert(io.open(script, "w"))
    f:write([[
local g = al.cp.init()
local r = g.local_ranks[1]
local x = { [r] = al.full({ 4 }, r, { dtype = "f32", device = "cuda:" .. g:device_of(r) }) }
local s = g:all_reduce(x)
al.cuda.synchronize(g:device_of(r))
print("sum " .. s[r]:cpu():totable()[1])
g:barrier()
]])
    f:close()
    local p = io.popen("scripts/attnlab-launch -n 2 " .. script .. " 2>&1; echo rc=$?")
    local out = p:read("*a")
    p:close()
    os.remove(script)
    assert.truthy(out:find("[0] sum 3", 1, true), out)
    assert.truthy(out:find("[1] sum 3", 1, true), out)
    assert.truthy(out:find("rc=0", 1, true), out)
  end)
end)

-- The TE-style module entry: al.DotProductAttention{cp_group=, cp_global_ranks=, cp_stream=, cp_comm_type=} and
-- set_context_parallel_group; MultiheadAttention passes them to its core. Oracle: the same module without CP on the
-- full sequence (f64).
describe("DotProductAttention / MultiheadAttention with cp_group (SimGroup, CPU)", function()
  local function dpa_cfg(h, hg, d, fmt, mask, extra)
    local c = { num_attention_heads = h, num_gqa_groups = hg, kv_channels = d, qkv_format = fmt, attn_mask_type = mask,
      compute_dtype = "f64" }
    for k, v in pairs(extra or {}) do c[k] = v end
    return c
  end
  local function gather_all(list, so) return al.cp.gather(list, so) end

  -- plain module on the full sequence vs the CP module on shards; returns the max difference over out, dq, dk, dv
  local function dpa_compare(cp, comm, mask, o, setlater)
    al.manual_seed(200 + cp)
    local fmt = o.fmt or "bshd"
    local a = make_inputs(fmt, o, "f64", "cpu")
    local call = {}
    local so = { cp_size = cp, qkv_format = fmt }
    local rmask = mask
    if fmt == "thd" then
      rmask = mask == "causal" and "padding_causal" or "padding"
      call = { cu_seqlens_q = i32(a.cu), cu_seqlens_kv = i32(a.cu), cu_seqlens_q_padded = i32(a.cup), cu_seqlens_kv_padded = i32(a.cup) }
      so.cu_seqlens_padded = a.cup
    end
    local ref = al.DotProductAttention(dpa_cfg(o.h, o.hg, o.d, fmt, rmask))
    local rin = { query_layer = a.query_layer, key_layer = a.key_layer, value_layer = a.value_layer }
    for k, v in pairs(call) do rin[k] = v end
    local out = ref:forward(rin)
    local dout = al.randn(out:size(), { dtype = "f64" })
    local rg = ref:backward(rin, dout)
    local g = al.cp.SimGroup(cp)
    local dpa
    if setlater then
      dpa = al.DotProductAttention(dpa_cfg(o.h, o.hg, o.d, fmt, rmask))
      assert.equals(dpa, dpa:set_context_parallel_group(g, nil, nil, comm))
    else
      dpa = al.DotProductAttention(dpa_cfg(o.h, o.hg, o.d, fmt, rmask, { cp_group = g, cp_comm_type = comm }))
    end
    local cin = { query_layer = al.cp.split(a.query_layer, so), key_layer = al.cp.split(a.key_layer, so),
      value_layer = al.cp.split(a.value_layer, so) }
    for k, v in pairs(call) do cin[k] = v end
    local outs = dpa:forward(cin)
    assert.equals(cp, #outs)
    local gr = dpa:backward(cin, al.cp.split(dout, so))
    local worst = al.max_abs_diff(gather_all(outs, so), out)
    for _, n in ipairs(GRADS) do
      assert.equals(cp, #gr[n])
      worst = math.max(worst, al.max_abs_diff(gather_all(gr[n], so), rg[n]))
    end
    return worst, dpa, cin, out
  end

  it("forward/backward equal the plain module on the full sequence: cp = 2, 4 x p2p/all_gather/a2a x causal/no_mask (f64, 1e-10)", function()
    for _, cp in ipairs { 2, 4 } do
      for _, comm in ipairs { "p2p", "all_gather", "a2a" } do
        for _, mask in ipairs { "causal", "no_mask" } do
          local o = { b = 2, s = 4 * cp, h = 2 * cp, hg = cp, d = 8, dv = 8 }
          local w = dpa_compare(cp, comm, mask, o, mask == "no_mask")
          assert(w <= 1e-10, string.format("cp=%d %s %s: max diff %.3e", cp, comm, mask, w))
        end
      end
    end
  end)

  it("thd with the global cu_seqlens passed per call (p2p, a2a; padding_causal and padding)", function()
    for _, comm in ipairs { "p2p", "a2a" } do
      for _, mask in ipairs { "causal", "no_mask" } do
        local o = { fmt = "thd", h = 4, hg = 2, d = 8, L = { 7, 1, 0 }, P = { 8, 4, 4 } }
        local w = dpa_compare(2, comm, mask, o)
        assert(w <= 1e-10, string.format("thd %s %s: max diff %.3e", comm, mask, w))
      end
    end
  end)

  it("set_context_parallel_group(nil) switches back to the plain path; a SimGroup(1) takes and returns tensors", function()
    local o = { b = 1, s = 8, h = 2, hg = 2, d = 8 }
    local w, dpa, cin, out = dpa_compare(2, "p2p", "causal", o, true)
    assert.is_true(w <= 1e-10)
    assert.truthy(tostring(dpa):find("cp=p2p over 2 ranks", 1, true))
    dpa:set_context_parallel_group(nil)
    assert.is_nil(dpa.cp_group)
    assert.is_nil(tostring(dpa):find("cp=", 1, true))
    local full = { query_layer = al.cp.gather(cin.query_layer, { cp_size = 2, qkv_format = "bshd" }),
      key_layer = al.cp.gather(cin.key_layer, { cp_size = 2, qkv_format = "bshd" }),
      value_layer = al.cp.gather(cin.value_layer, { cp_size = 2, qkv_format = "bshd" }) }
    local y = dpa:forward(full)
    assert.is_true(al.is_tensor(y))
    assert.equals(0, al.max_abs_diff(y, out))
    assert.is_nil(dpa.ctx.cp)
    -- one local rank: plain tensors in and out (the multi-process form), equal to the plain module
    dpa:set_context_parallel_group(al.cp.SimGroup(1), { 5 }, nil, "all_gather")
    assert.same({ 5 }, dpa.cp_global_ranks)
    local y1 = dpa:forward(full)
    assert.is_true(al.is_tensor(y1))
    assert.is_true(al.max_abs_diff(y1, out) <= 1e-12)
    local dout = al.randn(y1:size(), { dtype = "f64" })
    local g1 = dpa:backward(full, dout)
    assert.is_true(al.is_tensor(g1.query_layer))
    dpa:set_context_parallel_group(nil)
    dpa:forward(full)
    local g0 = dpa:backward(full, dout)
    for _, n in ipairs(GRADS) do assert.is_true(al.max_abs_diff(g1[n], g0[n]) <= 1e-12, n) end
  end)

  it("errors: list lengths, mixed lists and tensors, unsupported settings (same messages as al.cp), bad groups", function()
    al.manual_seed(5)
    local g = al.cp.SimGroup(2)
    local function t() return al.randn({ 1, 4, 2, 8 }) end
    local function inp() return { query_layer = { t(), t() }, key_layer = { t(), t() }, value_layer = { t(), t() } } end
    local function mk(extra) return al.DotProductAttention(dpa_cfg(2, 2, 8, "bshd", "causal", extra)) end
    local dpa = mk { cp_group = g }
    local bad = inp()
    bad.key_layer[3] = t()
    assert.truthy(err_of(dpa.forward, dpa, bad):find("DotProductAttention:forward: key_layer: expected a list of 2 tensors (one per rank of cp_group), got 3", 1, true))
    bad = inp()
    bad.value_layer = t()
    assert.truthy(err_of(dpa.forward, dpa, bad):find("mixing per-rank lists and tensors", 1, true))
    assert.truthy(err_of(dpa.forward, dpa, { query_layer = t(), key_layer = t(), value_layer = t() })
      :find("cp_group drives 2 ranks in this process", 1, true))
    assert.truthy(err_of(dpa.forward, dpa, { qkv_layer = al.randn({ 1, 4, 3, 2, 8 }) }):find("DotProductAttention:forward: qkv_layer: not supported with context parallelism", 1, true))
    assert.truthy(err_of(dpa.forward, dpa, { query_layer = { al.randn({ 1, 4, 2, 4 }), al.randn({ 1, 4, 2, 4 }) }, key_layer = { t(), t() }, value_layer = { t(), t() } })
      :find("head dim must equal kv_channels d_qk = 8", 1, true))
    -- module settings al.cp does not support: its messages, under the module's name
    local a = inp()
    assert.truthy(err_of(mk { cp_group = g, window_size = { 2, 0 } }.forward, mk { cp_group = g, window_size = { 2, 0 } }, a)
      :find("DotProductAttention:forward: window_size: sliding windows are only supported with cp_comm_type = 'a2a'", 1, true))
    local m = mk { cp_group = g, attention_dropout = 0.1 }
    assert.truthy(err_of(m.forward, m, a):find("attention_dropout: dropout is not supported with context parallelism", 1, true))
    m:evaluate() -- no dropout in evaluation mode: allowed
    assert.equals(2, #m:forward(a))
    m = mk { cp_group = g, softmax_type = "learnable" }
    assert.truthy(err_of(m.forward, m, a):find("softmax_type: only 'vanilla' is supported with context parallelism", 1, true))
    m = mk { cp_group = g, return_max_logit = true }
    assert.truthy(err_of(m.forward, m, a):find("return_max_logit: not supported with context parallelism", 1, true))
    m = mk { cp_group = g, mask_mod = function(b, h, qi, ki) return al.ge(qi, ki) end }
    assert.truthy(err_of(m.forward, m, a):find("mask_mod: not supported with context parallelism", 1, true))
    assert.truthy(err_of(dpa.forward, dpa, { query_layer = a.query_layer, key_layer = a.key_layer, value_layer = a.value_layer,
      attn_mask_type = "causal_bottom_right" }):find("DotProductAttention:forward: attn_mask_type", 1, true))
    assert.truthy(err_of(dpa.forward, dpa, { query_layer = a.query_layer, key_layer = a.key_layer, value_layer = a.value_layer,
      inference_params = {} }):find("inference_params: a KV cache is not supported with context parallelism", 1, true))
    -- construction and set_context_parallel_group
    assert.truthy(err_of(mk, { cp_group = 3 }):find("DotProductAttention: cp_group: expected an al.cp.SimGroup", 1, true))
    assert.truthy(err_of(mk, { cp_group = g, cp_comm_type = "ring" }):find("cp_comm_type: expected 'p2p', 'all_gather' or 'a2a', got ring", 1, true))
    assert.truthy(err_of(mk, { cp_group = g, cp_comm_type = "a2a+p2p" }):find("not implemented", 1, true))
    assert.truthy(err_of(dpa.set_context_parallel_group, dpa, g, { 0 }):find("cp_global_ranks: expected a list of 2 distinct global ranks", 1, true))
    assert.truthy(err_of(dpa.set_context_parallel_group, dpa, g, { 1, 1 }):find("cp_global_ranks", 1, true))
    assert.truthy(err_of(dpa.set_context_parallel_group, dpa, g, nil, 7):find("cp_stream: expected an al.cuda.Stream", 1, true))
    assert.truthy(err_of(dpa.forward, mk { cp_group = g, cp_stream = { 1 } }, a):find("cp_stream: expected an al.cuda.Stream or a list", 1, true))
    -- a2a's head divisibility, through the module
    m = mk { cp_group = al.cp.SimGroup(4), cp_comm_type = "a2a" }
    local four = {}
    for r = 1, 4 do four[r] = al.randn({ 1, 2, 2, 8 }) end
    assert.truthy(err_of(m.forward, m, { query_layer = four, key_layer = four, value_layer = four }):find("divisible by cp_size = 4", 1, true))
    -- backward: grad_output in the forward's form
    dpa:forward(a)
    assert.truthy(err_of(dpa.backward, dpa, a, al.randn({ 1, 4, 16 })):find("grad_output: the forward took per-rank lists", 1, true))
    assert.truthy(err_of(dpa.backward, dpa, a, { al.randn({ 1, 4, 16 }) }):find("grad_output: expected a list of 2 tensors", 1, true))
    assert.truthy(err_of(dpa.backward, dpa, inp(), { al.randn({ 1, 4, 16 }), al.randn({ 1, 4, 16 }) }):find("differs from the forward's input", 1, true))
  end)

  -- MultiheadAttention: the same parameters with and without CP; params' gradients summed over the ranks
  local function mha_compare(cp, comm, fmt, mask, extra)
    al.manual_seed(300 + cp)
    local hidden = 32
    local cfg = { hidden_size = hidden, num_attention_heads = 4, num_gqa_groups = (comm == "a2a" and cp == 4) and 4 or 2,
      qkv_format = fmt, attn_mask_type = mask, attention_dropout = 0, input_layernorm = true, rotary = true,
      qk_norm_type = "RMSNorm", params_dtype = "f64", compute_dtype = "f64" }
    for k, v in pairs(extra or {}) do cfg[k] = v end
    local ref = al.nn.MultiheadAttention(cfg)
    cfg.cp_group, cfg.cp_comm_type = al.cp.SimGroup(cp), comm
    local m = al.nn.MultiheadAttention(cfg)
    local pr, pm = ref:parameters(), m:parameters()
    for i = 1, #pr do
      local t = al.randn(pr[i]:size(), { dtype = "f64" }) * 0.3 -- random weights and biases (not TE's zeros)
      pr[i]:copy_(t)
      pm[i]:copy_(t)
    end
    local so, call = { cp_size = cp, qkv_format = fmt }, {}
    local x
    if fmt == "thd" then
      local cup, cu = { 0, 4 * cp, 6 * cp }, { 0, 4 * cp - 1, 4 * cp + 1 }
      x = al.randn({ cup[3], hidden }, { dtype = "f64" })
      so.cu_seqlens_padded = cup
      call = { cu_seqlens_q = i32(cu), cu_seqlens_kv = i32(cu), cu_seqlens_q_padded = i32(cup), cu_seqlens_kv_padded = i32(cup),
        attn_mask_type = mask == "causal" and "padding_causal" or "padding" }
    else
      x = al.randn(fmt == "bshd" and { 2, 8 * cp, hidden } or { 8 * cp, 2, hidden }, { dtype = "f64" })
    end
    local rin, cin = { hidden_states = x }, { hidden_states = al.cp.split(x, so) }
    for k, v in pairs(call) do rin[k], cin[k] = v, v end
    local y = ref:forward(rin)
    local dy = al.randn(y:size(), { dtype = "f64" })
    local dx = ref:backward(rin, dy)
    local ys = m:forward(cin)
    local dxs = m:backward(cin, al.cp.split(dy, so))
    local worst = math.max(al.max_abs_diff(al.cp.gather(ys, so), y), al.max_abs_diff(al.cp.gather(dxs, so), dx))
    local _, gref = ref:parameters()
    local _, gm = m:parameters()
    assert.equals(#gref, #gm)
    for i = 1, #gref do worst = math.max(worst, al.max_abs_diff(gm[i], gref[i])) end
    return worst, m
  end

  it("MultiheadAttention (layernorm, RoPE, QK-norm, GQA): output, dx and every parameter gradient equal the plain module (f64, 1e-10)", function()
    for _, cp in ipairs { 2, 4 } do
      for _, comm in ipairs { "p2p", "all_gather", "a2a" } do
        for _, fmt in ipairs(cp == 2 and { "bshd", "sbhd", "thd" } or { "bshd", "thd" }) do
          local w = mha_compare(cp, comm, fmt, "causal")
          assert(w <= 1e-10, string.format("MHA cp=%d %s %s: max diff %.3e", cp, comm, fmt, w))
        end
      end
    end
    local w = mha_compare(2, "p2p", "bshd", "no_mask", { rotary = false, qk_norm_type = false })
    assert(w <= 1e-10, string.format("MHA no_mask, no RoPE: max diff %.3e", w))
  end)

  it("MultiheadAttention: RoPE uses the global positions (a shard rotated by its local ones would differ)", function()
    -- the CP module with positions of the contiguous split on DualChunkSwap shards: must not match
    local w = mha_compare(2, "p2p", "bshd", "causal")
    assert.is_true(w <= 1e-10)
    local ok, e = pcall(function()
      local cp = 2
      al.manual_seed(302)
      local m = al.nn.MultiheadAttention { hidden_size = 32, num_attention_heads = 4, qkv_format = "bshd", attention_dropout = 0,
        rotary = true, params_dtype = "f64", compute_dtype = "f64" }
      local ref = al.nn.MultiheadAttention { hidden_size = 32, num_attention_heads = 4, qkv_format = "bshd", attention_dropout = 0,
        rotary = true, params_dtype = "f64", compute_dtype = "f64" }
      local pr, pm = ref:parameters(), m:parameters()
      for i = 1, #pr do local t = al.randn(pr[i]:size(), { dtype = "f64" }) pr[i]:copy_(t) pm[i]:copy_(t) end
      m:set_context_parallel_group(al.cp.SimGroup(cp))
      local x = al.randn({ 1, 16, 32 }, { dtype = "f64" })
      local y = ref:forward(x)
      -- shards cut DualChunkSwap but declared contiguous: positions (and the attention's chunk order) are wrong
      local ys = m:forward { hidden_states = al.cp.split(x, { cp_size = cp, qkv_format = "bshd" }), load_balance = "contiguous" }
      return al.max_abs_diff(al.cp.gather(ys, { cp_size = cp, qkv_format = "bshd" }), y)
    end)
    assert.is_true(ok, tostring(e))
    assert.is_true(e > 1e-3)
  end)

  it("MultiheadAttention errors with cp_group: cross-attention, a tensor for several local ranks, list length", function()
    al.manual_seed(6)
    local g = al.cp.SimGroup(2)
    local m = al.nn.MultiheadAttention { hidden_size = 16, num_attention_heads = 2, qkv_format = "bshd", attention_dropout = 0, cp_group = g }
    assert.truthy(err_of(m.forward, m, al.randn({ 1, 8, 16 })):find("hidden_states: cp_group drives 2 ranks", 1, true))
    assert.truthy(err_of(m.forward, m, { hidden_states = { al.randn({ 1, 4, 16 }) } }):find("expected a list of 2 tensors", 1, true))
    local xs = { al.randn({ 1, 4, 16 }), al.randn({ 1, 4, 16 }) }
    local ys = m:forward(xs) -- a bare per-rank list
    assert.equals(2, #ys)
    assert.truthy(err_of(m.backward, m, xs, al.randn({ 1, 4, 16 })):find("grad_output: the forward took per-rank lists", 1, true))
    assert.equals(2, #m:backward(xs, { al.randn({ 1, 4, 16 }), al.randn({ 1, 4, 16 }) }))
    local md = al.nn.MultiheadAttention { hidden_size = 16, num_attention_heads = 2, qkv_format = "bshd", cp_group = g }
    assert.truthy(err_of(md.forward, md, xs):find("attention_dropout: dropout is not supported with context parallelism", 1, true))
    local c = al.nn.MultiheadAttention { hidden_size = 16, num_attention_heads = 2, qkv_format = "bshd", attention_dropout = 0,
      attention_type = "cross" }
    c:set_context_parallel_group(g)
    assert.truthy(err_of(c.forward, c, { hidden_states = xs, encoder_output = xs }):find("attention_type = 'cross' with context parallelism", 1, true))
    local r = al.nn.MultiheadAttention { hidden_size = 16, num_attention_heads = 2, qkv_format = "thd", attention_dropout = 0,
      rotary = true, cp_group = g }
    assert.truthy(err_of(r.forward, r, { hidden_states = { al.randn({ 4, 16 }), al.randn({ 4, 16 }) }, cu_seqlens_q = { 0, 8 } })
      :find("needs cu_seqlens_q_padded", 1, true))
    -- off again: the plain path with a tensor
    m:set_context_parallel_group(nil)
    assert.same({ 1, 8, 16 }, m:forward(al.randn({ 1, 8, 16 })):size())
  end)
end)
