--[[
attnlab.cp.args — al.cp.attention_forward's arguments checked and read into the call's state S (group, ranks,
format, mask, per-rank q/k/v, sequence lengths, streams). Part of attnlab.cp.
]]
local T = require "attnlab.tensor"
local shards = require "attnlab.cp.shards"

local fail, to_list, nchunks = shards.fail, shards.to_list, shards.nchunks
local LOAD_BALANCE, SEQ_DIM = shards.LOAD_BALANCE, shards.SEQ_DIM
local M = {}

---------------------------------------------------------------------------------------------------
-- argument parsing
---------------------------------------------------------------------------------------------------
local COMM = { p2p = true, all_gather = true, a2a = true }
local UNSUPPORTED = { "core_attention_bias", "alibi_slopes", "attention_mask", "qkv_layer", "kv_layer",
  "fp8_recipe", "score_mod", "mask_mod", "block_mask", "inference_params", "softmax_offset" }
local MASK_OK = { no_mask = "full", causal = "causal", padding = "full", padding_causal = "causal",
  ["padding,causal"] = "causal", ["causal,padding"] = "causal", causal_padding = "causal" }

local function per_rank(fname, name, x, ranks)
  if x == nil then fail(fname, name .. ": required (a list by rank + 1, or a function of rank + 1)", 3) end
  local t = {}
  for _, r in ipairs(ranks) do
    local v
    if type(x) == "function" then v = x(r) elseif type(x) == "table" and not T.is_tensor(x) then v = x[r]
    else fail(fname, name .. ": expected a list of tensors by rank + 1 (or a function of rank + 1), got " .. type(x), 3) end
    if not T.is_tensor(v) then fail(fname, string.format("%s[%d]: expected a tensor for rank %d, got %s", name, r, r - 1, type(v)), 3) end
    t[r] = v
  end
  return t
end

local function same_shape(a, b)
  if a:dim() ~= b:dim() then return false end
  for d = 1, a:dim() do if a:size(d) ~= b:size(d) then return false end end
  return true
end

local function parse(args, fname)
  if type(args) ~= "table" then fail(fname, "expected a table of named arguments", 3) end
  local g = args.group or args.cp_group
  if type(g) ~= "table" or type(g.size) ~= "number" or type(g.sendrecv) ~= "function" then
    fail(fname, "group: expected an al.cp.SimGroup or al.cp.NcclGroup, got " .. tostring(g), 3)
  end
  local S = { group = g, cp = g.size, ranks = g.local_ranks, args = args }
  S.comm = args.cp_comm_type or "p2p"
  if not COMM[S.comm] then
    fail(fname, "cp_comm_type: expected 'p2p', 'all_gather' or 'a2a', got " .. tostring(S.comm) ..
      (S.comm == "a2a+p2p" and " (hierarchical a2a+p2p is not implemented)" or ""), 3)
  end
  S.lb = args.load_balance or "dual_chunk_swap"
  if not LOAD_BALANCE[S.lb] then fail(fname, "load_balance: expected 'dual_chunk_swap' or 'contiguous', got " .. tostring(S.lb), 3) end
  for _, n in ipairs(UNSUPPORTED) do
    if args[n] ~= nil then fail(fname, n .. ": not supported with context parallelism", 3) end
  end
  if (args.core_attention_bias_type or "no_bias") ~= "no_bias" then fail(fname, "core_attention_bias_type: only 'no_bias' is supported with context parallelism", 3) end
  if (args.softmax_type or "vanilla") ~= "vanilla" then fail(fname, "softmax_type: only 'vanilla' is supported with context parallelism", 3) end
  if (args.attention_dropout or 0) ~= 0 then fail(fname, "attention_dropout: dropout is not supported with context parallelism", 3) end
  if args.return_max_logit then fail(fname, "return_max_logit: not supported with context parallelism", 3) end
  S.fmt = args.qkv_format or "sbhd"
  if SEQ_DIM[S.fmt] == nil then fail(fname, "qkv_format: expected 'bshd', 'sbhd' or 'thd', got " .. tostring(S.fmt), 3) end
  local mask = args.attn_mask_type or "causal"
  S.mask = MASK_OK[mask]
  if S.mask == nil then
    fail(fname, "attn_mask_type: expected no_mask, causal (padding, padding_causal with thd), got " .. tostring(mask) ..
      " (bottom-right and arbitrary masks are not supported with context parallelism)", 3)
  end
  S.causal = S.mask == "causal"
  -- (causal with load_balance = "contiguous" outside a2a is allowed: correct, but the work is uneven, rank cp-1
  -- does cp times rank 0's)
  local ws = args.window_size
  if ws ~= nil then
    if type(ws) ~= "table" or #ws ~= 2 then fail(fname, "window_size: expected {left, right}", 3) end
    local plain = (ws[1] == -1 and ws[2] == -1) or (S.causal and ws[1] == -1 and ws[2] == 0)
    if not plain and S.comm ~= "a2a" then
      fail(fname, "window_size: sliding windows are only supported with cp_comm_type = 'a2a', got {" .. ws[1] .. ", " .. ws[2] .. "}", 3)
    end
  end
  S.q = per_rank(fname, "query_layer", args.query_layer, S.ranks)
  S.k = per_rank(fname, "key_layer", args.key_layer, S.ranks)
  S.v = per_rank(fname, "value_layer", args.value_layer, S.ranks)
  local r1 = S.ranks[1]
  local q1, k1, v1 = S.q[r1], S.k[r1], S.v[r1]
  local nd = S.fmt == "thd" and 3 or 4
  if q1:dim() ~= nd or k1:dim() ~= nd or v1:dim() ~= nd then
    fail(fname, string.format("query_layer/key_layer/value_layer: %s tensors must be %d-d, got %d, %d, %d", S.fmt, nd, q1:dim(), k1:dim(), v1:dim()), 3)
  end
  for _, r in ipairs(S.ranks) do
    for _, p in ipairs { { "query_layer", S.q, q1 }, { "key_layer", S.k, k1 }, { "value_layer", S.v, v1 } } do
      local t = p[2][r]
      if not same_shape(t, p[3]) or t:dtype() ~= p[3]:dtype() or t:is_cuda() ~= p[3]:is_cuda() then
        fail(fname, string.format("%s[%d]: mismatched per-rank inputs: every rank's %s must have rank %d's shape, dtype and device kind",
          p[1], r, p[1], r1 - 1), 3)
      end
    end
  end
  S.h, S.hg, S.d, S.dv = q1:size(-2), k1:size(-2), q1:size(-1), v1:size(-1)
  if S.h % S.hg ~= 0 then fail(fname, string.format("num_gqa_groups: %d query heads are not a multiple of %d kv heads", S.h, S.hg), 3) end
  if args.num_attention_heads and args.num_attention_heads ~= S.h then
    fail(fname, string.format("query_layer has %d heads, expected num_attention_heads = %d", S.h, args.num_attention_heads), 3)
  end
  if args.num_gqa_groups and args.num_gqa_groups ~= S.hg then
    fail(fname, string.format("Keys and values must have num_gqa_group = %d heads, got %d", args.num_gqa_groups, S.hg), 3)
  end
  S.scale = args.softmax_scale or 1 / math.sqrt(S.d)
  S.compute_dtype = args.compute_dtype or "f32"
  S.acc_dtype = S.compute_dtype == "f64" and "f64" or "f32"
  S.dtype = q1:dtype()
  S.device = q1:device()
  local cp = S.cp
  local nc = nchunks(cp, S.lb)
  if S.fmt == "thd" then
    local cq = to_list(fname, "cu_seqlens_q", args.cu_seqlens_q)
    local ck = to_list(fname, "cu_seqlens_kv", args.cu_seqlens_kv) or cq
    local cqp = to_list(fname, "cu_seqlens_q_padded", args.cu_seqlens_q_padded)
    local ckp = to_list(fname, "cu_seqlens_kv_padded", args.cu_seqlens_kv_padded) or cqp
    if not cq then fail(fname, "cu_seqlens_q: required for thd (the global cu_seqlens)", 3) end
    if not cqp then fail(fname, "cu_seqlens_q_padded: required for thd with context parallelism (TE: 'thd requires cu_seqlens_padded')", 3) end
    if #cq ~= #cqp or #ck ~= #ckp or #cq ~= #ck then fail(fname, "cu_seqlens_q/kv(_padded): expected lists of equal length b+1", 3) end
    S.b = #cq - 1
    S.Lq, S.Lk, S.Pq, S.Pk, S.offq, S.offk = {}, {}, {}, {}, {}, {}
    for i = 1, S.b do
      S.Lq[i], S.Lk[i] = cq[i + 1] - cq[i], ck[i + 1] - ck[i]
      S.Pq[i], S.Pk[i] = cqp[i + 1] - cqp[i], ckp[i + 1] - ckp[i]
      S.offq[i], S.offk[i] = cqp[i], ckp[i]
      for _, pr in ipairs { { "cu_seqlens_q_padded", S.Pq[i] }, { "cu_seqlens_kv_padded", S.Pk[i] } } do
        if pr[2] % nc ~= 0 then
          fail(fname, string.format("%s: sequence %d has padded length %d, which must be divisible by %s = %d",
            pr[1], i, pr[2], S.lb == "contiguous" and "cp_size" or "2*cp_size", nc), 3)
        end
      end
      if S.Lq[i] > S.Pq[i] or S.Lk[i] > S.Pk[i] or S.Lq[i] < 0 or S.Lk[i] < 0 then
        fail(fname, string.format("cu_seqlens_q/kv: sequence %d is longer than its padded length", i), 3)
      end
      if S.causal and (S.Lq[i] ~= S.Lk[i] or S.Pq[i] ~= S.Pk[i]) then
        fail(fname, "attn_mask_type: causal context parallelism needs self-attention (equal q and kv sequences)", 3)
      end
    end
    local tq, tk = cqp[#cqp] / cp, ckp[#ckp] / cp
    if q1:size(1) < tq or k1:size(1) < tk then
      fail(fname, string.format("query_layer/key_layer: each rank needs cu_seqlens_padded[b+1]/cp = %d / %d rows, got %d / %d",
        tq, tk, q1:size(1), k1:size(1)), 3)
    end
    S.seqq, S.seqk = {}, {}
    for i = 1, S.b do S.seqq[i] = { S.offq[i] / cp, S.Pq[i] / cp } S.seqk[i] = { S.offk[i] / cp, S.Pk[i] / cp } end
    S.nseg = S.b
  else
    local sd = SEQ_DIM[S.fmt]
    S.b = q1:size(3 - sd)
    local sq, sk = q1:size(sd), k1:size(sd)
    local slots = nc / cp
    if sq % slots ~= 0 or sk % slots ~= 0 then
      fail(fname, string.format("query_layer/key_layer: the local sequence (%d, %d) must hold %d equal chunks (sequence divisible by 2*cp_size)", sq, sk, slots), 3)
    end
    if S.causal and sq ~= sk then fail(fname, "attn_mask_type: causal context parallelism needs self-attention (sq == skv)", 3) end
    S.nseg = 1
    S.Pq, S.Pk = { sq * cp }, { sk * cp } -- global lengths
  end
  if S.comm == "a2a" then
    if S.h % cp ~= 0 or S.hg % cp ~= 0 then
      fail(fname, string.format("num_attention_heads: a2a needs the query heads (%d) and kv heads (%d) divisible by cp_size = %d",
        S.h, S.hg, cp), 3)
    end
  end
  S.overlap = args.overlap ~= false
  local cs = args.cp_stream
  if cs ~= nil then
    -- TE's cp_stream: the p2p communication stream (an al.cuda.Stream for every local rank, or a list of
    -- them by rank + 1); GPU only, unused on CPU tensors and by all_gather / a2a
    local function is_stream(x) return type(x) == "table" and type(x.wait_event) == "function" and x.device ~= nil end
    local t = {}
    for _, r in ipairs(S.ranks) do
      local x = is_stream(cs) and cs or (type(cs) == "table" and cs[r])
      if not is_stream(x) then
        fail(fname, string.format("cp_stream: expected an al.cuda.Stream or a list of them by rank + 1 (rank %d: %s)",
          r - 1, type(x)), 3)
      end
      t[r] = x
    end
    S.cp_stream = t
  end
  return S
end

M.parse = parse

return M
