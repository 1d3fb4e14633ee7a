--[[
attnlab.cp.streams — overlap for the p2p ring on GPUs: a communication stream per local rank, the exchange
started there and waited for on the compute stream. Part of attnlab.cp.
]]
local shards = require "attnlab.cp.shards"

local fail = shards.fail
local M = {}
local al -- set by install

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

M.make_streams, M.with_streams, M.exchange_start, M.exchange_wait, M.finish_streams =
  make_streams, with_streams, exchange_start, exchange_wait, finish_streams
function M.install(a) al = a end

return M
