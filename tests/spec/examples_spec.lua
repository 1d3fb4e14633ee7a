-- examples_spec.lua — every examples/*.lua runs with `scripts/attnlab examples/x.lua` on the CPU,
-- under a time limit, and exits 0. New examples are picked up automatically (train_copy_task.lua
-- and fp8_recipes.lua included, when their helpers add them); the exclusions are listed here, each
-- with its reason.
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."
local LIMIT_S = 120

-- name -> why it is not run here
local EXCLUDED = {
  ["demo.lua"] = "run by `make demo` (and it times every backend three ways: long on the CPU)",
}
-- name -> extra arguments (keep outputs in a scratch folder)
local ARGS = {
  ["backends.lua"] = function(tmp) return { "--out", tmp } end,
  ["layouts.lua"] = function(tmp) return { tmp .. "/layouts.svg" } end,
}

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function list_examples()
  local out = {}
  local p = io.popen("ls " .. sh_quote(root .. "/examples") .. "/*.lua 2>/dev/null")
  for f in p:lines() do out[#out + 1] = f:match("([^/]+)$") end
  p:close()
  table.sort(out)
  return out
end

-- Runs examples/<name> with its ARGS (outputs in tmp); fails the test on a non-zero exit or the time limit.
local function run_example(name, tmp)
  local args = ARGS[name] and ARGS[name](tmp) or {}
  local qargs = {}
  for i, a in ipairs(args) do qargs[i] = sh_quote(a) end
  -- ATTNLAB_BACKEND is cleared: the examples choose backends themselves. No GPU is assumed.
  local cmd = "cd " .. sh_quote(root) .. " && ATTNLAB_BACKEND= ATTNLAB_PROGRESS=plain timeout " .. LIMIT_S .. " "
    .. sh_quote(root .. "/scripts/attnlab") .. " " .. sh_quote("examples/" .. name) .. " " .. table.concat(qargs, " ")
    .. " 2>&1; echo \"__rc=$?\""
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  assert(rc ~= 124, name .. " took longer than " .. LIMIT_S .. " s")
  assert(rc == 0, name .. " failed (exit " .. tostring(rc) .. "):\n" .. out)
end

describe("examples (each run with scripts/attnlab on the CPU)", function()
  local tmp = os.tmpname()
  os.remove(tmp)
  os.execute("mkdir -p " .. sh_quote(tmp))
  teardown(function() os.execute("rm -rf " .. sh_quote(tmp)) end)

  it("has the workbench examples", function()
    local have = {}
    for _, n in ipairs(list_examples()) do have[n] = true end
    assert.is_true(have["layouts.lua"] and have["backends.lua"])
  end)

  for _, name in ipairs(list_examples()) do
    if EXCLUDED[name] then
      it(name, function() pending("excluded: " .. EXCLUDED[name]) end)
    else
      it(name .. " runs to completion within " .. LIMIT_S .. " s", function() run_example(name, tmp) end)
    end
  end

  it("layouts.lua and backends.lua write what they say they write", function()
    -- (under ATTNLAB_SPEC_SHARD the runs above may have been another process's: then they run here)
    local probe = io.open(tmp .. "/backends.jsonl")
    if probe then probe:close() else
      run_example("layouts.lua", tmp)
      run_example("backends.lua", tmp)
    end
    local f = io.open(tmp .. "/layouts.svg")
    if f then
      local s = f:read("*a")
      f:close()
      assert.truthy(s:find("^<svg"))
    end
    local g = io.open(tmp .. "/backends.jsonl")
    assert.truthy(g, "backends.jsonl")
    local n = 0
    for _ in g:lines() do n = n + 1 end
    g:close()
    assert.is_true(n >= 1)
  end)
end)
