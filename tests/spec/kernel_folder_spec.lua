-- kernel_folder_spec.lua — scripts/kernel_folder.sh (a copy of kernels/ with switches' defaults changed, for
-- ATTNLAB_KERNEL_DIR runs and scripts/gpu_session.sh's KERNEL_DEFAULTS): exactly the named default lines change,
-- and a bad request is an error naming it that leaves no folder behind.
package.path = "tests/spec/?.lua;" .. package.path
local shell = require "shell"
local q, sh, read = shell.q, shell.sh, shell.read

local function lines_of(s)
  local t = {}
  for l in (s .. "\n"):gmatch("(.-)\n") do t[#t + 1] = l end
  return t
end

describe("scripts/kernel_folder.sh", function()
  local dir = os.tmpname()
  os.remove(dir)
  after_each(function() sh("rm -rf " .. q(dir)) end)

  it("copies kernels/ and changes exactly the named defaults", function()
    local out, rc = sh("sh scripts/kernel_folder.sh " .. q(dir) .. " AL_SM90_BWD_EARLY_DP=0 AL_SM90_BWD_PINGPONG=1")
    assert.equal(0, rc, out)
    assert.truthy(out:find("flash_bwd_sm90.cu: #define AL_SM90_BWD_EARLY_DP 0", 1, true), out)
    assert.truthy(out:find("flash_bwd_sm90.cu: #define AL_SM90_BWD_PINGPONG 1", 1, true), out)
    local listing = sh("ls kernels")
    for name in listing:gmatch("%S+") do
      local a, b = read("kernels/" .. name), read(dir .. "/" .. name)
      assert(b, "missing in the copy: " .. name)
      if name ~= "flash_bwd_sm90.cu" then
        assert(a == b, name .. " changed")
      else
        local la, lb = lines_of(a), lines_of(b)
        assert.equal(#la, #lb)
        local changed = {}
        for i = 1, #la do if la[i] ~= lb[i] then changed[#changed + 1] = lb[i] end end
        assert.same({ "#define AL_SM90_BWD_EARLY_DP 0", "#define AL_SM90_BWD_PINGPONG 1" }, changed)
      end
    end
  end)

  it("refuses an unknown switch, a non-integer value, a malformed item and an ambiguous name, leaving no folder", function()
    for _, c in ipairs({
      { "AL_NO_SUCH_SWITCH=1", "AL_NO_SUCH_SWITCH: expected one '#define AL_NO_SUCH_SWITCH <integer>' default in kernels/, found 0" },
      { "AL_SM90_BWD_EARLY_DP=x", "AL_SM90_BWD_EARLY_DP: expected an integer value, got 'x'" },
      { "AL_SM90_BWD_EARLY_DP=2-", "AL_SM90_BWD_EARLY_DP: expected an integer value, got '2-'" },
      { "AL_SM90_BWD_EARLY_DP", "expected NAME=V, got 'AL_SM90_BWD_EARLY_DP'" },
      { "AL-X=1", "NAME: expected a C identifier, got 'AL-X'" },
      -- (the forward's and the backward's stage counts share the name: which one is meant?)
      { "AL_SM90_STAGES=3", "AL_SM90_STAGES: expected one '#define AL_SM90_STAGES <integer>' default in kernels/, found 2" },
    }) do
      local out, rc = sh("sh scripts/kernel_folder.sh " .. q(dir) .. " AL_SM90_BWD_PINGPONG=1 " .. q(c[1]))
      assert.equal(2, rc, out)
      assert.truthy(out:find("kernel_folder.sh: " .. c[2], 1, true), out)
      assert.is_nil(read(dir .. "/flash_bwd_sm90.cu"), "the folder was left behind for " .. c[1])
    end
    local out, rc = sh("sh scripts/kernel_folder.sh /")
    assert.equal(2, rc, out)
  end)

  it("a negative value is an integer too", function()
    local out, rc = sh("sh scripts/kernel_folder.sh " .. q(dir) .. " AL_SM90_BWD_EARLY_DP=-1")
    assert.equal(0, rc, out)
    assert.truthy(read(dir .. "/flash_bwd_sm90.cu"):find("\n#define AL_SM90_BWD_EARLY_DP -1\n", 1, true))
  end)
end)
