--[[
attnlab.cp.blocks — what the three CP algorithms share: chunk lengths and pieces of a call's segments, one
block of attention (a q piece on a kv piece) through the C backends forward and backward, the log-sum-exp merge
of partial results, accumulators in the user's format, and shard options of the call. Part of attnlab.cp.
]]
local lffi = require "attnlab.ffi"
local T = require "attnlab.tensor"
local shards = require "attnlab.cp.shards"
local C = lffi.C

local nchunks, chunk_ids, clamp, seg_views = shards.nchunks, shards.chunk_ids, shards.clamp, shards.seg_views
local NEG_INF = -math.huge
local M = {}
local al -- set by install

-- the chunk sizes and valid lengths of sequence (segment) i for q or kv
local function chunk_len(S, i, kv) return (kv and S.Pk[i] or S.Pq[i]) / nchunks(S.cp, S.lb) end
local function valid_in_chunk(S, i, kv, g)
  if S.fmt ~= "thd" then return nil end
  local c, L = chunk_len(S, i, kv), kv and S.Lk[i] or S.Lq[i]
  return clamp(L - g * c, 0, c)
end

---------------------------------------------------------------------------------------------------
-- one block: attention of a q piece on a kv piece ([B, S, H, D] views), through the C backends
---------------------------------------------------------------------------------------------------
local i32cache = setmetatable({}, { __mode = "v" })
local function cu(S, a, b)
  local key = S.device .. ":" .. a .. ":" .. b
  local t = i32cache[key]
  if not t then
    t = al.tensor({ 0, a }, { dtype = "i32" }):to(S.device)
    if b ~= a then t = { t, al.tensor({ 0, b }, { dtype = "i32" }):to(S.device) } else t = { t, t } end
    i32cache[key] = t
  end
  return t
end

-- mask: "full" | "causal" (top-left) | "causal_br" (bottom-right); lq/lk: valid lengths (thd) or nil
local function block_args(S, qv, kv, vv, lq, lk, mask)
  local a = { softmax_scale = S.scale, compute_dtype = S.compute_dtype, backend = S.args.backend,
    deterministic = S.args.deterministic }
  if lq == nil then
    a.qkv_format = "bshd"
    a.query_layer, a.key_layer, a.value_layer = qv, kv, vv
    a.attn_mask_type = mask == "full" and "no_mask" or (mask == "causal" and "causal" or "causal_bottom_right")
  else
    a.qkv_format = "thd"
    a.query_layer, a.key_layer, a.value_layer = qv:select(1, 1), kv:select(1, 1), vv:select(1, 1)
    local sq, sk = qv:size(2), kv:size(2)
    local cq, cqp = cu(S, lq, sq), cu(S, lk, sk)
    a.cu_seqlens_q, a.cu_seqlens_q_padded = cq[1], cq[2]
    a.cu_seqlens_kv, a.cu_seqlens_kv_padded = cqp[1], cqp[2]
    a.max_seqlen_q, a.max_seqlen_kv = sq, sk
    a.attn_mask_type = mask == "full" and "padding" or (mask == "causal" and "padding_causal" or "padding_causal_bottom_right")
  end
  return a
end

local function block_forward(S, qv, kv, vv, lq, lk, mask)
  if lq ~= nil and (lq == 0 or lk == 0) then return nil end
  local a = block_args(S, qv, kv, vv, lq, lk, mask)
  local p, inp = al.attention._prepare(a, nil)
  local out, lse = T.new(), T.new()
  T.check(C.al_attn_forward(p, inp, out.raw, lse.raw, nil), "cp.attention_forward")
  T.after_alloc()
  if lq ~= nil then out = out:unsqueeze(1) end
  return out, lse
end

-- dq/dk/dv of one block with the GLOBAL out/lse (views [B,Sq,H,dv] / [B,H,Sq]) of its q rows
local function block_backward(S, qv, kv, vv, lq, lk, mask, out, dout, lse)
  if lq ~= nil and (lq == 0 or lk == 0) then return nil end
  local a = block_args(S, qv, kv, vv, lq, lk, mask)
  local p, inp = al.attention._prepare(a, nil)
  local o, d = out:contiguous(), dout:contiguous()
  if lq ~= nil then o, d = o:select(1, 1), d:select(1, 1) end
  local l = lse:contiguous()
  local dq = al.empty(a.query_layer:size(), { dtype = S.dtype, device = S.device })
  local dk = al.empty(a.key_layer:size(), { dtype = S.dtype, device = S.device })
  local dv = al.empty(a.value_layer:size(), { dtype = S.dtype, device = S.device })
  T.check(C.al_attn_backward(p, inp, o.raw, d.raw, l.raw, dq.raw, dk.raw, dv.raw, nil, nil), "cp.attention_backward")
  if lq ~= nil then dq, dk, dv = dq:unsqueeze(1), dk:unsqueeze(1), dv:unsqueeze(1) end
  return dq, dk, dv
end

-- acc_o [B,S,H,dv], acc_l [B,H,S] (views, compute dtype) <- LSE merge with (o, l)
local function lse_merge(acc_o, acc_l, o, l)
  local m = al.maximum(acc_l, l)
  local ms = al.where(al.eq(m, NEG_INF), 0, m)
  local wa, wb = al.exp(acc_l - ms), al.exp(l - ms)
  local s = wa + wb
  local nl = ms + al.log(s)
  local ss = al.where(al.eq(s, 0), 1, s)
  local fa = (wa / ss):transpose(2, 3):unsqueeze(4)
  local fb = (wb / ss):transpose(2, 3):unsqueeze(4)
  acc_o:copy_(acc_o * fa + o:to(acc_o:dtype()) * fb)
  acc_l:copy_(nl)
end

local function add_into(acc, x) acc:copy_(acc + x:to(acc:dtype())) end

---------------------------------------------------------------------------------------------------
-- result assembly: per-segment accumulators -> tensors in the user's format
---------------------------------------------------------------------------------------------------
local function new_like_fmt(S, like, last, dtype)
  local shape = like:size()
  shape[#shape] = last
  return al.zeros(shape, { dtype = dtype or S.dtype, device = S.device })
end

local function seqs_of(S, kv) if S.fmt ~= "thd" then return nil end return kv and S.seqk or S.seqq end

-- accumulators for one rank's q rows (out, lse) or k/v rows (grads)
local function seg_accs(S, t_like, last, kv, fill)
  local full = new_like_fmt(S, t_like, last, S.acc_dtype)
  if fill then full:fill_(fill) end
  return full, seg_views(full, S.fmt, seqs_of(S, kv))
end


-- views and valid lengths of a piece of segment i: slots s0..s1 of rank `owner`'s local chunks
local function piece(S, view, i, owner, s0, s1, kv)
  local c = chunk_len(S, i, kv)
  local v = view:narrow(2, (s0 - 1) * c + 1, (s1 - s0 + 1) * c)
  local valid
  if S.fmt == "thd" then
    valid = 0
    local ids = chunk_ids(S.cp, S.lb, owner)
    for s = s0, s1 do valid = valid + valid_in_chunk(S, i, kv, ids[s]) end
  end
  return v, valid
end

local function split_opts(S, kv)
  local o = { cp_size = S.cp, qkv_format = S.fmt, load_balance = S.lb }
  if S.fmt == "thd" then
    local cu_p = { 0 }
    local P, off = kv and S.Pk or S.Pq, kv and S.offk or S.offq
    for i = 1, S.b do cu_p[i] = off[i] cu_p[i + 1] = off[i] + P[i] end
    o.cu_seqlens_padded = cu_p
  end
  return o
end

-- full-sequence (natural order) tensors of every local rank from per-rank shards
local function gather_full(S, parts_by_rank, kv)
  local out = {}
  for _, r in ipairs(S.ranks) do out[r] = shards.gather(parts_by_rank[r], split_opts(S, kv)) end
  return out
end

M.chunk_len, M.piece, M.block_forward, M.block_backward, M.lse_merge, M.add_into = chunk_len, piece, block_forward,
  block_backward, lse_merge, add_into
M.new_like_fmt, M.seqs_of, M.seg_accs, M.split_opts, M.gather_full = new_like_fmt, seqs_of, seg_accs, split_opts,
  gather_full
M.NEG_INF = NEG_INF
function M.install(a) al = a end

return M
