--[[
attnlab.cp.shards — context parallelism's layout helpers: the chunks a rank holds under each load balance
(DualChunkSwap or contiguous), al.cp.split / al.cp.gather between a full tensor and its per-rank shards, and
bshd-shaped views of each sequence (segment) of a tensor in the user's format. Part of attnlab.cp.
]]
local T = require "attnlab.tensor"

local M = {}
local al -- set by install

local function fail(fname, msg, level) error(fname .. ": " .. msg, (level or 1) + 1) end

local function to_list(fname, name, x)
  if x == nil then return nil end
  if type(x) == "table" and not T.is_tensor(x) then
    local t = {}
    for i = 1, #x do t[i] = x[i] end
    return t
  end
  if T.is_tensor(x) then
    local t = x:to("cpu"):totable()
    for i = 1, #t do t[i] = math.floor(t[i] + 0.5) end
    return t
  end
  fail(fname, name .. ": expected a list of offsets or an i32 tensor, got " .. type(x), 3)
end

---------------------------------------------------------------------------------------------------
-- layout helpers: chunks, shards, segments
---------------------------------------------------------------------------------------------------
local LOAD_BALANCE = { dual_chunk_swap = true, contiguous = true }

-- al.cp.chunk_ids(cp, load_balance, r): the global chunk ids (0-based) rank r (0-based) holds, in local
-- order: {r, 2cp-1-r} for "dual_chunk_swap" (2·cp chunks), {r} for "contiguous" (cp chunks).
local function chunk_ids(cp, lb, r)
  if lb == "contiguous" then return { r } end
  return { r, 2 * cp - 1 - r }
end
M.chunk_ids = chunk_ids

local function nchunks(cp, lb) return lb == "contiguous" and cp or 2 * cp end

local SEQ_DIM = { bshd = 2, sbhd = 1, thd = 1 }

-- split/gather options -> cp, lb, seq_dim, sequences {{start, len}} (0-based starts) of the full tensor
local function parse_split_opts(fname, x_len, opts)
  if type(opts) ~= "table" then fail(fname, "opts: expected a table {cp_size =, qkv_format | seq_dim =, ...}", 3) end
  local cp = opts.cp_size
  if type(cp) ~= "number" or cp < 1 or cp % 1 ~= 0 then fail(fname, "cp_size: expected a positive integer, got " .. tostring(cp), 3) end
  local lb = opts.load_balance or "dual_chunk_swap"
  if not LOAD_BALANCE[lb] then fail(fname, "load_balance: expected 'dual_chunk_swap' or 'contiguous', got " .. tostring(lb), 3) end
  local fmt = opts.qkv_format
  if fmt ~= nil and SEQ_DIM[fmt] == nil then fail(fname, "qkv_format: expected 'bshd', 'sbhd' or 'thd', got " .. tostring(fmt), 3) end
  local sd = opts.seq_dim or (fmt and SEQ_DIM[fmt]) or 2
  local cu = to_list(fname, "cu_seqlens_padded", opts.cu_seqlens_padded or opts.cu_seqlens)
  local seqs
  if fmt == "thd" or cu ~= nil then
    if cu == nil then fail(fname, "cu_seqlens_padded: required for thd (the padded offsets of the sequences)", 3) end
    seqs = {}
    for i = 1, #cu - 1 do seqs[i] = { cu[i], cu[i + 1] - cu[i] } end
  else
    seqs = { { 0, x_len(sd) } }
  end
  local nc = nchunks(cp, lb)
  for i, s in ipairs(seqs) do
    if s[2] < 0 or s[2] % nc ~= 0 then
      fail(fname, string.format("%s: sequence %d has (padded) length %d, which must be divisible by %s = %d " ..
        "(load_balance = %s)", cu and "cu_seqlens_padded" or "x", i, s[2], lb == "contiguous" and "cp_size" or "2*cp_size",
        nc, lb), 3)
    end
  end
  return cp, lb, sd, seqs
end

-- al.cp.split(x, {cp_size=, qkv_format= | seq_dim=, load_balance="dual_chunk_swap"|"contiguous", cu_seqlens_padded=})
-- -> list (by rank + 1) of contiguous shards of x along its sequence dim; thd: per sequence.
function M.split(x, opts)
  local fname = "cp.split"
  if not T.is_tensor(x) then fail(fname, "x: expected a tensor, got " .. type(x), 2) end
  local cp, lb, sd, seqs = parse_split_opts(fname, function(d) return x:size(d) end, opts)
  if sd < 1 or sd > x:dim() then fail(fname, "seq_dim: " .. sd .. " out of range for a " .. x:dim() .. "-d tensor", 2) end
  local total = seqs[#seqs][1] + seqs[#seqs][2]
  if total > x:size(sd) then
    fail(fname, string.format("x: has %d rows along dim %d, cu_seqlens_padded needs %d", x:size(sd), sd, total), 2)
  end
  local nc = nchunks(cp, lb)
  local parts = {}
  for r = 0, cp - 1 do
    local shape = x:size()
    shape[sd] = total / cp
    local out = al.zeros(shape, { dtype = x:dtype(), device = x:device() })
    local lo = 0
    for _, s in ipairs(seqs) do
      local c = s[2] / nc
      for k, g in ipairs(chunk_ids(cp, lb, r)) do
        if c > 0 then out:narrow(sd, lo + (k - 1) * c + 1, c):copy_(x:narrow(sd, s[1] + g * c + 1, c)) end
      end
      lo = lo + s[2] / cp
    end
    parts[r + 1] = out
  end
  return parts
end

-- al.cp.gather(parts, opts): the inverse of split (same opts) -> the full tensor (rows past the last
-- sequence of a thd tensor are zero).
function M.gather(parts, opts)
  local fname = "cp.gather"
  if type(parts) ~= "table" or not T.is_tensor(parts[1]) then fail(fname, "parts: expected a list of tensors (one per rank)", 2) end
  local p1 = parts[1]
  local cp0 = type(opts) == "table" and opts.cp_size
  if cp0 and #parts ~= cp0 then fail(fname, string.format("parts: expected %d tensors (cp_size), got %d", cp0, #parts), 2) end
  local sd0 = type(opts) == "table" and (opts.seq_dim or SEQ_DIM[opts.qkv_format or "bshd"]) or 2
  local cp, lb, sd, seqs = parse_split_opts(fname, function(d) return p1:size(d) * #parts end, opts)
  local total = seqs[#seqs][1] + seqs[#seqs][2]
  local nc = nchunks(cp, lb)
  for r = 1, cp do
    local p = parts[r]
    if not T.is_tensor(p) or p:dim() ~= p1:dim() or p:size(sd) < total / cp then
      fail(fname, string.format("parts[%d]: expected a tensor like parts[1] with %d rows along dim %d", r, total / cp, sd0), 2)
    end
  end
  local shape = p1:size()
  shape[sd] = total
  local out = al.zeros(shape, { dtype = p1:dtype(), device = p1:device() })
  for r = 0, cp - 1 do
    local lo = 0
    for _, s in ipairs(seqs) do
      local c = s[2] / nc
      for k, g in ipairs(chunk_ids(cp, lb, r)) do
        if c > 0 then out:narrow(sd, s[1] + g * c + 1, c):copy_(parts[r + 1]:narrow(sd, lo + (k - 1) * c + 1, c)) end
      end
      lo = lo + s[2] / cp
    end
  end
  return out
end

-- bshd-shaped views [B, S, H, D] of the sequences of t (user's format): bshd: t; sbhd: transposed view;
-- thd: one [1, len, H, D] view per sequence (seqs: {{start, len}}, 0-based starts).
local function seg_views(t, fmt, seqs)
  if fmt == "bshd" then return { t } end
  if fmt == "sbhd" then return { t:transpose(1, 2) } end
  local v = {}
  for i, s in ipairs(seqs) do v[i] = t:narrow(1, s[1] + 1, s[2]):unsqueeze(1) end
  return v
end

local function clamp(x, lo, hi) return x < lo and lo or (x > hi and hi or x) end

M.fail, M.to_list, M.LOAD_BALANCE, M.nchunks, M.SEQ_DIM = fail, to_list, LOAD_BALANCE, nchunks, SEQ_DIM
M.seg_views, M.clamp = seg_views, clamp
function M.install(a) al = a end

return M
