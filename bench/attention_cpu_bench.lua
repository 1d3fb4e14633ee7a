-- bench/attention_cpu_bench.lua — CPU attention forward and backward GFLOP/s for (b,h,s,d) =
-- (1,8,1024,64) and (2,16,2048,128), causal and not, next to the CBLAS sgemm rate measured in the
-- same run (al.matmul of f32 matrices, 2*m*n*k flops), with the ratio. The issue's target: the
-- forward reaches >= 30% of the sgemm rate.
--
-- FLOP counts (the usual attention convention): forward 4*b*h*sq*skv*d (QK^T and PV), backward
-- 2.5x the forward (5 GEMMs: S, dP, dV, dQ, dK); causal counts half the score matrix.
-- Usage: luajit bench/attention_cpu_bench.lua [--quick] [--jsonl out.jsonl] [--chart out.svg]
-- Progress (al.progress: a bar on a terminal, plain lines otherwise) goes to stderr, so the table on
-- stdout is unchanged; --jsonl writes one JSON line per (shape, mask) row (al.results) and --chart
-- draws forward and backward GFLOP/s per row from those results.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local al = require "attnlab"

local quick, jsonl_path, chart_path = false, nil, nil
do
  local i = 1
  while arg and arg[i] do
    if arg[i] == "--quick" then quick = true
    elseif arg[i] == "--jsonl" then jsonl_path = arg[i + 1]; i = i + 1
    elseif arg[i] == "--chart" then chart_path = arg[i + 1]; i = i + 1
    else error("attention_cpu_bench: unknown argument " .. tostring(arg[i]) .. " (expected --quick, --jsonl FILE, --chart FILE)") end
    i = i + 1
  end
end

local wall = al.clock

-- best of `reps` timings after one warm-up
local function time(fn, reps)
  fn()
  local best = math.huge
  for _ = 1, reps do
    local t0 = wall()
    fn()
    local t = wall() - t0
    if t < best then best = t end
  end
  return best
end

al.manual_seed(0)
-- sgemm rate on a square-ish problem the size of the attention GEMMs' total work
local n = quick and 512 or 1024
local A, B = al.randn({ n, n }), al.randn({ n, n })
local tg = time(function() al.matmul(A, B) end, 3)
local sgemm = 2 * n * n * n / tg / 1e9
print(string.format("sgemm %dx%dx%d: %.1f GFLOP/s (threads: OMP_NUM_THREADS=%s)", n, n, n, sgemm,
  os.getenv("OMP_NUM_THREADS") or "default"))
print(string.format("%-22s %-7s %10s %10s %10s %10s %8s", "shape (b,h,s,d)", "mask", "fwd ms", "fwd GF/s",
  "bwd ms", "bwd GF/s", "fwd/sgemm"))

local shapes = { { 1, 8, 1024, 64 }, { 2, 16, 2048, 128 } }
if quick then shapes = { { 1, 8, 1024, 64 } } end
local progress = al.progress(#shapes * 2, { label = "attention_cpu_bench" })
local rows = {}
for _, s in ipairs(shapes) do
  local b, h, sl, d = s[1], s[2], s[3], s[4]
  local q, k, v = al.randn({ b, sl, h, d }), al.randn({ b, sl, h, d }), al.randn({ b, sl, h, d })
  for _, mask in ipairs({ "no_mask", "causal" }) do
    local args = { query_layer = q, key_layer = k, value_layer = v, qkv_format = "bshd", attn_mask_type = mask,
      backend = "cpu" }
    local out, ctx
    local reps = (sl >= 2048) and 1 or 3
    local tf = time(function() out, ctx = al.attention.forward(args) end, reps)
    local dout = al.randn(out:size())
    local tb = time(function() al.attention.backward(ctx, dout) end, reps)
    local flops = 4 * b * h * sl * sl * d
    if mask == "causal" then flops = flops / 2 end
    local gf, gb = flops / tf / 1e9, 2.5 * flops / tb / 1e9
    print(string.format("%-22s %-7s %10.1f %10.1f %10.1f %10.1f %7.0f%%", string.format("(%d,%d,%d,%d)", b, h, sl, d), mask,
      tf * 1e3, gf, tb * 1e3, gb, 100 * gf / sgemm))
    rows[#rows + 1] = { bench = "attention_cpu", b = b, h = h, s = sl, d = d, mask = mask, fwd_ms = tf * 1e3,
      fwd_gflops = gf, bwd_ms = tb * 1e3, bwd_gflops = gb, sgemm_gflops = sgemm, row = #rows + 1 }
    progress:step(1, string.format("(%d,%d,%d,%d) %s", b, h, sl, d, mask))
  end
end
progress:done()

if jsonl_path then
  local w = al.results.jsonl(jsonl_path)
  for _, r in ipairs(rows) do w:write(r) end
  w:close()
  io.stderr:write("attention_cpu_bench: results in " .. jsonl_path .. "\n")
end
if chart_path then
  local labels, vals = {}, {}
  for i, r in ipairs(rows) do
    labels[i] = string.format("s=%d d=%d %s", r.s, r.d, r.mask == "causal" and "causal" or "full")
    vals[i] = { r.fwd_gflops, r.bwd_gflops }
  end
  al.plot.bar(labels, vals, { labels = { "forward", "backward" }, ylabel = "GFLOP/s",
    title = string.format("CPU attention (sgemm %.0f GFLOP/s)", sgemm) }):save(chart_path)
  io.stderr:write("attention_cpu_bench: chart in " .. chart_path .. "\n")
end
