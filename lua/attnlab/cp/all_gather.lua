--[[
attnlab.cp.all_gather — the all_gather algorithm: KV gathered and put back in sequence order, one local
attention per q chunk; the backward reduce-scatters dk / dv. Part of attnlab.cp.
]]
local shards = require "attnlab.cp.shards"
local blocks = require "attnlab.cp.blocks"

local seg_views, chunk_ids = shards.seg_views, shards.chunk_ids
local chunk_len, piece, block_forward, block_backward = blocks.chunk_len, blocks.piece, blocks.block_forward,
  blocks.block_backward
local lse_merge, add_into, new_like_fmt, seqs_of, seg_accs = blocks.lse_merge, blocks.add_into, blocks.new_like_fmt,
  blocks.seqs_of, blocks.seg_accs
local split_opts, gather_full = blocks.split_opts, blocks.gather_full
local NEG_INF = blocks.NEG_INF
local M = {}
local al -- set by install

---------------------------------------------------------------------------------------------------
-- all_gather
---------------------------------------------------------------------------------------------------
local function full_seqs(S, kv)
  if S.fmt ~= "thd" then return nil end
  local t = {}
  for i = 1, S.b do t[i] = { kv and S.offk[i] or S.offq[i], kv and S.Pk[i] or S.Pq[i] } end
  return t
end

-- the pieces of all_gather for local q slot k (global chunk id gid) of sequence i: {kv start, len, valid, mask}
local function ag_kv_range(S, i, gid)
  local ck = chunk_len(S, i, true)
  if not S.causal then return 0, S.Pk[i], S.fmt == "thd" and S.Lk[i] or nil, "full" end
  local len = (gid + 1) * ck
  return 0, len, S.fmt == "thd" and math.min(S.Lk[i], len) or nil, "causal_br"
end

local function ag_prepare(S)
  local kg = S.group:all_gather(S.k)
  local vg = S.group:all_gather(S.v)
  local K, V = gather_full(S, kg, true), gather_full(S, vg, true)
  return K, V
end

local function ag_forward(S)
  local st = {}
  local K, V = ag_prepare(S)
  for _, r in ipairs(S.ranks) do
    local o_full, o_views = seg_accs(S, S.q[r], S.dv, false, nil)
    local qv = seg_views(S.q[r], S.fmt, seqs_of(S, false))
    local kf = seg_views(K[r], S.fmt, full_seqs(S, true))
    local vf = seg_views(V[r], S.fmt, full_seqs(S, true))
    local lses = {}
    for i, v in ipairs(qv) do lses[i] = al.full({ v:size(1), S.h, v:size(2) }, NEG_INF, { dtype = S.acc_dtype, device = S.device }) end
    local ids = chunk_ids(S.cp, S.lb, r - 1)
    for i = 1, S.nseg do
      local slots = S.causal and #ids or 1
      for k = 1, slots do
        local s0, s1 = k, S.causal and k or #ids
        local qp, lq = piece(S, qv[i], i, r - 1, s0, s1, false)
        local k0, kl, lk, mask = ag_kv_range(S, i, ids[k])
        local o, l = block_forward(S, qp, kf[i]:narrow(2, k0 + 1, kl), vf[i]:narrow(2, k0 + 1, kl), lq, lk, mask)
        if o then
          local c = chunk_len(S, i, false)
          lse_merge(o_views[i]:narrow(2, (s0 - 1) * c + 1, (s1 - s0 + 1) * c), lses[i]:narrow(3, (s0 - 1) * c + 1, (s1 - s0 + 1) * c), o, l)
        end
      end
    end
    st[r] = { o_full = o_full, o = o_views, lse = lses, qv = qv }
  end
  return st
end

local function ag_backward(S, st, dout)
  local K, V = ag_prepare(S) -- gathered again rather than kept (TE keeps the gathered KV; memory vs traffic)
  local res, dks, dvs = {}, {}, {}
  for _, r in ipairs(S.ranks) do
    local dq_full, dq_v = seg_accs(S, S.q[r], S.d, false, nil)
    local dK = new_like_fmt(S, K[r], S.d, S.acc_dtype)
    local dV = new_like_fmt(S, V[r], S.dv, S.acc_dtype)
    local kf = seg_views(K[r], S.fmt, full_seqs(S, true))
    local vf = seg_views(V[r], S.fmt, full_seqs(S, true))
    local dkf = seg_views(dK, S.fmt, full_seqs(S, true))
    local dvf = seg_views(dV, S.fmt, full_seqs(S, true))
    local dov = seg_views(dout[r], S.fmt, seqs_of(S, false))
    local ids = chunk_ids(S.cp, S.lb, r - 1)
    for i = 1, S.nseg do
      local slots = S.causal and #ids or 1
      for k = 1, slots do
        local s0, s1 = k, S.causal and k or #ids
        local qp, lq = piece(S, st[r].qv[i], i, r - 1, s0, s1, false)
        local k0, kl, lk, mask = ag_kv_range(S, i, ids[k])
        local c = chunk_len(S, i, false)
        local a0, n = (s0 - 1) * c + 1, (s1 - s0 + 1) * c
        local gq, gk, gv = block_backward(S, qp, kf[i]:narrow(2, k0 + 1, kl), vf[i]:narrow(2, k0 + 1, kl), lq, lk, mask,
          st[r].out[i]:narrow(2, a0, n), dov[i]:narrow(2, a0, n), st[r].lse[i]:narrow(3, a0, n))
        if gq then
          add_into(dq_v[i]:narrow(2, a0, n), gq)
          add_into(dkf[i]:narrow(2, k0 + 1, kl), gk)
          add_into(dvf[i]:narrow(2, k0 + 1, kl), gv)
        end
      end
    end
    res[r] = { dq_full }
    dks[r] = shards.split(dK, split_opts(S, true))
    dvs[r] = shards.split(dV, split_opts(S, true))
  end
  local dk, dv = S.group:reduce_scatter(dks), S.group:reduce_scatter(dvs)
  for _, r in ipairs(S.ranks) do res[r][2], res[r][3] = dk[r], dv[r] end
  return res
end

M.forward, M.backward = ag_forward, ag_backward
function M.install(a) al = a end

return M
