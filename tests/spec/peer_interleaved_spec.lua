-- peer_interleaved_spec.lua — scripts/peer_interleaved.py and its worker scripts/peer_worker.lua without a
-- GPU: the worker's line protocol (answers, errors that do not end it), the driver's statistics (AB BA
-- order, medians, ratio of medians and the per-pair range) on random fixtures, and the whole protocol end
-- to end on the cpu backend with --peer none. The GPU run (against PyTorch) is recorded in
-- docs/PERFORMANCE.md. Pending without python3.
package.path = "tests/spec/?.lua;" .. package.path
local shell = require "shell"
local json = require "attnlab.json"
local q, sh = shell.q, shell.sh
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."
-- The worker inherits the harness's environment (under `make test-asan`: the ASan runtime preloaded and the
-- instrumented library). Python is not ours to check: it runs without the preload (LeakSanitizer would
-- report the interpreter's exit-time allocations and fail it), and so does the worker it starts, on the
-- repository's lib/ (an instrumented library cannot load without the runtime first).
local env = ""
local py = "env -u LD_PRELOAD -u ATTNLAB_LIBDIR python3 "

local function have_python() local ok = os.execute("command -v python3 > /dev/null 2>&1"); return ok == 0 or ok == true end

local function json_lines(out)
  local recs = {}
  for line in out:gmatch("[^\n]+") do
    local j = line:match("^JSON (.*)$")
    if j then recs[#recs + 1] = json.decode(j) end
  end
  return recs
end

describe("scripts/peer_worker.lua", function()
  it("answers setup with READY and time with positive means; bad commands get JSON errors and it goes on", function()
    math.randomseed(os.time())
    local iters = math.random(2, 4)
    local cmds = table.concat({ "setup 1 2 32 8 causal separate cpu cpu", "time " .. iters, "frobnicate",
      "time 0", "setup 1 2 32 8 causal diagonal cpu cpu", "setup 1 2", "setup 2 2 16 8 no_mask bs3hd cpu cpu",
      "time " .. iters, "quit", "time 2" }, "\n")
    local out, rc = sh("cd " .. q(root) .. " && printf '%s\\n' " .. q(cmds) .. " | " .. env .. "luajit scripts/peer_worker.lua")
    assert.are.equal(0, rc, out)
    local _, nready = out:gsub("READY", "")
    assert.are.equal(2, nready, out)
    local recs = json_lines(out)
    assert.are.equal(6, #recs, out)   -- 2 timings, 4 errors; nothing after quit
    for _, i in ipairs({ 1, 6 }) do
      assert.is_true(recs[i].fwd_ms > 0 and recs[i].bwd_ms > 0, out)
      assert.are.equal(iters, recs[i].iters)
    end
    assert.truthy(recs[2].error:match("unknown command 'frobnicate'"), out)
    assert.truthy(recs[3].error:match("ITERS: expected a positive integer, got 0"), out)
    assert.truthy(recs[4].error:match("LAYOUT: expected separate or bs3hd, got diagonal"), out)
    assert.truthy(recs[5].error:match("expected 'setup B H S D"), out)
  end)

  it("time before any setup is an error naming the missing step", function()
    local out, rc = sh("cd " .. q(root) .. " && printf 'time 3\\nquit\\n' | " .. env .. "luajit scripts/peer_worker.lua")
    assert.are.equal(0, rc, out)
    assert.truthy(out:match("no shape: send 'setup %.%.%.' first"), out)
  end)
end)

describe("scripts/peer_interleaved.py", function()
  it("orders the sides AB BA, takes medians and the ratio of medians with the pairs' range", function()
    if not have_python() then pending("no python3") return end
    math.randomseed(os.time())
    local n = math.random(3, 6)
    local a, b = {}, {}
    for i = 1, n do a[i], b[i] = 1 + math.random(), 1 + math.random() end
    local function med(x)
      local s = {}
      for i, v in ipairs(x) do s[i] = v end
      table.sort(s)
      return #s % 2 == 1 and s[(#s + 1) / 2] or 0.5 * (s[#s / 2] + s[#s / 2 + 1])
    end
    local lo, hi = math.huge, -math.huge
    for i = 1, n do lo, hi = math.min(lo, b[i] / a[i]), math.max(hi, b[i] / a[i]) end
    local src = string.format([[
import json, sys
sys.path.insert(0, "scripts")
import peer_interleaved as p
a, b = %s, %s
r = p.summarize([{"fwd_ms": x} for x in a], [{"fwd_ms": x} for x in b], "fwd_ms")
print("JSON " + json.dumps({"s": r, "order": [list(p.abba(i)) for i in range(4)], "empty": p.median([])}))
]], json.encode(a), json.encode(b))
    local f = os.tmpname()
    local h = assert(io.open(f, "w")); h:write(src); h:close()
    local out, rc = sh("cd " .. q(root) .. " && " .. py .. q(f))
    os.remove(f)
    assert.are.equal(0, rc, out)
    local r = json_lines(out)[1]
    local s = r.s
    assert.is_true(math.abs(s.ours_ms - med(a)) < 1e-12)
    assert.is_true(math.abs(s.peer_ms - med(b)) < 1e-12)
    assert.is_true(math.abs(s.ratio - med(b) / med(a)) < 1e-12)
    assert.is_true(math.abs(s.ratio_min - lo) < 1e-12 and math.abs(s.ratio_max - hi) < 1e-12)
    assert.are.same({ { "ours", "peer" }, { "peer", "ours" }, { "ours", "peer" }, { "peer", "ours" } }, r.order)
    assert.are.equal(json.null, r.empty)
  end)

  it("runs the protocol end to end on the cpu backend (--peer none): one record per shape, mask and layout", function()
    if not have_python() then pending("no python3") return end
    local reps = math.random(2, 3)
    local out, rc = sh("cd " .. q(root) .. " && " .. py .. "scripts/peer_interleaved.py --peer none --backend cpu " ..
      "--device cpu --pause 0 --iters 1 --reps " .. reps .. " --shapes '1,2,32,8;2,1,16,8' --masks no_mask,causal")
    assert.are.equal(0, rc, out)
    local recs = json_lines(out)
    assert.are.equal(2 * 2 * 2, #recs, out)
    local seen = {}
    for _, r in ipairs(recs) do
      assert.are.equal("interleaved", r.kind)
      assert.are.equal(reps, #r.ours_fwd_ms)
      for i = 1, reps do assert.is_true(r.ours_fwd_ms[i] > 0 and r.ours_bwd_ms[i] > 0) end
      assert.is_true(r.fwd.ratio > 0 and r.bwd.ratio > 0)
      seen[r.b .. r.mask .. r.layout] = true
    end
    for _, k in ipairs({ "1no_maskseparate", "1causalbs3hd", "2no_maskbs3hd", "2causalseparate" }) do assert.truthy(seen[k], k) end
    assert.truthy(out:match("worst ratio: "), out)
  end)

  it("a worker error (a forced backend that cannot serve) stops the run with the worker's message", function()
    if not have_python() then pending("no python3") return end
    local out, rc = sh("cd " .. q(root) .. " && " .. py .. "scripts/peer_interleaved.py --peer none --backend fused " ..
      "--device cpu --pause 0 --iters 1 --reps 1 --shapes 1,2,32,8 --masks causal --layouts separate")
    assert.are_not.equal(0, rc, out)
    assert.truthy(out:match("fused"), out)
  end)
end)
