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
]]
local lffi = require "attnlab.ffi"
local T = require "attnlab.tensor"
local ffi, C = lffi.ffi, lffi.C

local M = {}
local al -- set by install

local NEG_INF = -math.huge

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

---------------------------------------------------------------------------------------------------
-- communicator groups
---------------------------------------------------------------------------------------------------
-- Interface (tables keyed by rank + 1, entries for the group's local ranks):
--   g.size, g.local_ranks, g.kind ("sim" | "nccl"), g:device_of(r)
--   g:sendrecv(send, shift)   send[r] = list of tensors; returns recv with recv[r] = what rank r-shift sent
--   g:all_gather(send)        send[r] = tensor; returns out[r] = list of size tensors (out[r][i]: rank i's)
--   g:all_to_all(send)        send[r][j] = tensor for rank j; returns out[j][r] = what r sent to j
--   g:reduce_scatter(send)    send[r][j] = contribution to rank j; returns out[j] = sum over r (rank order)
--   g:all_reduce(send)        send[r] = tensor; returns out[r] = sum over ranks
--   g:barrier()
-- Received tensors are new contiguous tensors; the sent ones are not modified.
local SimGroup = {}
SimGroup.__index = SimGroup

-- al.cp.SimGroup(n): n simulated ranks in this process; transfers are copies (CPU tensors, or tensors of
-- one GPU: the copies go to the current stream, so al.cuda.with_stream places them).
function M.SimGroup(n)
  -- bounded: a simulated rank is a Lua table of tensors, and CP sizes beyond 1024 make no sense
  if type(n) ~= "number" or n < 1 or n > 1024 or n % 1 ~= 0 then
    fail("cp.SimGroup", "n: expected an integer in 1..1024, got " .. tostring(n), 2)
  end
  local lr = {}
  for r = 1, n do lr[r] = r end
  return setmetatable({ size = n, local_ranks = lr, kind = "sim" }, SimGroup)
end

local function copy_of(t) return t:contiguous() == t and t:clone() or t:contiguous() end

function SimGroup:device_of(r) return nil end
function SimGroup:sendrecv(send, shift)
  local n, recv = self.size, {}
  for r = 1, n do
    local dst = (r - 1 + shift) % n + 1
    local l = {}
    for i, t in ipairs(send[r]) do l[i] = copy_of(t) end
    recv[dst] = l
  end
  return recv
end
function SimGroup:all_gather(send)
  local out = {}
  for r = 1, self.size do
    out[r] = {}
    for i = 1, self.size do out[r][i] = copy_of(send[i]) end
  end
  return out
end
function SimGroup:all_to_all(send)
  local out = {}
  for j = 1, self.size do
    out[j] = {}
    for r = 1, self.size do out[j][r] = copy_of(send[r][j]) end
  end
  return out
end
function SimGroup:reduce_scatter(send)
  local out = {}
  for j = 1, self.size do
    local acc = copy_of(send[1][j])
    for r = 2, self.size do acc = acc + send[r][j] end
    out[j] = acc
  end
  return out
end
function SimGroup:all_reduce(send)
  local acc = copy_of(send[1])
  for r = 2, self.size do acc = acc + send[r] end
  local out = {}
  for r = 1, self.size do out[r] = acc:clone() end
  return out
end
function SimGroup:barrier() end
function SimGroup:__tostring() return "attnlab.cp.SimGroup(" .. self.size .. ")" end

---------------------------------------------------------------------------------------------------
-- NCCL (LuaJIT FFI over libnccl.so.2, loaded at run time; declarations and enum values from NCCL
-- 2.28.9's public nccl.h, /usr/local/cuda-13.0/include/nccl.h)
---------------------------------------------------------------------------------------------------
local nccl_lib, nccl_err
local NCCL_CDEF = [[
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
  ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7 } ncclResult_t;
int ncclGetVersion(int *version);
int ncclGetUniqueId(ncclUniqueId *uniqueId);
int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
int ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
int ncclCommDestroy(ncclComm_t comm);
int ncclCommGetAsyncError(ncclComm_t comm, int *asyncError);
const char *ncclGetErrorString(int result);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclSend(const void *sendbuff, size_t count, int datatype, int peer, ncclComm_t comm, void *stream);
int ncclRecv(void *recvbuff, size_t count, int datatype, int peer, ncclComm_t comm, void *stream);
int ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, int datatype, ncclComm_t comm, void *stream);
int ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, ncclComm_t comm, void *stream);
int ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, int datatype, int op, ncclComm_t comm, void *stream);
]]
-- ncclDataType_t and ncclRedOp_t values (nccl.h 2.28.9)
local NCCL_DTYPE = { i32 = 2, i64 = 4, u8 = 1, bool = 1, f16 = 6, f32 = 7, f64 = 8, bf16 = 9, fp8_e4m3 = 10, fp8_e5m2 = 11 }
local NCCL_SUM = 0

-- the library (or nil, reason); ATTNLAB_NCCL_LIB overrides the name
function M.nccl()
  if nccl_lib then return nccl_lib end
  if nccl_err then return nil, nccl_err end
  pcall(ffi.cdef, "void *dlopen(const char *file, int mode); char *dlerror(void);")
  local ok, e = pcall(ffi.cdef, NCCL_CDEF)
  if not ok and not tostring(e):find("redefin", 1, true) then nccl_err = "cannot declare the NCCL API: " .. tostring(e) return nil, nccl_err end
  local names = { "libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib/libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2" }
  local env = os.getenv("ATTNLAB_NCCL_LIB")
  if env and env ~= "" then table.insert(names, 1, env) end
  local why = {}
  for _, n in ipairs(names) do
    do
      -- pinned first with RTLD_NODELETE (glibc 0x1000): LuaJIT dlcloses ffi.load'ed libraries when the
      -- state closes, and unloading NCCL under its running bootstrap/proxy threads crashes the exit
      if C.dlopen(n, 0x2 + 0x100 + 0x1000) == nil then
        local msg = C.dlerror() -- (may be NULL: the FFI's own symbol lookups clear it)
        why[#why + 1] = n .. ": " .. (msg ~= nil and ffi.string(msg) or "dlopen failed")
      end
      local okl, lib = pcall(ffi.load, n)
      if okl then nccl_lib = lib return lib end
      if #why == 0 or not why[#why]:find(n, 1, true) then why[#why + 1] = tostring(lib) end
    end
  end
  nccl_err = "libnccl.so.2 could not be loaded (" .. table.concat(why, "; ") ..
    "); install NCCL or set ATTNLAB_NCCL_LIB to its path"
  return nil, nccl_err
end

-- al.cp.nccl_version(): NCCL_VERSION_CODE of the loadable libnccl.so.2 (e.g. 22809 = 2.28.9), or nil, why.
function M.nccl_version()
  local lib, why = M.nccl()
  if not lib then return nil, why end
  local v = ffi.new("int[1]")
  if lib.ncclGetVersion(v) ~= 0 then return nil, "ncclGetVersion failed" end
  return v[0]
end

local function ncheck(lib, rc, what)
  if rc ~= 0 then error("cp.NcclGroup: " .. what .. ": " .. ffi.string(lib.ncclGetErrorString(rc)) .. " (ncclResult " .. tonumber(rc) .. ")", 3) end
end

local NcclGroup = {}
NcclGroup.__index = NcclGroup

-- al.cp.NcclGroup{devices = {0, 1, ...}}            one process drives all listed GPUs (rank r on devices[r])
-- al.cp.NcclGroup{rank =, world_size =, device =, unique_id_file =}   one rank of a multi-process job
-- (rank 0-based; rank 0 writes the NCCL unique id to unique_id_file, the others wait for it).
function M.NcclGroup(opts)
  local fname = "cp.NcclGroup"
  if type(opts) ~= "table" then fail(fname, "expected a table {devices=} or {rank=, world_size=, device=, unique_id_file=}", 2) end
  local lib, why = M.nccl()
  if not lib then fail(fname, why, 2) end
  if not al.cuda.available() then fail(fname, "no usable GPU: " .. select(2, al.cuda.available()), 2) end
  local ndev = al.cuda.device_count()
  local g = setmetatable({ kind = "nccl", lib = lib, comms = {}, dev = {}, local_ranks = {} }, NcclGroup)
  if opts.devices then
    local n = #opts.devices
    if n < 1 then fail(fname, "devices: expected a non-empty list of device indices", 2) end
    local dl = ffi.new("int[?]", n)
    for i, d in ipairs(opts.devices) do
      if d < 0 or d >= ndev then fail(fname, string.format("devices[%d] = %d: there are %d CUDA devices", i, d, ndev), 2) end
      dl[i - 1] = d
    end
    local comms = ffi.new("ncclComm_t[?]", n)
    ncheck(lib, lib.ncclCommInitAll(comms, n, dl), "ncclCommInitAll")
    g.size = n
    for r = 1, n do g.comms[r], g.dev[r], g.local_ranks[r] = comms[r - 1], opts.devices[r], r end
  else
    local rank, ws, dev, file = opts.rank, opts.world_size, opts.device or 0, opts.unique_id_file
    if type(rank) ~= "number" or type(ws) ~= "number" or rank < 0 or rank >= ws then
      fail(fname, "rank / world_size: expected 0 <= rank < world_size, got " .. tostring(rank) .. " / " .. tostring(ws), 2)
    end
    if type(file) ~= "string" then fail(fname, "unique_id_file: expected a path (scripts/attnlab-launch sets ATTNLAB_NCCL_ID_FILE)", 2) end
    if dev < 0 or dev >= ndev then fail(fname, string.format("device = %d: there are %d CUDA devices", dev, ndev), 2) end
    local id = ffi.new("ncclUniqueId")
    if rank == 0 then
      ncheck(lib, lib.ncclGetUniqueId(id), "ncclGetUniqueId")
      local tmp = file .. ".tmp"
      local f = assert(io.open(tmp, "wb"))
      f:write(ffi.string(id, 128))
      f:close()
      assert(os.rename(tmp, file)) -- atomic: readers never see a partial id
    else
      local deadline = os.time() + (opts.timeout or 120)
      while true do
        local f = io.open(file, "rb")
        if f then
          local s = f:read("*a")
          f:close()
          if #s == 128 then ffi.copy(id, s, 128) break end
        end
        if os.time() > deadline then fail(fname, "timed out waiting for rank 0's NCCL id in " .. file, 2) end
        os.execute("sleep 0.05")
      end
    end
    local sp = ffi.new("void *[1]")
    T.check(C.al_cuda_raw_stream(dev, sp), fname) -- makes dev the current CUDA device for ncclCommInitRank
    local comm = ffi.new("ncclComm_t[1]")
    ncheck(lib, lib.ncclCommInitRank(comm, ws, id, rank), "ncclCommInitRank")
    g.size = ws
    g.comms[rank + 1], g.dev[rank + 1], g.local_ranks[1] = comm[0], dev, rank + 1
  end
  return g
end

function NcclGroup:device_of(r) return self.dev[r] end
function NcclGroup:destroy()
  for r, c in pairs(self.comms) do self.lib.ncclCommDestroy(c) self.comms[r] = nil end
end
function NcclGroup:__tostring() return "attnlab.cp.NcclGroup(" .. tostring(self.size) .. " ranks, local " .. #self.local_ranks .. ")" end

local stream_buf = ffi.new("void *[1]")
local function raw_stream(dev)
  T.check(C.al_cuda_raw_stream(dev, stream_buf), "cp.NcclGroup")
  return stream_buf[0]
end
local function nccl_buf(t, r, self)
  if not t:is_cuda() then error("cp.NcclGroup: rank " .. (r - 1) .. ": expected a CUDA tensor", 3) end
  local dt = NCCL_DTYPE[t:dtype()]
  if dt == nil then error("cp.NcclGroup: dtype " .. t:dtype() .. " has no NCCL type", 3) end
  return t:contiguous(), dt
end
function NcclGroup:_group(fn)
  local lib = self.lib
  ncheck(lib, lib.ncclGroupStart(), "ncclGroupStart")
  local ok, e = pcall(fn)
  local rc = lib.ncclGroupEnd()
  if not ok then error(e, 0) end
  ncheck(lib, rc, "ncclGroupEnd")
end
function NcclGroup:sendrecv(send, shift)
  local n, recv, lib, keep = self.size, {}, self.lib, {}
  self:_group(function()
    for _, r in ipairs(self.local_ranks) do
      local to, from = (r - 1 + shift) % n, (r - 1 - shift) % n
      local s = raw_stream(self.dev[r])
      recv[r] = {}
      for i, t in ipairs(send[r]) do
        local tc, dt = nccl_buf(t, r)
        keep[#keep + 1] = tc
        local rb = al.empty(t:size(), { dtype = t:dtype(), device = t:device() })
        recv[r][i] = rb
        -- (bytes-exact counts: the tensor's element count in its own type)
        ncheck(lib, lib.ncclSend(tc:data_ptr(), tc:numel(), dt, to, self.comms[r], s), "ncclSend")
        ncheck(lib, lib.ncclRecv(rb:data_ptr(), rb:numel(), dt, from, self.comms[r], s), "ncclRecv")
      end
    end
  end)
  recv._keep = keep -- the contiguous send copies must outlive the queued transfers (caller keeps recv)
  return recv
end
function NcclGroup:all_gather(send)
  local n, out, lib = self.size, {}, self.lib
  self:_group(function()
    for _, r in ipairs(self.local_ranks) do
      local tc, dt = nccl_buf(send[r], r)
      local shape = tc:size()
      table.insert(shape, 1, n)
      local buf = al.empty(shape, { dtype = tc:dtype(), device = tc:device() })
      ncheck(lib, lib.ncclAllGather(tc:data_ptr(), buf:data_ptr(), tc:numel(), dt, self.comms[r], raw_stream(self.dev[r])), "ncclAllGather")
      out[r] = { _keep = tc }
      for i = 1, n do out[r][i] = buf:select(1, i) end
    end
  end)
  return out
end
function NcclGroup:all_to_all(send)
  local n, out, lib, keep = self.size, {}, self.lib, {}
  self:_group(function()
    for _, r in ipairs(self.local_ranks) do
      local s = raw_stream(self.dev[r])
      out[r] = {}
      for j = 1, n do
        local tc, dt = nccl_buf(send[r][j], r)
        keep[#keep + 1] = tc
        local rb = al.empty(tc:size(), { dtype = tc:dtype(), device = tc:device() })
        out[r][j] = rb -- (shapes are symmetric in the CP exchanges: what j sends r is shaped like r's to j)
        ncheck(lib, lib.ncclSend(tc:data_ptr(), tc:numel(), dt, j - 1, self.comms[r], s), "ncclSend")
        ncheck(lib, lib.ncclRecv(rb:data_ptr(), rb:numel(), dt, j - 1, self.comms[r], s), "ncclRecv")
      end
    end
  end)
  out._keep = keep
  return out
end
function NcclGroup:reduce_scatter(send)
  local n, out, lib = self.size, {}, self.lib
  self:_group(function()
    for _, r in ipairs(self.local_ranks) do
      local p1 = send[r][1]
      local shape = p1:size()
      table.insert(shape, 1, n)
      local buf = al.empty(shape, { dtype = p1:dtype(), device = p1:device() })
      for j = 1, n do buf:select(1, j):copy_(send[r][j]) end
      local rb = al.empty(p1:size(), { dtype = p1:dtype(), device = p1:device() })
      local _, dt = nccl_buf(p1, r)
      ncheck(lib, lib.ncclReduceScatter(buf:data_ptr(), rb:data_ptr(), rb:numel(), dt, NCCL_SUM, self.comms[r],
        raw_stream(self.dev[r])), "ncclReduceScatter")
      out[r] = rb
      out["_keep" .. r] = buf
    end
  end)
  return out
end
function NcclGroup:all_reduce(send)
  local out, lib = {}, self.lib
  self:_group(function()
    for _, r in ipairs(self.local_ranks) do
      local tc, dt = nccl_buf(send[r], r)
      local rb = al.empty(tc:size(), { dtype = tc:dtype(), device = tc:device() })
      ncheck(lib, lib.ncclAllReduce(tc:data_ptr(), rb:data_ptr(), tc:numel(), dt, NCCL_SUM, self.comms[r],
        raw_stream(self.dev[r])), "ncclAllReduce")
      out[r] = rb
      out["_keep" .. r] = tc
    end
  end)
  return out
end
function NcclGroup:barrier()
  for _, r in ipairs(self.local_ranks) do
    local one = al.ones({ 1 }, { dtype = "f32", device = "cuda:" .. self.dev[r] })
    self:all_reduce({ [r] = one })
    al.cuda.synchronize(self.dev[r])
  end
  for _, r in ipairs(self.local_ranks) do
    local e = ffi.new("int[1]")
    ncheck(self.lib, self.lib.ncclCommGetAsyncError(self.comms[r], e), "ncclCommGetAsyncError")
    if e[0] ~= 0 then ncheck(self.lib, e[0], "asynchronous error") end
  end
end

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
-- overlap: a communication stream per local rank (GPU only)
---------------------------------------------------------------------------------------------------
-- given: the caller's communication streams (cp_stream, TE's name: per local rank), or nil for new ones
local function make_streams(group, ranks, tensors, given)
  local ov = { comm = {}, compute = {}, ready = {}, done = {}, keep = {}, devs = {} }
  for _, r in ipairs(ranks) do
    local dev = tensors[r]:device():match("cuda:(%d+)")
    dev = tonumber(dev) or 0
    ov.devs[r] = dev
    local cs = given and given[r]
    if cs and cs.device ~= dev then
      fail("cp.attention_forward", string.format("cp_stream: rank %d's stream is on cuda:%s, its tensors on cuda:%d",
        r - 1, tostring(cs.device), dev), 3)
    end
    ov.comm[r], ov.compute[r] = cs or al.cuda.Stream(dev), al.cuda.Stream(dev)
    ov.ready[r], ov.done[r] = al.cuda.Event(dev), al.cuda.Event(dev)
    -- the compute stream starts after the caller's queued work (the inputs)
    local e = al.cuda.Event(dev):record()
    ov.compute[r]:wait_event(e)
  end
  return ov
end

-- run fn with the given stream of every local rank current (restored after, even on error)
local function with_streams(ov, which, ranks, fn)
  local prev, set = {}, {}
  for _, r in ipairs(ranks) do
    local s = ov[which][r]
    if not set[s.device] then
      prev[s.device] = al.cuda.current_stream(s.device) or false
      al.cuda.set_stream(s)
      set[s.device] = true
    end
  end
  local ok, e = pcall(fn)
  for dev, p in pairs(prev) do al.cuda.set_stream(p or nil, dev) end
  if not ok then error(e, 0) end
end

-- start a ring exchange: overlapped (comm streams) when ov, else on the current streams
local function exchange_start(group, ranks, send, shift, ov)
  if not ov then return { recv = group:sendrecv(send, shift) } end
  for _, r in ipairs(ranks) do
    ov.ready[r]:record(ov.compute[r])
    ov.comm[r]:wait_event(ov.ready[r])
  end
  local recv
  with_streams(ov, "comm", ranks, function() recv = group:sendrecv(send, shift) end)
  for _, r in ipairs(ranks) do ov.done[r]:record(ov.comm[r]) end
  ov.keep[#ov.keep + 1] = send
  ov.keep[#ov.keep + 1] = recv
  return { recv = recv, ov = ov }
end

local function exchange_wait(h, ranks)
  if h.ov then for _, r in ipairs(ranks) do h.ov.compute[r]:wait_event(h.ov.done[r]) end end
  return h.recv
end

local function finish_streams(ov, ranks)
  if not ov then return end
  for _, r in ipairs(ranks) do ov.compute[r]:synchronize() ov.comm[r]:synchronize() end
  ov.keep = {}
end

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

---------------------------------------------------------------------------------------------------
-- all_gather
---------------------------------------------------------------------------------------------------
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
  for _, r in ipairs(S.ranks) do out[r] = M.gather(parts_by_rank[r], split_opts(S, kv)) end
  return out
end

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
    dks[r] = M.split(dK, split_opts(S, true))
    dvs[r] = M.split(dV, split_opts(S, true))
  end
  local dk, dv = S.group:reduce_scatter(dks), S.group:reduce_scatter(dvs)
  for _, r in ipairs(S.ranks) do res[r][2], res[r][3] = dk[r], dv[r] end
  return res
end

---------------------------------------------------------------------------------------------------
-- a2a (Ulysses)
---------------------------------------------------------------------------------------------------
-- x[r]: local shards [.., H, D] -> per local rank the full sequence of its head group [.., H/cp, D]
local function a2a_to_heads(S, x, kv)
  local cp = S.cp
  local send = {}
  for _, r in ipairs(S.ranks) do
    local hh = x[r]:size(-2) / cp
    send[r] = {}
    for j = 1, cp do send[r][j] = x[r]:narrow(-2, (j - 1) * hh + 1, hh):contiguous() end
  end
  local recv = S.group:all_to_all(send)
  return gather_full(S, recv, kv)
end

-- y[r]: full sequence of rank r's head group -> per local rank its shard with all heads
local function a2a_to_seq(S, y, kv, h_total)
  local cp = S.cp
  local send = {}
  for _, r in ipairs(S.ranks) do send[r] = M.split(y[r], split_opts(S, kv)) end
  local recv = S.group:all_to_all(send)
  local out = {}
  for _, r in ipairs(S.ranks) do
    local p1 = recv[r][1]
    local shape = p1:size()
    local hh = shape[#shape - 1]
    shape[#shape - 1] = hh * cp
    local t = al.empty(shape, { dtype = p1:dtype(), device = p1:device() })
    for j = 1, cp do t:narrow(-2, (j - 1) * hh + 1, hh):copy_(recv[r][j]) end
    out[r] = t
  end
  return out
end

local PASS = { "softmax_scale", "compute_dtype", "backend", "deterministic", "window_size", "bottom_right_diagonal",
  "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "max_seqlen_q", "max_seqlen_kv" }

local function a2a_forward(S)
  local Q, K, V = a2a_to_heads(S, S.q, false), a2a_to_heads(S, S.k, true), a2a_to_heads(S, S.v, true)
  local outs, ctxs = {}, {}
  for _, r in ipairs(S.ranks) do
    local a = { query_layer = Q[r], key_layer = K[r], value_layer = V[r], qkv_format = S.fmt,
      attn_mask_type = S.args.attn_mask_type or "causal" }
    for _, n in ipairs(PASS) do if S.args[n] ~= nil then a[n] = S.args[n] end end
    if S.fmt == "thd" then
      for _, n in ipairs { "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded" } do
        local x = a[n]
        if x ~= nil and not T.is_tensor(x) then a[n] = al.tensor(x, { dtype = "i32" }):to(S.device) end
      end
      a.cu_seqlens_kv = a.cu_seqlens_kv or a.cu_seqlens_q
      a.cu_seqlens_kv_padded = a.cu_seqlens_kv_padded or a.cu_seqlens_q_padded
      if a.attn_mask_type == "no_mask" then a.attn_mask_type = "padding" elseif a.attn_mask_type == "causal" then a.attn_mask_type = "padding_causal" end
    end
    local _, ctx = al.attention.forward(a)
    ctxs[r] = ctx
    outs[r] = ctx.out
  end
  local o = a2a_to_seq(S, outs, false)
  return o, ctxs
end

local function a2a_backward(S, ctxs, dout)
  local D = a2a_to_heads(S, dout, false)
  local gq, gk, gv = {}, {}, {}
  for _, r in ipairs(S.ranks) do
    local gr = al.attention.backward(ctxs[r], D[r])
    gq[r], gk[r], gv[r] = gr.query_layer, gr.key_layer, gr.value_layer
  end
  local dq, dk, dv = a2a_to_seq(S, gq, false), a2a_to_seq(S, gk, true), a2a_to_seq(S, gv, true)
  local res = {}
  for _, r in ipairs(S.ranks) do res[r] = { dq[r], dk[r], dv[r] } end
  return res
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
  local S = parse(args, fname)
  local outs, ctx = {}, { S = S }
  if S.comm == "a2a" then
    local o, ctxs = a2a_forward(S)
    ctx.a2a = ctxs
    for _, r in ipairs(S.ranks) do outs[r] = flat(o[r]) end
    ctx.outs = o
    return outs, ctx
  end
  local st = S.comm == "p2p" and p2p_forward(S) or ag_forward(S)
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
  if S.comm == "a2a" then res = a2a_backward(S, ctx.a2a, d)
  elseif S.comm == "p2p" then res = p2p_backward(S, ctx.st, d)
  else res = ag_backward(S, ctx.st, d) end
  local grads = {}
  for _, r in ipairs(S.ranks) do
    grads[r] = { query_layer = res[r][1]:to(S.dtype), key_layer = res[r][2]:to(S.dtype), value_layer = res[r][3]:to(S.dtype) }
  end
  return grads
end

function M.install(a)
  al = a
  al.cp = {
    SimGroup = M.SimGroup, NcclGroup = M.NcclGroup, init = M.init, split = M.split, gather = M.gather,
    attention_forward = M.attention_forward, attention_backward = M.attention_backward,
    nccl_version = M.nccl_version, chunk_ids = M.chunk_ids,
  }
end

return M
