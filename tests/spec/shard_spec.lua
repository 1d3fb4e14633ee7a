-- shard_spec.lua — ATTNLAB_SPEC_SHARD (tests/spec/helper.lua): N processes with I = 1..N run every test of a spec
-- file exactly once between them, and a malformed value is an error naming the variable and the value.
package.path = "tests/spec/?.lua;" .. package.path
local shell = require "shell"
local q, sh = shell.q, shell.sh
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."
local BUSTED = os.getenv("BUSTED") or "luajit /usr/bin/busted --ignore-lua"

-- the fixture's tests that ran under one value of ATTNLAB_SPEC_SHARD (nil: unset), as a set, and busted's status
local function run(shard)
  local env = shard and ("ATTNLAB_SPEC_SHARD=" .. q(shard) .. " ") or "ATTNLAB_SPEC_SHARD= "
  local out, rc = sh("cd " .. q(root) .. " && env " .. env .. BUSTED .. " -o tests/spec/summary.lua tests/spec/shard_fixture.lua")
  local ran, n = {}, 0
  for name in out:gmatch("RAN (%w+)") do ran[name], n = true, n + 1 end
  return ran, n, rc, out
end

describe("ATTNLAB_SPEC_SHARD", function()
  it("splits a spec file's tests between N processes, each test run exactly once", function()
    local all, nall, rc = run(nil)
    assert.equal(0, rc)
    assert.equal(10, nall)
    for _, n in ipairs({ 3, 4 }) do
      local seen, total = {}, 0
      for i = 1, n do
        local ran, k, rc_i, out = run(i .. "/" .. n)
        assert.equal(0, rc_i, out)
        assert.is_true(k >= math.floor(10 / n) and k <= math.ceil(10 / n), out)   -- balanced by registration order
        assert.truthy(out:find(k .. " passed, 0 failed", 1, true), out)           -- the others are not counted
        for name in pairs(ran) do
          assert.is_nil(seen[name], name .. " ran in two shards")
          seen[name] = true
        end
        total = total + k
      end
      assert.equal(10, total)
      for name in pairs(all) do assert.is_true(seen[name], name .. " ran in no shard") end
    end
  end)

  it("a malformed value is an error naming the variable and the value", function()
    for _, bad in ipairs({ "0/3", "4/3", "1/0", "x", "2", "1/3/4", "-1/3" }) do
      local _, n, rc, out = run(bad)
      assert.is_true(rc ~= 0, out)
      assert.equal(0, n, out)
      assert.truthy(out:find("ATTNLAB_SPEC_SHARD: expected I/N", 1, true) and out:find("got '" .. bad .. "'", 1, true),
                    out)
    end
  end)
end)
