--[[
attnlab.cp — context parallelism (CP): one attention spread over cp ranks, each holding a shard of the
sequence, in TransformerEngine's three modes (te_dpa_semantics.md §3.2, docs/CONTEXT_PARALLEL.md):

  p2p         a ring of KV blocks (cp steps); each step's partial (out, lse) is merged into the running
              result with the numerically stable log-sum-exp merge; on the GPU the next block's send/recv
              runs on a communication stream while the current block is computed (overlap = false: not)
  all_gather  KV gathered (and put back in sequence order), one local attention per q chunk; the
              backward reduce-scatters dk/dv
  a2a         Ulysses: all-to-all from sequence-sharded to head-sharded, full-sequence attention on h/cp
              heads, all-to-all back

  local g = al.cp.SimGroup(4)                              -- 4 simulated ranks in this process
  local qs = al.cp.split(q, {cp_size = 4, qkv_format = "bshd"})   -- DualChunkSwap shards (list by rank)
  local outs, ctx = al.cp.attention_forward{group = g, cp_comm_type = "p2p", query_layer = qs,
                                            key_layer = ks, value_layer = vs, qkv_format = "bshd",
                                            attn_mask_type = "causal"}
  local grads = al.cp.attention_backward(ctx, douts)       -- grads[r].query_layer / key_layer / value_layer
  local out = al.cp.gather(outs, {cp_size = 4, qkv_format = "bshd"})

Ranks: lists are indexed by rank + 1 (ATTNLAB_RANK is 0-based). A group drives its local_ranks (all of
them for SimGroup and for a one-process NcclGroup over several GPUs; one for a process started by
scripts/attnlab-launch); per-rank tables need entries for the local ranks only.
Load balancing: DualChunkSwap (default): the sequence (each sequence for thd) is cut in 2·cp chunks and
rank r holds chunks r and 2cp-1-r (0-based), so causal work is even; "contiguous": rank r holds chunk r.
thd: every sequence's padded length (cu_seqlens_*_padded) must be divisible by 2·cp; per-rank tensors
hold cu_seqlens_padded[b+1]/cp rows, each sequence's local part at offset cu_seqlens_padded[i]/cp;
cu_seqlens_q/kv(_padded) are the GLOBAL ones (Lua lists or i32 tensors).
Not supported with CP (an error names them): bias, ALiBi, dropout, non-vanilla softmax, attention_mask,
FP8, score_mod/mask_mod, return_max_logit, bottom-right causal masks; sliding windows only with a2a.

The parts (lua/attnlab/cp/): shards (chunks, split / gather, segment views), sim (the group interface and
SimGroup), nccl (NCCL over the FFI, NcclGroup), args (the call's arguments into its state S), blocks (one block
of attention, the LSE merge, accumulators), streams (the p2p ring's overlap on GPUs), and one file per
algorithm: p2p, all_gather, a2a. This file: al.cp.init, attention_forward / attention_backward, install.
]]
local T = require "attnlab.tensor"
local shards = require "attnlab.cp.shards"
local sim = require "attnlab.cp.sim"
local nccl = require "attnlab.cp.nccl"
local streams = require "attnlab.cp.streams"
local cp_args = require "attnlab.cp.args"
local blocks = require "attnlab.cp.blocks"
local p2p = require "attnlab.cp.p2p"
local all_gather = require "attnlab.cp.all_gather"
local a2a = require "attnlab.cp.a2a"

local fail, seg_views, seqs_of = shards.fail, shards.seg_views, blocks.seqs_of
local M = {}
local al -- set by install

M.chunk_ids, M.split, M.gather = shards.chunk_ids, shards.split, shards.gather
M.SimGroup = sim.SimGroup
M.nccl, M.nccl_version, M.NcclGroup = nccl.nccl, nccl.nccl_version, nccl.NcclGroup

-- al.cp.init{sim = n?}: the group of this process from scripts/attnlab-launch's environment
-- (ATTNLAB_RANK, ATTNLAB_WORLD_SIZE, ATTNLAB_LOCAL_RANK, ATTNLAB_NCCL_ID_FILE). World size > 1: an
-- NcclGroup (an error says what is missing); world size 1 (no launcher): opts.devices = {...} gives a
-- one-process NcclGroup over those GPUs, opts.sim = n a SimGroup(n); otherwise an error.
function M.init(opts)
  opts = opts or {}
  local fname = "cp.init"
  local ws = tonumber(os.getenv("ATTNLAB_WORLD_SIZE") or "1")
  if ws and ws > 1 then
    local rank, lrank = tonumber(os.getenv("ATTNLAB_RANK") or ""), tonumber(os.getenv("ATTNLAB_LOCAL_RANK") or "")
    local file = os.getenv("ATTNLAB_NCCL_ID_FILE")
    if not rank or not lrank or not file then
      fail(fname, "ATTNLAB_WORLD_SIZE=" .. ws .. " but ATTNLAB_RANK, ATTNLAB_LOCAL_RANK or ATTNLAB_NCCL_ID_FILE is not set " ..
        "(start the script with scripts/attnlab-launch -n N)", 2)
    end
    local lib, why = M.nccl()
    if not lib then fail(fname, why, 2) end
    if not al.cuda.available() then fail(fname, "world size " .. ws .. " needs GPUs: " .. select(2, al.cuda.available()), 2) end
    return M.NcclGroup { rank = rank, world_size = ws, device = lrank % al.cuda.device_count(), unique_id_file = file }
  end
  if opts.sim then return M.SimGroup(opts.sim) end
  if opts.devices then return M.NcclGroup { devices = opts.devices } end
  fail(fname, "single process: pass {sim = n} for simulated ranks or {devices = {...}} for one process driving " ..
    "several GPUs through NCCL, or start the script with scripts/attnlab-launch -n N", 2)
end

---------------------------------------------------------------------------------------------------
-- public entry points
---------------------------------------------------------------------------------------------------
local function flat(t)
  local shape = t:size()
  local n = #shape
  local fs = {}
  for i = 1, n - 2 do fs[i] = shape[i] end
  fs[n - 1] = shape[n - 1] * shape[n]
  return t:contiguous():view(fs)
end

-- al.cp.attention_forward{group=, cp_comm_type=, query_layer = {per rank}, key_layer=, value_layer=, ...}
-- -> outs (list by rank + 1, each flattened like DotProductAttention's output: [b,s,h*dv] | [s,b,h*dv] |
-- [t,h*dv], in the user's layout and q's dtype), ctx. cp_stream (TE's name): an al.cuda.Stream (or a list
-- by rank + 1) that p2p uses as its communication stream instead of a new one per call.
function M.attention_forward(args)
  local fname = "cp.attention_forward"
  local S = cp_args.parse(args, fname)
  local outs, ctx = {}, { S = S }
  if S.comm == "a2a" then
    local o, ctxs = a2a.forward(S)
    ctx.a2a = ctxs
    for _, r in ipairs(S.ranks) do outs[r] = flat(o[r]) end
    ctx.outs = o
    return outs, ctx
  end
  local st = S.comm == "p2p" and p2p.forward(S) or all_gather.forward(S)
  ctx.st = st
  ctx.outs = {}
  for _, r in ipairs(S.ranks) do
    local o = st[r].o_full:to(S.dtype)
    ctx.outs[r] = o
    st[r].out = seg_views(o, S.fmt, seqs_of(S, false)) -- the global out (q dtype), used by the backward
    st[r].o, st[r].o_full = nil, nil
    outs[r] = flat(o)
  end
  return outs, ctx
end

-- al.cp.attention_backward(ctx, douts) -> grads (list by rank + 1) of {query_layer=, key_layer=, value_layer=}
-- (q/k/v's dtype and layout; douts: per rank, flattened or [.., h, dv]).
function M.attention_backward(ctx, douts)
  local fname = "cp.attention_backward"
  if type(ctx) ~= "table" or ctx.S == nil then fail(fname, "ctx: expected the ctx returned by cp.attention_forward", 2) end
  local S = ctx.S
  local d = {}
  for _, r in ipairs(S.ranks) do
    local x = type(douts) == "table" and not T.is_tensor(douts) and douts[r]
    if not T.is_tensor(x) then fail(fname, string.format("douts[%d]: expected a tensor for rank %d", r, r - 1), 2) end
    local o = ctx.outs[r]
    if x:numel() ~= o:numel() then
      fail(fname, string.format("douts[%d]: expected %d elements (the output's), got %d", r, o:numel(), x:numel()), 2)
    end
    d[r] = x:contiguous():view(o:size())
  end
  local res
  if S.comm == "a2a" then res = a2a.backward(S, ctx.a2a, d)
  elseif S.comm == "p2p" then res = p2p.backward(S, ctx.st, d)
  else res = all_gather.backward(S, ctx.st, d) end
  local grads = {}
  for _, r in ipairs(S.ranks) do
    grads[r] = { query_layer = res[r][1]:to(S.dtype), key_layer = res[r][2]:to(S.dtype), value_layer = res[r][3]:to(S.dtype) }
  end
  return grads
end

function M.install(a)
  al = a
  for _, part in ipairs({ shards, nccl, streams, blocks, p2p, all_gather, a2a }) do part.install(a) end
  al.cp = {
    SimGroup = M.SimGroup, NcclGroup = M.NcclGroup, init = M.init, split = M.split, gather = M.gather,
    attention_forward = M.attention_forward, attention_backward = M.attention_backward,
    nccl_version = M.nccl_version, chunk_ids = M.chunk_ids,
  }
end

return M
