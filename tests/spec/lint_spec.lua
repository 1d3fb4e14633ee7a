-- lint_spec.lua — luacheck (Debian's lua-check, installed by `make deps`) over every Lua file of the
-- repository, with the project's .luacheckrc: no accidental globals, unused locals or values, shadowed
-- variables or unreachable code. One case per folder, so a failure names where to look; each lists the
-- warnings. Pending when luacheck is not installed.
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."
if root:sub(1, 1) ~= "/" then root = (os.getenv("PWD") or ".") .. "/" .. root end   -- (the last case leaves it)
package.path = "tests/spec/?.lua;" .. package.path
local shell = require "shell"
local sh, q = shell.sh, shell.q

local _, have_rc = sh("command -v luacheck")
local missing = have_rc ~= 0 and "luacheck is not installed (make deps installs lua-check)" or nil

-- luacheck's report of `paths` (relative to the repository root): the warning lines and the total line
local function lint(paths)
  local args = {}
  for i, p in ipairs(paths) do args[i] = q(p) end
  return sh("cd " .. q(root) .. " && luacheck --no-color --codes --formatter plain " .. table.concat(args, " "))
end

-- the folders, and the Lua files at the top level (launcher helpers)
local GROUPS = {
  { "the library (lua/)", { "lua" } },
  { "the specs and C-test helpers (tests/)", { "tests" } },
  { "the benchmarks (bench/)", { "bench" } },
  { "the scripts (scripts/)", { "scripts" } },
  { "the examples (examples/) and attnlab.lua", { "examples", "attnlab.lua" } },
}

describe("luacheck (.luacheckrc)", function()
  for _, g in ipairs(GROUPS) do
    it("finds nothing in " .. g[1], function()
      if missing then pending(missing) return end
      local out, rc = lint(g[2])
      assert(rc == 0, "luacheck " .. table.concat(g[2], " ") .. " (exit " .. tostring(rc) .. "):\n" .. out)
    end)
  end

  it("still reports what it is there for: an accidental global and an unused local", function()
    if missing then pending(missing) return end
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir)) == 0)
    local f = assert(io.open(dir .. "/bad.lua", "w"))
    f:write("local unused = 1\nfunction leaked() return 2 end\n")
    f:close()
    local out, rc = sh("cd " .. q(dir) .. " && luacheck --no-color --codes --formatter plain --config " ..
      q(root .. "/.luacheckrc") .. " bad.lua")
    os.execute("rm -rf " .. q(dir))
    assert(rc ~= 0, "luacheck accepted a file with a leaked global:\n" .. out)
    assert.truthy(out:find("W111", 1, true), out)   -- setting a non-standard global variable
    assert.truthy(out:find("W211", 1, true), out)   -- unused variable
  end)
end)
