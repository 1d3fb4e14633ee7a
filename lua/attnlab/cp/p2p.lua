--[[
attnlab.cp.p2p — the p2p algorithm: a ring of KV blocks over cp steps, each step's partial (out, lse) merged
into the running result; the backward sends dk / dv round the ring behind the kv blocks. Part of attnlab.cp.
]]
local shards = require "attnlab.cp.shards"
local streams = require "attnlab.cp.streams"
local blocks = require "attnlab.cp.blocks"

local seg_views = shards.seg_views
local make_streams, with_streams, exchange_start, exchange_wait, finish_streams = streams.make_streams,
  streams.with_streams, streams.exchange_start, streams.exchange_wait, streams.finish_streams
local chunk_len, piece, block_forward, block_backward = blocks.chunk_len, blocks.piece, blocks.block_forward,
  blocks.block_backward
local lse_merge, add_into, new_like_fmt, seqs_of, seg_accs = blocks.lse_merge, blocks.add_into, blocks.new_like_fmt,
  blocks.seqs_of, blocks.seg_accs
local NEG_INF = blocks.NEG_INF
local M = {}
local al -- set by install

---------------------------------------------------------------------------------------------------
-- p2p
---------------------------------------------------------------------------------------------------
-- the (q piece, kv piece, mask) list when rank r (0-based) meets the kv block of rank j
local function p2p_pieces(S, r, j)
  local dcs = S.lb == "dual_chunk_swap"
  local ns = dcs and 2 or 1
  if not S.causal then return { { 1, ns, 1, ns, "full" } } end
  if j == r then return { { 1, ns, 1, ns, "causal" } } end
  if dcs then
    if j < r then return { { 1, 2, 1, 1, "full" } } end
    return { { 2, 2, 1, 2, "full" } }
  end
  if j < r then return { { 1, 1, 1, 1, "full" } } end
  return {}
end


-- The p2p ring driver: cp steps of compute(step, kv blocks held now), the next kv block travelling one
-- rank on while this one computes (on a comm stream when overlapping on a GPU); after_compute(ov), when
-- given, runs after each step's compute (the backward sends dk/dv on there).
local function ring(S, kvcur, compute, after_compute)
  local g, ranks, cp = S.group, S.ranks, S.cp
  local ov = (S.overlap and S.q[ranks[1]]:is_cuda()) and make_streams(g, ranks, S.q, S.cp_stream) or nil
  for step = 0, cp - 1 do
    local h
    if step < cp - 1 then h = exchange_start(g, ranks, kvcur, 1, ov) end
    if ov then with_streams(ov, "compute", ranks, function() compute(step, kvcur) end) else compute(step, kvcur) end
    if after_compute then after_compute(ov) end
    if h then kvcur = exchange_wait(h, ranks) end
  end
  finish_streams(ov, ranks)
end
local function p2p_forward(S)
  local ranks, cp = S.ranks, S.cp
  local st = {}
  for _, r in ipairs(ranks) do
    local o_full, o_views = seg_accs(S, S.q[r], S.dv, false, nil)
    local lses = {}
    local qv = seg_views(S.q[r], S.fmt, seqs_of(S, false))
    for i, v in ipairs(qv) do lses[i] = al.full({ v:size(1), S.h, v:size(2) }, NEG_INF, { dtype = S.acc_dtype, device = S.device }) end
    st[r] = { o_full = o_full, o = o_views, lse = lses, qv = qv }
  end
  local kvcur = {}
  for _, r in ipairs(ranks) do kvcur[r] = { S.k[r], S.v[r] } end
  local function compute(step, kvb)
    for _, r in ipairs(ranks) do
      local j = (r - 1 - step) % cp
      local kv = seg_views(kvb[r][1], S.fmt, seqs_of(S, true))
      local vv = seg_views(kvb[r][2], S.fmt, seqs_of(S, true))
      for _, pc in ipairs(p2p_pieces(S, r - 1, j)) do
        for i = 1, S.nseg do
          local qp, lq = piece(S, st[r].qv[i], i, r - 1, pc[1], pc[2], false)
          local kp, lk = piece(S, kv[i], i, j, pc[3], pc[4], true)
          local vp = piece(S, vv[i], i, j, pc[3], pc[4], true)
          local o, l = block_forward(S, qp, kp, vp, lq, lk, pc[5])
          if o then
            local c = chunk_len(S, i, false)
            local a0, n = (pc[1] - 1) * c + 1, (pc[2] - pc[1] + 1) * c
            lse_merge(st[r].o[i]:narrow(2, a0, n), st[r].lse[i]:narrow(3, a0, n), o, l)
          end
        end
      end
    end
  end
  -- (streams made after the accumulators were filled: the compute streams start after that work)
  ring(S, kvcur, compute)
  return st
end

local function p2p_backward(S, st, dout)
  local g, ranks, cp = S.group, S.ranks, S.cp
  local dq = {}
  for _, r in ipairs(ranks) do
    local full, views = seg_accs(S, S.q[r], S.d, false, nil)
    dq[r] = { full = full, v = views, dout = seg_views(dout[r], S.fmt, seqs_of(S, false)) }
  end
  local kvcur, dkv = {}, {}
  for _, r in ipairs(ranks) do
    kvcur[r] = { S.k[r], S.v[r] }
    dkv[r] = { new_like_fmt(S, S.k[r], S.d, S.acc_dtype), new_like_fmt(S, S.v[r], S.dv, S.acc_dtype) }
  end
  local function compute(step, kvb)
    for _, r in ipairs(ranks) do
      local j = (r - 1 - step) % cp
      local kv = seg_views(kvb[r][1], S.fmt, seqs_of(S, true))
      local vv = seg_views(kvb[r][2], S.fmt, seqs_of(S, true))
      local dk = seg_views(dkv[r][1], S.fmt, seqs_of(S, true))
      local dvv = seg_views(dkv[r][2], S.fmt, seqs_of(S, true))
      for _, pc in ipairs(p2p_pieces(S, r - 1, j)) do
        for i = 1, S.nseg do
          local qp, lq = piece(S, st[r].qv[i], i, r - 1, pc[1], pc[2], false)
          local kp, lk = piece(S, kv[i], i, j, pc[3], pc[4], true)
          local vp = piece(S, vv[i], i, j, pc[3], pc[4], true)
          local op = piece(S, st[r].out[i], i, r - 1, pc[1], pc[2], false)
          local dop = piece(S, dq[r].dout[i], i, r - 1, pc[1], pc[2], false)
          local c = chunk_len(S, i, false)
          local a0, n = (pc[1] - 1) * c + 1, (pc[2] - pc[1] + 1) * c
          local gq, gk, gv = block_backward(S, qp, kp, vp, lq, lk, pc[5], op, dop, st[r].lse[i]:narrow(3, a0, n))
          if gq then
            add_into(piece(S, dq[r].v[i], i, r - 1, pc[1], pc[2], false), gq)
            add_into(piece(S, dk[i], i, j, pc[3], pc[4], true), gk)
            add_into(piece(S, dvv[i], i, j, pc[3], pc[4], true), gv)
          end
        end
      end
    end
  end
  -- dk/dv follow their kv block, after each step's compute; after cp sends they are back at their owner.
  -- Overlapped, they go on the comm stream too (behind the next kv block): one stream for every NCCL
  -- call of the communicator, so no two of its kernels wait on each other across streams.
  ring(S, kvcur, compute, function(ov) dkv = exchange_wait(exchange_start(g, ranks, dkv, 1, ov), ranks) end)
  local res = {}
  for _, r in ipairs(ranks) do res[r] = { dq[r].full, dkv[r][1], dkv[r][2] } end
  return res
end

M.forward, M.backward = p2p_forward, p2p_backward
function M.install(a) al = a end

return M
