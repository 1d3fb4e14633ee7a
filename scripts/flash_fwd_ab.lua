-- scripts/flash_fwd_ab.lua — A/B of two versions of the flash forward kernels (a kernel edit, a -D default
-- flipped), one process per kernel folder, on a GPU:
--   for k in /tmp/k_a /tmp/k_b; do ATTNLAB_KERNEL_DIR=$k luajit scripts/flash_fwd_ab.lua > $k.log; done
--   diff <(grep '^C ' /tmp/k_a.log) <(grep '^C ' /tmp/k_b.log)     # empty: bit-identical outputs
--   grep '^T ' /tmp/k_*.log                                         # forward times
-- "C" lines: a hash of the output's exact f32 bits and its absolute sum, for small shapes that cover one
-- tile, several tiles with a partial last one, d = 64 / 128 / 256, no mask and causal, with and without a
-- tanh soft-capping score_mod (a schedule-only change must leave them identical). "T" lines: best-of-5
-- mean forward time (10 calls each, host clock around a synchronise) at b = 2, s = 4096, h = 16, d = 128,
-- bf16, plain and soft-capped, no mask and causal, with TFLOP/s (4 b h s^2 d, halved for causal).
-- PROBE_CPU=1 runs the checksum half on the CPU backend (a dry run of the script without a GPU).
-- Kernel folders are read at run time (nvrtc_cache.cu): run it from the repository root after `make`.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"
local ffi = require "ffi"
local clock = require("attnlab.progress").clock
local dev = os.getenv("PROBE_CPU") and "cpu" or "cuda"
local sc = function(score) return 30 * al.tanh(score / 30) end

local function inputs(b, s, h, d, seed)
  al.manual_seed(seed)
  return { query_layer = al.randn({ b, s, h, d }, { dtype = "bf16", device = dev }),
    key_layer = al.randn({ b, s, h, d }, { dtype = "bf16", device = dev }),
    value_layer = al.randn({ b, s, h, d }, { dtype = "bf16", device = dev }),
    qkv_format = "bshd", backend = dev == "cpu" and "cpu" or "flash" }
end
local function with(a, e) local t = {} for k, v in pairs(a) do t[k] = v end for k, v in pairs(e) do t[k] = v end return t end

-- checksums: a 32-bit multiply-add hash of the output's f32 bits, and the sum of its absolute values
for _, c in ipairs { { 1, 300, 4, 128 }, { 1, 100, 4, 128 }, { 2, 1000, 2, 64 }, { 1, 300, 2, 256 } } do
  local a = inputs(c[1], c[2], c[3], c[4], 7)
  for _, m in ipairs { "no_mask", "causal" } do
    for _, v in ipairs(c[4] == 128 and { "plain", "softcap" } or { "plain" }) do
      local args = with(a, { attn_mask_type = m })
      if v == "softcap" then args.score_mod = sc end
      local out = al.attention.forward(args):float():cpu():flat_values()
      local h, s = 2166136261ULL, 0
      local u = ffi.new("union { float f; uint32_t u; }")
      for i = 1, #out do u.f = out[i]; h = (h * 16777619ULL + u.u) % 4294967296ULL; s = s + math.abs(out[i]) end
      print(string.format("C %s %s d%d s%d %s %.10g", v, m, c[4], c[2], tostring(h), s))
    end
  end
end

if dev == "cpu" then os.exit(0) end
local b, s, h, d = 2, 4096, 16, 128
local a = inputs(b, s, h, d, 1)
for _, cfg in ipairs { { "plain-nomask", "no_mask", nil, 1 }, { "softcap-nomask", "no_mask", sc, 1 },
                       { "plain-causal", "causal", nil, 0.5 }, { "softcap-causal", "causal", sc, 0.5 } } do
  local args = with(a, { attn_mask_type = cfg[2], score_mod = cfg[3] })
  for _ = 1, 3 do al.attention.forward(args) end
  al.cuda.synchronize()
  local best = math.huge
  for _ = 1, 5 do
    local t0 = clock()
    for _ = 1, 10 do al.attention.forward(args) end
    al.cuda.synchronize()
    best = math.min(best, (clock() - t0) / 10)
  end
  local fl = 4 * b * h * s * s * d * cfg[4]
  print(string.format("T %s %.1f us %.1f TFLOP/s", cfg[1], best * 1e6, fl / best / 1e12))
end
