--[[
attnlab.cp.nccl — NCCL through LuaJIT's FFI (libnccl.so.2 loaded at run time) and NcclGroup, the communicator
group of ranks on GPUs (one process driving several, or one rank of a multi-process job). Part of attnlab.cp.
]]
local lffi = require "attnlab.ffi"
local T = require "attnlab.tensor"
local shards = require "attnlab.cp.shards"
local ffi, C = lffi.ffi, lffi.C

local fail = shards.fail
local M = {}
local al -- set by install

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
function M.install(a) al = a end

return M
