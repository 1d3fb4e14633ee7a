--[=[
peer_worker.lua — attnlab's side of scripts/peer_interleaved.py: times one attention shape at a time on
command, so that the driver can alternate our measurements with PyTorch's in the same minute.

Why: our fused calls and PyTorch's run the same cuDNN kernels with the same durations under ncu, yet two
separate bench runs a few minutes apart disagree by up to 10% (the GPU's clocks drift with its power and
temperature history: PyTorch's own forward at 1x16x16384x128 measured 3.29 ms, then 3.59 ms in the same
process). Alternating the two sides (AB BA AB BA) and taking medians cancels that drift.

Protocol (one command per line on stdin, one answer per line on stdout, flushed):
  setup B H S D MASK LAYOUT [BACKEND [DEVICE]]   allocate bf16 inputs (LAYOUT separate = bshd q/k/v,
                                                 bs3hd = one packed qkv_layer), warm the forward and
                                                 backward up; answers "READY" or "JSON {error}"
  time ITERS                                     mean ms of the forward over ITERS calls, then of the
                                                 backward over ITERS calls, each after 2 warm-up calls
                                                 (CUDA events on cuda, the wall clock on cpu), exactly
                                                 as the driver times PyTorch; answers
                                                 "JSON {fwd_ms, bwd_ms, ...}"
  quit
BACKEND defaults to fused, DEVICE to cuda. Errors are answered as JSON lines with an "error" field; the
worker never exits on a bad command.
Run by the driver:  python3 scripts/peer_interleaved.py   (starts: luajit scripts/peer_worker.lua)
]=]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
local json = require "attnlab.json"

local function answer(line)
  io.stdout:write(line, "\n")
  io.stdout:flush()
end
local function reply(t) answer("JSON " .. json.encode(t)) end

local cur   -- the current shape: { args =, dout =, device =, flops = }

local function setup(w)
  local b, h, s, d = tonumber(w[2]), tonumber(w[3]), tonumber(w[4]), tonumber(w[5])
  local mask, layout, backend, device = w[6], w[7], w[8] or "fused", w[9] or "cuda"
  if not (b and h and s and d and mask and layout) then
    error("setup: expected 'setup B H S D MASK LAYOUT [BACKEND [DEVICE]]', got '" .. table.concat(w, " ") .. "'", 0)
  end
  if layout ~= "separate" and layout ~= "bs3hd" then
    error("setup: LAYOUT: expected separate or bs3hd, got " .. layout, 0)
  end
  cur = nil
  collectgarbage()
  if device == "cuda" then al.cuda.empty_cache() end
  local o = { dtype = "bf16", device = device }
  local args = { qkv_format = "bshd", attn_mask_type = mask, backend = backend }
  if layout == "separate" then
    args.query_layer, args.key_layer, args.value_layer = al.randn({ b, s, h, d }, o), al.randn({ b, s, h, d }, o),
      al.randn({ b, s, h, d }, o)
  else
    args.qkv_layer, args.qkv_interleave_dim = al.randn({ b, s, 3, h, d }, o), -3
  end
  local c = { args = args, dout = al.randn({ b, s, h * d }, o), device = device,
    flops = 4 * b * h * s * s * d * (mask:match("causal") and 0.5 or 1) }
  for _ = 1, 2 do   -- plans built, allocator warm
    local _, ctx = al.attention.forward(args)
    al.attention.backward(ctx, c.dout)
  end
  if device == "cuda" then al.cuda.synchronize() end
  cur = c
  answer("READY")
end

-- the driver's own timing, step for step: 2 warm-up calls, then CUDA events around iters calls
-- (al.cuda.time with warmup = 0: its extra warm-up until the allocator is calm would give our side more warm
-- calls than PyTorch's; setup has already warmed the allocator)
local function mean_ms(fn, iters)
  fn(); fn()
  if cur.device == "cuda" then return al.cuda.time(fn, { warmup = 0, iters = iters }) end
  local t0 = al.clock()
  for _ = 1, iters do fn() end
  return (al.clock() - t0) * 1e3 / iters
end

local function time_it(w)
  if not cur then error("time: no shape: send 'setup ...' first", 0) end
  local iters = tonumber(w[2] or "10")
  if not iters or iters < 1 or iters % 1 ~= 0 then error("time: ITERS: expected a positive integer, got " .. tostring(w[2]), 0) end
  local ctx
  local fwd = mean_ms(function() local _; _, ctx = al.attention.forward(cur.args) end, iters)
  local bwd = mean_ms(function() al.attention.backward(ctx, cur.dout) end, iters)
  reply({ fwd_ms = fwd, bwd_ms = bwd, fwd_tflops = cur.flops / (fwd * 1e-3) / 1e12,
    bwd_tflops = 2.5 * cur.flops / (bwd * 1e-3) / 1e12, iters = iters })
end

for line in io.stdin:lines() do
  local w = {}
  for x in line:gmatch("%S+") do w[#w + 1] = x end
  if w[1] == "quit" then break end
  if w[1] then
    local ok, err = pcall(function()
      if w[1] == "setup" then setup(w)
      elseif w[1] == "time" then time_it(w)
      else error("unknown command '" .. w[1] .. "' (setup, time, quit)", 0) end
    end)
    if not ok then reply({ error = tostring(err) }) end
  end
end
