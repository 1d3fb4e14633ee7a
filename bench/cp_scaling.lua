-- bench/cp_scaling.lua — context parallelism scaling: time per step (forward + backward) at cp = 1, 2,
-- 4, 8 (as many GPUs as this host has) for s = 32k, 64k, 128k, bf16, causal, bshd, b = 1, h = 16
-- (kv heads 16, and 4 with --gqa), d = 128; modes p2p overlapped, p2p not overlapped, all_gather, a2a;
-- prints ms per step and TFLOP/s per GPU and in total (FLOPs: forward 4*b*h*s*s*d / 2 causal, backward
-- 2.5x the forward). One process drives all GPUs through NCCL group calls (al.cp.NcclGroup{devices}).
-- cp = 1 is plain al.attention on one GPU. A shape whose inputs do not fit is reported and skipped.
-- Without GPUs it says so and exits 0; with one GPU it runs cp = 1 only (and SimGroup is no
-- measure of communication, so it is not timed).
-- Usage: luajit bench/cp_scaling.lua [--quick] [--gqa] [--backend=flash|fused]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"

if not al.cuda.available() then
  local _, why = al.cuda.available()
  print("cp_scaling: needs GPUs; skipped (" .. tostring(why) .. ")")
  os.exit(0)
end

local flags, backend = {}, nil
for _, a in ipairs(arg or {}) do
  flags[a] = true
  backend = a:match("^%-%-backend=(%w+)$") or backend
end
local quick = flags["--quick"]
local ITERS, WARMUP = quick and 2 or 5, 1
local ngpu = al.cuda.device_count()
local SEQS = quick and { 32768 } or { 32768, 65536, 131072 }
local b, h, d = 1, 16, 128
local hg = flags["--gqa"] and 4 or 16
local nccl_ok, nccl_why = al.cp.nccl_version()
if ngpu > 1 and not nccl_ok then print("cp_scaling: NCCL not loadable (" .. tostring(nccl_why) .. "); cp = 1 only") end

local function sync_all(n) for i = 0, n - 1 do al.cuda.synchronize(i) end end

local function time_it(n, fn)
  for _ = 1, WARMUP do fn() end
  sync_all(n)
  local w0 = al.cuda.Event(0):record()
  for _ = 1, ITERS do fn() end
  local w1 = al.cuda.Event(0):record()
  sync_all(n)
  return w0:elapsed_time(w1) / ITERS
end

print(string.format("%-6s %-3s %-16s %10s %12s %12s", "s", "cp", "mode", "ms/step", "TFLOP/s/GPU", "TFLOP/s"))
for _, s in ipairs(SEQS) do
  local flops = 4 * b * h * s * s * d * 0.5 * 3.5
  -- cp = 1
  local ok, err = pcall(function()
    local q = al.randn({ b, s, h, d }, { dtype = "bf16", device = "cuda:0" })
    local k = al.randn({ b, s, hg, d }, { dtype = "bf16", device = "cuda:0" })
    local v = al.randn({ b, s, hg, d }, { dtype = "bf16", device = "cuda:0" })
    local dout = al.randn({ b, s, h * d }, { dtype = "bf16", device = "cuda:0" })
    local ms = time_it(1, function()
      local _, ctx = al.attention.forward { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd",
        attn_mask_type = "causal", backend = backend }
      al.attention.backward(ctx, dout)
    end)
    print(string.format("%-6d %-3d %-16s %10.2f %12.1f %12.1f", s, 1, "single", ms, flops / ms / 1e9, flops / ms / 1e9))
  end)
  if not ok then print(string.format("%-6d %-3d single: skipped (%s)", s, 1, tostring(err):sub(1, 120))) end
  if nccl_ok then
    for _, cp in ipairs { 2, 4, 8 } do
      if cp <= ngpu then
        local devs = {}
        for i = 1, cp do devs[i] = i - 1 end
        local g = al.cp.NcclGroup { devices = devs }
        local ok2, err2 = pcall(function()
          al.manual_seed(1)
          local function shards(shape)
            local t = {}
            local sh = { shape[1], shape[2] / cp, shape[3], shape[4] }
            for r = 1, cp do t[r] = al.randn(sh, { dtype = "bf16", device = "cuda:" .. (r - 1) }) end
            return t
          end
          local qs, ks, vs = shards({ b, s, h, d }), shards({ b, s, hg, d }), shards({ b, s, hg, d })
          local ds = {}
          for r = 1, cp do ds[r] = al.randn({ b, s / cp, h * d }, { dtype = "bf16", device = "cuda:" .. (r - 1) }) end
          local modes = { { "p2p", true, "p2p overlapped" }, { "p2p", false, "p2p serial" }, { "all_gather", true, "all_gather" } }
          if h % cp == 0 and hg % cp == 0 then modes[#modes + 1] = { "a2a", true, "a2a" } end
          for _, m in ipairs(modes) do
            local ms = time_it(cp, function()
              local _, ctx = al.cp.attention_forward { group = g, cp_comm_type = m[1], overlap = m[2], qkv_format = "bshd",
                attn_mask_type = "causal", query_layer = qs, key_layer = ks, value_layer = vs, backend = backend }
              al.cp.attention_backward(ctx, ds)
            end)
            print(string.format("%-6d %-3d %-16s %10.2f %12.1f %12.1f", s, cp, m[3], ms, flops / ms / 1e9 / cp, flops / ms / 1e9))
          end
        end)
        if not ok2 then print(string.format("%-6d %-3d skipped (%s)", s, cp, tostring(err2):sub(1, 160))) end
        g:destroy()
      end
    end
  end
  collectgarbage()
end
