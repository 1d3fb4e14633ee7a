-- al.nn.InferenceParams (KV cache): prefill with thd then decoding one token at a time equals
-- attention over the full sequences (DPA level and MultiheadAttention with RoPE, GQA and QK-norm),
-- with sequences finishing and joining mid-way; paged storage equals non-paged bit for bit; packed
-- inputs and non-padding masks are refused with TE's messages.
package.path = "tests/spec/?.lua;" .. package.path
local al = require "attnlab"

local H, HG, D = 4, 2, 8
local TOL = 2e-6     -- f32 on the CPU (TE's fp16 tolerance is 1e-3)

-- full-sequence reference: per sequence, causal attention over all its tokens -> [L, h*d] rows
local function reference(q, k, v)
  local out = al.attention.forward{ query_layer = q:unsqueeze(1), key_layer = k:unsqueeze(1), value_layer = v:unsqueeze(1),
    qkv_format = "bshd", attn_mask_type = "causal" }
  return out:select(1, 1)
end

-- A schedule of steps: each step a list of {seq_id, step_len}; seq 40 joins late, seq 20 finishes early.
local LENS = { [10] = 8, [20] = 4, [30] = 10, [40] = 5 }
local SCHEDULE = {
  { { 10, 3 }, { 20, 2 }, { 30, 4 } },          -- prefill (thd)
  { { 10, 1 }, { 20, 1 }, { 30, 1 } },
  { { 10, 1 }, { 20, 1 }, { 30, 1 }, { 40, 3 } }, -- 40 joins with a prefill of 3
  { { 10, 1 }, { 30, 1 }, { 40, 1 } },          -- 20 has finished (4 tokens)
  { { 30, 1 }, { 10, 1 }, { 40, 1 } },          -- order changes: the cache follows
  { { 10, 1 }, { 30, 1 } },
  { { 30, 1 } },
}

local function make_data(dev)
  al.manual_seed(77)
  local data = {}
  for _, id in ipairs({ 10, 20, 30, 40 }) do
    local L = LENS[id]
    data[id] = { q = al.randn({ L, H, D }, { device = dev }), k = al.randn({ L, HG, D }, { device = dev }),
      v = al.randn({ L, HG, D }, { device = dev }) }
  end
  return data
end

-- Run the schedule through al.inference.forward; returns outputs[id][pos] = row tensor [h*d].
-- fwd (optional): replaces al.inference.forward (e.g. a DotProductAttention's forward); it gets the
-- arguments without attn_mask_type when `module_mask` is set (the module supplies it).
local function decode(data, ip_cfg, fmt, fwd, module_mask)
  local ip = al.nn.InferenceParams(ip_cfg)
  local got, done = {}, {}
  for _, step in ipairs(SCHEDULE) do
    ip:pre_step(step)
    local b = #step
    local maxlen = 0
    for _, e in ipairs(step) do maxlen = math.max(maxlen, e[2]) end
    local use_bshd = fmt == "bshd" and maxlen == 1
    local total = 0
    for _, e in ipairs(step) do total = total + e[2] end
    local dev = ip_cfg.device
    -- head counts, head dim and dtype come from the data (the GPU backends' test uses d = 64, bf16)
    local any = data[step[1][1]]
    local h, hg, d = any.q:size(2), any.k:size(2), any.q:size(3)
    local o = { device = dev, dtype = any.q:dtype() }
    local q = al.zeros(use_bshd and { b, 1, h, d } or { total, h, d }, o)
    local k = al.zeros(use_bshd and { b, 1, hg, d } or { total, hg, d }, o)
    local v = al.zeros(use_bshd and { b, 1, hg, d } or { total, hg, d }, o)
    local row = 0
    for i, e in ipairs(step) do
      local id, len = e[1], e[2]
      local start = (done[id] or 0) + 1
      local dst = function(t) return use_bshd and t:select(1, i) or t:narrow(1, row + 1, len) end
      dst(q):copy_(data[id].q:narrow(1, start, len))
      dst(k):copy_(data[id].k:narrow(1, start, len))
      dst(v):copy_(data[id].v:narrow(1, start, len))
      row = row + len
    end
    local args = { query_layer = q, key_layer = k, value_layer = v, inference_params = ip,
      qkv_format = use_bshd and "bshd" or "thd", attn_mask_type = (not module_mask) and "padding_causal" or nil }
    local out = (fwd or al.inference.forward)(args)
    row = 0
    for i, e in ipairs(step) do
      local id, len = e[1], e[2]
      got[id] = got[id] or {}
      for j = 1, len do
        got[id][(done[id] or 0) + j] = use_bshd and out:select(1, i):select(1, 1) or out:select(1, row + j)
      end
      row = row + len
      done[id] = (done[id] or 0) + len
    end
  end
  return got, ip
end

local function check_against_reference(data, got, tol)
  local worst, n = 0, 0
  for id, d in pairs(data) do
    local ref = reference(d.q:cpu():to("f32"), d.k:cpu():to("f32"), d.v:cpu():to("f32"))
    local L = LENS[id]
    for pos = 1, L do
      local r = got[id][pos]
      assert(r, "no output for sequence " .. id .. " position " .. pos)
      local e = al.max_abs_diff(r:cpu():to("f32"), ref:select(1, pos))
      if e > worst then worst = e end
      n = n + 1
    end
  end
  assert.equal(27, n)
  assert.is_true(worst < tol, "max |decode - full| = " .. worst)
end

local NONPAGED = { max_batch_size = 4, max_sequence_length = 10, num_heads_kv = HG, head_dim_k = D, dtype = "f32" }
local PAGED = { max_batch_size = 4, max_sequence_length = 10, num_heads_kv = HG, head_dim_k = D, dtype = "f32",
  is_paged = true, page_size = 2, total_num_pages = 14 }

describe("InferenceParams (KV cache)", function()
  it("prefill with thd then decoding one token at a time equals full attention (non-paged, sequences join and finish)", function()
    local data = make_data()
    local got = decode(data, NONPAGED, "thd")
    check_against_reference(data, got, TOL)
  end)

  it("paged storage equals non-paged bit for bit, and pages go back to the free list", function()
    local data = make_data()
    local a = decode(data, NONPAGED, "thd")
    local b, ip = decode(data, PAGED, "thd")
    for id, rows in pairs(a) do
      for pos, r in ipairs(rows) do assert.equal(0, al.max_abs_diff(r, b[id][pos])) end
    end
    check_against_reference(data, b, TOL)
    -- only sequence 30 is left (10 tokens -> 5 pages of 2); every other page is free again
    assert.are.same({ 30 }, ip.seq_ids)
    assert.equal(14 - 5, #ip.free_pages)
    local pt = ip:page_table()
    assert.are.same({ 1, 5 }, pt:size())
    local row = pt:flat_values()
    for j = 1, 5 do assert.is_true(row[j] >= 0 and row[j] < 14) end
  end)

  it("decoding with bshd queries [b, 1, h, d] equals the thd decode", function()
    local data = make_data()
    local a = decode(data, NONPAGED, "thd")
    local b = decode(data, PAGED, "bshd")
    for id, rows in pairs(a) do
      for pos, r in ipairs(rows) do assert.is_true(al.max_abs_diff(r, b[id][pos]) < 1e-6) end
    end
  end)

  it("pre_step keeps TE's bookkeeping: lengths, cu_seqlens, order, compaction", function()
    local ip = al.nn.InferenceParams(NONPAGED)
    ip:pre_step{ [5] = 3, [2] = 4 }                      -- map form: ids in ascending order
    assert.are.same({ 2, 5 }, ip.seq_ids)
    assert.are.same({ 0, 4, 7 }, ip.cu_seqlens_q:flat_values())
    assert.are.same({ 0, 4, 7 }, ip.cu_seqlens_kv:flat_values())
    local k = al.randn({ 7, HG, D })
    ip:step(1, k, k, "thd")
    ip:pre_step{ { 5, 1 } }                              -- 2 finished: 5 moves to slot 1
    assert.are.same({ 3 }, ip:get_seqlens_pre_step())
    assert.are.same({ 0, 4 }, ip.cu_seqlens_kv:flat_values())
    local c = ip.caches[1].k
    assert.equal(0, al.max_abs_diff(c:select(1, 1):narrow(1, 1, 3), k:narrow(1, 5, 3)))
    assert.equal(0, c:select(1, 2):abs():max())
  end)

  describe("MultiheadAttention with a KV cache", function()
    for _, paged in ipairs({ false, true }) do
      it("GQA + RoPE + QK-norm, thd prefill then decode, equals the full forward" .. (paged and " (paged)" or ""), function()
        al.manual_seed(5)
        local m = al.nn.MultiheadAttention{ hidden_size = 16, num_attention_heads = 4, num_gqa_groups = 2, qkv_format = "thd",
          attn_mask_type = "padding_causal", attention_dropout = 0, rotary = true, qk_norm_type = "RMSNorm",
          input_layernorm = true, layer_number = 3 }
        local lens = { 6, 4 }
        local x = { al.randn({ 6, 16 }), al.randn({ 4, 16 }) }
        -- reference: the whole sequences in one thd batch
        local full = al.empty({ 10, 16 })
        full:narrow(1, 1, 6):copy_(x[1]); full:narrow(1, 7, 4):copy_(x[2])
        local cu = al.tensor({ 0, 6, 10 }, { dtype = "i32" })
        local ref = m:forward{ hidden_states = full, cu_seqlens_q = cu, cu_seqlens_kv = cu }
        local cfg = { max_batch_size = 2, max_sequence_length = 8, num_heads_kv = 2, head_dim_k = 4, dtype = "f32" }
        if paged then cfg.is_paged, cfg.page_size, cfg.total_num_pages = true, 3, 6 end
        local ip = al.nn.InferenceParams(cfg)
        local pos = { 0, 0 }
        local steps = { { 3, 2 }, { 1, 1 }, { 1, 1 }, { 1, 0 } }
        local worst = 0
        for _, st in ipairs(steps) do
          local list = {}
          for i = 1, 2 do if st[i] > 0 then list[#list + 1] = { i, st[i] } end end
          ip:pre_step(list)
          local total = 0
          for _, e in ipairs(list) do total = total + e[2] end
          local h = al.empty({ total, 16 })
          local r = 0
          for _, e in ipairs(list) do
            h:narrow(1, r + 1, e[2]):copy_(x[e[1]]:narrow(1, pos[e[1]] + 1, e[2]))
            r = r + e[2]
          end
          local ws, out = al.warnings.capture(function() return m:forward{ hidden_states = h, inference_params = ip } end)
          assert.equal(0, #ws)
          r = 0
          for _, e in ipairs(list) do
            local off = e[1] == 1 and 0 or 6
            local d = al.max_abs_diff(out:narrow(1, r + 1, e[2]), ref:narrow(1, off + pos[e[1]] + 1, e[2]))
            if d > worst then worst = d end
            r = r + e[2]
            pos[e[1]] = pos[e[1]] + e[2]
          end
        end
        assert.are.same(lens, pos)
        assert.is_true(worst < 1e-5, "max |decode - full| = " .. worst)
        assert.is_truthy(ip.caches[3])                  -- the cache of layer_number 3
        assert.has_error(function() m:backward({ hidden_states = al.randn({ 1, 16 }) }, al.randn({ 1, 16 })) end)
      end)
    end

    it("bshd module: decode [b, 1, hidden] steps equal the full causal forward", function()
      al.manual_seed(8)
      local m = al.nn.MultiheadAttention{ hidden_size = 16, num_attention_heads = 2, qkv_format = "bshd",
        attention_dropout = 0, rotary = { interleaved = true } }
      local x = al.randn({ 2, 5, 16 })
      local ref = m:forward(x)
      local ip = al.nn.InferenceParams{ max_batch_size = 2, max_sequence_length = 5, num_heads_kv = 2, head_dim_k = 8 }
      ip:pre_step{ { 1, 2 }, { 2, 2 } }
      local out = m:forward{ hidden_states = x:narrow(2, 1, 2), inference_params = ip, attn_mask_type = "padding_causal" }
      assert.is_true(al.max_abs_diff(out, ref:narrow(2, 1, 2)) < 1e-5)
      for t = 3, 5 do
        ip:pre_step{ { 1, 1 }, { 2, 1 } }
        out = m:forward{ hidden_states = x:narrow(2, t, 1), inference_params = ip, attn_mask_type = "padding_causal" }
        assert.is_true(al.max_abs_diff(out, ref:narrow(2, t, 1)) < 1e-5)
      end
    end)
  end)

  it("sbhd module with MQA and RoPE: prefill [3, b, hidden] then decode [1, b, hidden] equals the full forward (paged and not)", function()
    al.manual_seed(8)
    local m = al.nn.MultiheadAttention{ hidden_size = 16, num_attention_heads = 2, num_gqa_groups = 1, qkv_format = "sbhd",
      attention_dropout = 0, rotary = true }
    local x = al.randn({ 5, 2, 16 })
    local ref = m:forward(x)
    for _, paged in ipairs({ false, true }) do
      local ip = al.nn.InferenceParams{ max_batch_size = 2, max_sequence_length = 5, num_heads_kv = 1, head_dim_k = 8,
        is_paged = paged, page_size = 2, total_num_pages = 6 }
      ip:pre_step{ { 1, 3 }, { 2, 3 } }
      local out = m:forward{ hidden_states = x:narrow(1, 1, 3), inference_params = ip, attn_mask_type = "padding_causal" }
      assert.is_true(al.max_abs_diff(out, ref:narrow(1, 1, 3)) < 1e-5)
      for t = 4, 5 do
        ip:pre_step{ { 1, 1 }, { 2, 1 } }
        out = m:forward{ hidden_states = x:narrow(1, t, 1), inference_params = ip, attn_mask_type = "padding_causal" }
        assert.is_true(al.max_abs_diff(out, ref:narrow(1, t, 1)) < 1e-5)
      end
    end
  end)

  it("DotProductAttention:forward with inference_params equals al.inference.forward bit for bit (module settings apply)", function()
    local data = make_data()
    for _, cfg in ipairs({ NONPAGED, PAGED }) do
      for _, fmt in ipairs({ "thd", "bshd" }) do
        local a = decode(data, cfg, fmt)
        local dpa = al.DotProductAttention{ num_attention_heads = H, kv_channels = D, num_gqa_groups = HG,
          attention_dropout = 0.3, qkv_format = "thd", attn_mask_type = "padding_causal" }
        dpa:evaluate()
        local calls = 0
        local b = decode(data, cfg, fmt, function(args) calls = calls + 1 return dpa:forward(args) end, true)
        assert.equal(#SCHEDULE, calls)
        local n = 0
        for id, rows in pairs(a) do
          for pos, r in ipairs(rows) do
            assert.equal(0, al.max_abs_diff(r, b[id][pos]), "sequence " .. id .. " position " .. pos)
            n = n + 1
          end
        end
        assert.equal(27, n)
        check_against_reference(data, b, TOL)
        assert.has_error(function() dpa:backward(nil, al.randn({ 1, H * D })) end,
          "DotProductAttention:backward: the forward ran with inference_params (a KV cache): inference only")
      end
    end
    -- the module's mask is the one checked (a causal module without padding is refused, as TE)
    local ip = al.nn.InferenceParams(NONPAGED)
    ip:pre_step{ { 1, 2 } }
    local q, k = al.randn({ 2, H, D }), al.randn({ 2, HG, D })
    local causal = al.DotProductAttention{ num_attention_heads = H, kv_channels = D, num_gqa_groups = HG, qkv_format = "thd" }
    local ok, err = pcall(causal.forward, causal, { query_layer = q, key_layer = k, value_layer = k, inference_params = ip })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("KV caching requires padding mask!", 1, true), tostring(err))
    -- a module's softmax_scale reaches the cached attention
    local function one(scale)
      local ipx = al.nn.InferenceParams(NONPAGED)
      ipx:pre_step{ { 1, 2 } }
      local m = al.DotProductAttention{ num_attention_heads = H, kv_channels = D, num_gqa_groups = HG, qkv_format = "thd",
        attn_mask_type = "padding_causal", softmax_scale = scale }
      return m:forward{ query_layer = q, key_layer = k, value_layer = k, inference_params = ipx }
    end
    assert.is_true(al.max_abs_diff(one(0.05), one(1.5)) > 1e-3)
  end)

  it("DotProductAttention:forward refuses packed inputs with a KV cache with TE's message", function()
    local ip = al.nn.InferenceParams(NONPAGED)
    ip:pre_step{ { 1, 2 } }
    local dpa = al.DotProductAttention{ num_attention_heads = H, kv_channels = D, num_gqa_groups = HG, qkv_format = "thd",
      attn_mask_type = "padding_causal" }
    local msg = "packed inputs (qkv_layer/kv_layer) are not supported with KV caching (inference_params); " ..
      "pass separate query_layer, key_layer and value_layer tensors instead"
    local ok, err = pcall(dpa.forward, dpa, { qkv_layer = al.randn({ 2, 3, H, D }), inference_params = ip })
    assert.is_false(ok)
    assert.truthy(tostring(err):find(msg, 1, true), tostring(err))
    ok, err = pcall(dpa.forward, dpa, { query_layer = al.randn({ 2, H, D }), kv_layer = al.randn({ 2, 2, HG, D }),
      inference_params = ip })
    assert.is_false(ok)
    assert.truthy(tostring(err):find(msg, 1, true), tostring(err))
  end)

  it("refuses packed inputs with a KV cache with TE's message, and masks without padding", function()
    local ip = al.nn.InferenceParams(NONPAGED)
    ip:pre_step{ { 1, 2 } }
    local qkv = al.randn({ 2, 3, H, D })
    local msg = "packed inputs (qkv_layer/kv_layer) are not supported with KV caching (inference_params); " ..
      "pass separate query_layer, key_layer and value_layer tensors instead"
    local ok, err = pcall(al.inference.forward, { qkv_layer = qkv, qkv_format = "thd", inference_params = ip })
    assert.is_false(ok)
    assert.truthy(tostring(err):find(msg, 1, true), tostring(err))
    ok, err = pcall(al.attention.forward, { qkv_layer = qkv, qkv_format = "thd", inference_params = ip })
    assert.is_false(ok)
    assert.truthy(tostring(err):find(msg, 1, true), tostring(err))
    ok, err = pcall(al.inference.forward, { query_layer = al.randn({ 2, H, D }), kv_layer = al.randn({ 2, 2, HG, D }),
      qkv_format = "thd", inference_params = ip })
    assert.is_false(ok)
    assert.truthy(tostring(err):find(msg, 1, true), tostring(err))
    local q, k = al.randn({ 2, H, D }), al.randn({ 2, HG, D })
    ok, err = pcall(al.inference.forward, { query_layer = q, key_layer = k, value_layer = k, qkv_format = "thd",
      inference_params = ip, attn_mask_type = "causal" })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("KV caching requires padding mask!", 1, true), tostring(err))
  end)

  it("pre_step errors: beyond max_sequence_length, too many sequences, out of pages", function()
    local ip = al.nn.InferenceParams(NONPAGED)
    assert.has_error(function() ip:pre_step{ { 1, 11 } } end,
      "InferenceParams:pre_step: sequence 1 would reach 11 tokens, beyond max_sequence_length = 10")
    assert.has_error(function() ip:pre_step{ { 1, 1 }, { 2, 1 }, { 3, 1 }, { 4, 1 }, { 5, 1 } } end,
      "InferenceParams:pre_step: 5 sequences exceed max_batch_size = 4")
    local p = al.nn.InferenceParams{ max_batch_size = 2, max_sequence_length = 10, num_heads_kv = 1, head_dim_k = 2,
      is_paged = true, page_size = 4, total_num_pages = 3 }
    p:pre_step{ { 1, 8 } }
    assert.has_error(function() p:pre_step{ { 1, 1 }, { 2, 1 } } end,
      "InferenceParams:pre_step: out of pages (total_num_pages = 3, page_size = 4)")
  end)
end)

describe("InferenceParams on cuda #gpu", function()
  local function gpu_it(name, fn)
    if HAS_GPU then it(name, fn) else pending(name .. " (no GPU)") end
  end
  gpu_it("decode on cuda (non-paged and paged) equals the full attention and the CPU decode", function()
    local data = make_data("cuda")
    local cfg = {}
    for k, v in pairs(NONPAGED) do cfg[k] = v end
    cfg.device = "cuda"
    local got = decode(data, cfg, "thd")
    check_against_reference(data, got, 1e-3)
    local pcfg = {}
    for k, v in pairs(PAGED) do pcfg[k] = v end
    pcfg.device = "cuda"
    local pg = decode(data, pcfg, "thd")
    for id, rows in pairs(got) do
      for pos, r in ipairs(rows) do assert.is_true(al.max_abs_diff(r, pg[id][pos]) < 1e-6) end
    end
    local cpu = decode(make_data(), NONPAGED, "thd")
    for id, rows in pairs(got) do
      for pos, r in ipairs(rows) do assert.is_true(al.max_abs_diff(r, cpu[id][pos]) < 1e-3) end
    end
  end)
end)

-- The KV cache on each GPU backend that serves its calls (thd prefill + bshd/thd decode, padding_causal):
-- bf16 at d = 64 so that fused (cuDNN) and flash serve too; each forced, against the full-sequence
-- reference in f32 on the CPU (bf16 tolerance).
describe("InferenceParams on every cuda backend #gpu", function()
  local function gpu_it(name, fn)
    if HAS_GPU then it(name, fn) else pending(name .. " (no GPU)") end
  end
  for _, be in ipairs({ "unfused", "fused", "flash" }) do
    gpu_it(be .. ": decode (non-paged and paged) equals full attention, bf16 d=64", function()
      al.manual_seed(78)
      local data = {}
      for _, id in ipairs({ 10, 20, 30, 40 }) do
        local L = LENS[id]
        local o = { device = "cuda", dtype = "bf16" }
        data[id] = { q = al.randn({ L, 4, 64 }, o), k = al.randn({ L, 2, 64 }, o), v = al.randn({ L, 2, 64 }, o) }
      end
      -- forced: a backend that cannot serve the cached call is an error, never a silent fallback
      local fwd = function(args)
        args.backend = be
        return al.inference.forward(args)
      end
      for _, paged in ipairs({ false, true }) do
        local cfg = { max_batch_size = 4, max_sequence_length = 10, num_heads_kv = 2, head_dim_k = 64, dtype = "bf16",
          device = "cuda" }
        if paged then cfg.is_paged, cfg.page_size, cfg.total_num_pages = true, 2, 14 end
        check_against_reference(data, decode(data, cfg, "thd", fwd), 2e-2)
      end
    end)
  end
end)
