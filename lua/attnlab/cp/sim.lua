--[[
attnlab.cp.sim — the communicator group interface of context parallelism, and SimGroup: n simulated ranks in
one process (transfers are copies). Part of attnlab.cp.
]]
local shards = require "attnlab.cp.shards"

local fail = shards.fail
local M = {}

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

return M
