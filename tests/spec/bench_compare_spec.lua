-- bench_compare_spec.lua — scripts/bench_compare.py on synthetic JSON-lines files shaped like the real
-- writers' (bench/flash_bench.lua, scripts/peer_torch_sdpa.py with its "JSON " prefixes): the flash table
-- (issue 6) shows each shape's TFLOP/s, the ratios to PyTorch's FA2 and cuDNN and packed/separate,
-- computed here from random values, and marks the cells below issue 6's targets; the fused table (issue 5)
-- is unchanged by flash records; both sides' cuDNN versions are named, with a warning when they differ;
-- forward ratios use PyTorch's training forward when the peer measured it, the inference one beside it.
-- Pending without python3.
package.path = "tests/spec/?.lua;" .. package.path
local shell = require "shell"
local q, sh = shell.q, shell.sh
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."

local function have_python() return os.execute("command -v python3 > /dev/null 2>&1") == 0 or
  os.execute("command -v python3 > /dev/null 2>&1") == true end

local function rec(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do
    local v = t[k]
    parts[#parts + 1] = string.format("%q: %s", k, type(v) == "string" and string.format("%q", v) or string.format("%.6g", v))
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

describe("scripts/bench_compare.py", function()
  it("prints the flash table with ratios to FA2 / cuDNN and issue 6's targets marked", function()
    if not have_python() then pending("no python3") return end
    math.randomseed(os.time())
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir)))
    local ours, peer = {}, { "JSON " .. rec({ kind = "env", source = "torch", torch = "2.x" }), "some table line" }
    local want = {}
    for _, shp in ipairs({ { 4, 16, 4096, 128, "no_mask" }, { 2, 16, 8192, 128, "causal" }, { 4, 32, 4096, 64, "causal" } }) do
      local b, h, s, d, mask = shp[1], shp[2], shp[3], shp[4], shp[5]
      local v = {}
      for _, be in ipairs({ "flash", "torch_flash", "torch_cudnn" }) do
        v[be] = { fwd = 200 + math.random() * 600, bwd = 100 + math.random() * 500 }
        if be == "flash" and d == 128 then
          -- near the targets, on both sides: no_mask just below 550 / 400, causal just above 480 / 400
          v[be] = mask == "no_mask" and { fwd = 500 + 49 * math.random(), bwd = 360 + 39 * math.random() }
            or { fwd = 481 + 60 * math.random(), bwd = 401 + 40 * math.random() }
        end
        local r = { kind = "attention", b = b, h = h, s = s, d = d, mask = mask, layout = "separate", backend = be,
          fwd_tflops = v[be].fwd, bwd_tflops = v[be].bwd, fwd_ms = 1, bwd_ms = 2 }
        if be == "flash" then
          r.source = "attnlab"
          ours[#ours + 1] = rec(r)
        else
          r.source = "torch"
          peer[#peer + 1] = "JSON " .. rec(r)
        end
      end
      local pk = { fwd = v.flash.fwd * (0.9 + 0.2 * math.random()), bwd = v.flash.bwd * (0.9 + 0.2 * math.random()) }
      ours[#ours + 1] = rec({ kind = "attention", source = "attnlab", b = b, h = h, s = s, d = d, mask = mask,
        layout = "bs3hd", backend = "flash", fwd_tflops = pk.fwd, bwd_tflops = pk.bwd, fwd_ms = 1, bwd_ms = 2 })
      want[#want + 1] = { key = string.format("%d,%d,%d,%d", b, h, s, d), mask = mask, v = v, pk = pk, d = d }
    end
    local fo, fp = dir .. "/ours.jsonl", dir .. "/peer.jsonl"
    local f = assert(io.open(fo, "w")); f:write(table.concat(ours, "\n"), "\n"); f:close()
    f = assert(io.open(fp, "w")); f:write(table.concat(peer, "\n"), "\n"); f:close()
    local out, ok = sh("cd " .. q(root) .. " && python3 scripts/bench_compare.py " .. q(fo) .. " " .. q(fp))
    os.execute("rm -rf " .. q(dir))
    assert(ok, out)
    local tbl = out:match("flash backend %(issue 6.-\n\n") or out:match("flash backend %(issue 6.*")
    assert(tbl, out)
    for _, w in ipairs(want) do
      for _, dir_ in ipairs({ "fwd", "bwd" }) do
        local line = tbl:match("\n(" .. w.key:gsub("%p", "%%%0") .. "%s+" .. w.mask .. "%s+" .. dir_ .. "[^\n]*)")
        assert(line, w.key .. " " .. dir_ .. " missing in:\n" .. tbl)
        local nums = {}
        for x in line:gmatch("%s(%d+%.%d+)") do nums[#nums + 1] = tonumber(x) end
        -- flash, [target], /FA2, /cuDNN, FA2, cuDNN, pk/sp
        local v = w.v
        local flash, fa, cd = v.flash[dir_], v.torch_flash[dir_], v.torch_cudnn[dir_]
        assert(math.abs(nums[1] - flash) < 0.06, line)
        local n = #nums
        assert(math.abs(nums[n] - w.pk[dir_] / flash) < 6e-4, line)
        assert(math.abs(nums[n - 1] - cd) < 0.06 and math.abs(nums[n - 2] - fa) < 0.06, line)
        assert(math.abs(nums[n - 3] - flash / cd) < 6e-4 and math.abs(nums[n - 4] - flash / fa) < 6e-4, line)
        local tgt = w.d == 128 and (dir_ == "bwd" and 400 or (w.mask == "no_mask" and 550 or 480)) or nil
        local marked = line:match("^%S+%s+%S+%s+%S+%s+%d+%.%d(!)") ~= nil
        assert.are.equal(tgt ~= nil and flash < tgt, marked, line)
      end
    end
  end)
  it("names both sides' cuDNN versions and warns when they differ", function()
    if not have_python() then pending("no python3") return end
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir)))
    local fo, fp = dir .. "/ours.jsonl", dir .. "/peer.jsonl"
    local cell = { kind = "attention", b = 4, h = 16, s = 4096, d = 128, mask = "causal", layout = "separate",
      fwd_tflops = 600, bwd_tflops = 450, fwd_ms = 1, bwd_ms = 2 }
    local function run(ours_v, peer_v)
      local a = { rec({ kind = "env", source = "attnlab", device = "H200", cudnn = "cudnn=" .. ours_v .. " cudnn_header=9.19.0 plans=0" }) }
      local c = {}
      for k, v in pairs(cell) do c[k] = v end
      c.source, c.backend = "attnlab", "fused"
      a[#a + 1] = rec(c)
      local b = { "JSON " .. rec({ kind = "env", source = "torch", cudnn = peer_v, torch = "2.x" }) }
      c.source, c.backend = "torch", "torch_cudnn"
      b[#b + 1] = "JSON " .. rec(c)
      local f = assert(io.open(fo, "w")); f:write(table.concat(a, "\n"), "\n"); f:close()
      f = assert(io.open(fp, "w")); f:write(table.concat(b, "\n"), "\n"); f:close()
      local out, ok = sh("cd " .. q(root) .. " && python3 scripts/bench_compare.py " .. q(fo) .. " " .. q(fp))
      assert(ok, out)
      return out
    end
    local diff = run("9.14.0", 91900)
    local same = run("9.19.0", 91900)
    os.execute("rm -rf " .. q(dir))
    assert.truthy(diff:find("cuDNN: attnlab 9.14.0, PyTorch 9.19.0", 1, true), diff)
    assert.truthy(diff:find("WARNING: the two sides ran different cuDNN versions", 1, true), diff)
    assert.truthy(same:find("cuDNN: attnlab 9.19.0, PyTorch 9.19.0", 1, true), same)
    assert.falsy(same:find("WARNING", 1, true), same)
    assert.truthy(same:find("fused/torch_cudnn", 1, true) or same:find("fu/tcd", 1, true), same)
  end)
  it("compares the forward with PyTorch's training forward (LSE kept) and shows the inference ratio beside it", function()
    if not have_python() then pending("no python3") return end
    math.randomseed(os.time())
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir)))
    local fo, fp = dir .. "/ours.jsonl", dir .. "/peer.jsonl"
    local ours_f, ours_b = 500 + 200 * math.random(), 300 + 200 * math.random()
    local inf, train, tb = 500 + 200 * math.random(), 450 + 150 * math.random(), 300 + 200 * math.random()
    local base = { kind = "attention", b = 2, h = 16, s = 8192, d = 128, mask = "no_mask", layout = "separate", fwd_ms = 1, bwd_ms = 2 }
    local a, b = {}, {}
    for k, v in pairs(base) do a[k] = v; b[k] = v end
    a.source, a.backend, a.fwd_tflops, a.bwd_tflops = "attnlab", "fused", ours_f, ours_b
    b.source, b.backend, b.fwd_tflops, b.bwd_tflops, b.fwd_train_tflops, b.fwd_train_ms = "torch", "torch_cudnn", inf, tb, train, 1.1
    local f = assert(io.open(fo, "w")); f:write(rec(a), "\n"); f:close()
    f = assert(io.open(fp, "w")); f:write("JSON " .. rec(b), "\n"); f:close()
    local out, ok = sh("cd " .. q(root) .. " && python3 scripts/bench_compare.py " .. q(fo) .. " " .. q(fp))
    os.execute("rm -rf " .. q(dir))
    assert(ok, out)
    local line = out:match("\n(2,16,8192,128%s+no_mask%s+fwd[^\n]*)")
    assert(line, out)
    local nums = {}
    for x in line:gmatch("%s(%d+%.%d+)") do nums[#nums + 1] = tonumber(x) end
    -- fused, torch (training), fu/tcd (training), ..., fu/tcd inf (last)
    assert(math.abs(nums[1] - ours_f) < 0.06 and math.abs(nums[2] - train) < 0.06, line)
    assert(math.abs(nums[3] - ours_f / train) < 6e-4, line)
    assert(math.abs(nums[#nums] - ours_f / inf) < 6e-4, line)
    local bline = out:match("\n(2,16,8192,128%s+no_mask%s+bwd[^\n]*)")
    local bn = {}
    for x in bline:gmatch("%s(%d+%.%d+)") do bn[#bn + 1] = tonumber(x) end
    assert(math.abs(bn[3] - ours_b / tb) < 6e-4, bline)      -- the backward is unchanged
    assert.falsy(bline:match("%d%s*$") and #bn > 3, bline)     -- no inference column for the backward
  end)
end)
