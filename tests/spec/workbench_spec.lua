-- workbench_spec.lua — the REPL additions of the workbench issue, driven through scripts/attnlab with
-- piped stdin: `%time code` (value printed, wall time reported, the GPU synchronised when there is
-- one), `?al.C.al_*` help from the header's comments.
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."

local function repl(input)
  local name = os.tmpname()
  local f = assert(io.open(name, "w"))
  f:write(input)
  f:close()
  local p = assert(io.popen("'" .. root .. "/scripts/attnlab' < '" .. name .. "' 2>&1; echo \"__rc=$?\""))
  local out = p:read("*a")
  p:close()
  os.remove(name)
  local lines = {}
  for line in out:gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  local rc = tonumber(table.remove(lines):match("^__rc=(%d+)$"))
  return lines, rc
end

describe("REPL %time and ?al.C help", function()
  it("%time prints the value and the wall time, and says whether the GPU was synchronised", function()
    local out, rc = repl("x = 6\n%time x * 7\n%time for i = 1, 3 do end\n")
    assert.equal(0, rc)
    assert.equal("42", out[1])
    assert.truthy(out[2]:match("^%%time: wall [%d.]+ [um]?s "), out[2])
    if HAS_GPU then
      assert.truthy(out[2]:find("GPU synchronised", 1, true))
    else
      assert.truthy(out[2]:find("no GPU", 1, true))
    end
    assert.truthy(out[3]:match("^%%time: wall"), out[3])
    assert.equal(3, #out)
  end)

  it("%time measures the time the code takes", function()
    -- a wall-clock wait (os.clock would count CPU time of every thread, e.g. spinning OpenMP workers)
    local out = repl("%time (function() os.execute('sleep 0.2') end)()\n")
    local v, unit = out[1]:match("^%%time: wall ([%d.]+) (m?s)")
    local s = tonumber(v) / (unit == "ms" and 1000 or 1)
    assert.is_true(s >= 0.19 and s < 5, out[1])
  end)

  it("%time reports errors like any command, and the REPL carries on", function()
    local out, rc = repl("%time error('late')\n1 + 1\n")
    assert.truthy(out[1]:find("late", 1, true))
    assert.equal("2", out[#out])
    assert.equal(1, rc)
  end)

  it("?al.C.<function> prints its declaration and comment from include/attnlab.h", function()
    local out = repl("?al.C.al_tensor_narrow\n")
    assert.equal("al_status al_tensor_narrow(al_tensor *out, const al_tensor *t, int32_t dim, int64_t start, int64_t length);", out[1])
  end)

  it("? lists %time among the REPL commands", function()
    local out = repl("?\n")
    assert.truthy(table.concat(out, "\n"):find("%time code", 1, true))
  end)
end)
