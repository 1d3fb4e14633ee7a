-- api_docs_spec.lua — docs/REFERENCE.md is generated (scripts/gen_api_docs.lua, `make docs`) from
-- include/attnlab.h and the Lua modules; this spec regenerates it into a temporary file and fails
-- when the committed copy differs, so the reference cannot go stale silently. It also checks that the
-- generator sees what it should: every al_* function declared in the header, documented entries.
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."
local al = require "attnlab"
local apidoc = require "attnlab.apidoc"

package.path = "tests/spec/?.lua;" .. package.path
local read = require("shell").read

describe("API reference (docs/REFERENCE.md)", function()
  it("is up to date with the header and the Lua modules (else: run make docs)", function()
    local committed = read(root .. "/docs/REFERENCE.md")
    assert(committed, "docs/REFERENCE.md is missing: run make docs")
    local fresh = apidoc.markdown(al)
    if fresh ~= committed then
      -- name the first differing line, so the message says what changed
      local a, b = {}, {}
      for l in committed:gmatch("([^\n]*)\n") do a[#a + 1] = l end
      for l in fresh:gmatch("([^\n]*)\n") do b[#b + 1] = l end
      local i = 1
      while a[i] == b[i] and i <= math.max(#a, #b) do i = i + 1 end
      error(string.format("docs/REFERENCE.md is out of date: run make docs\n  line %d committed: %s\n  line %d generated: %s",
        i, tostring(a[i]), i, tostring(b[i])), 0)
    end
  end)

  it("lists every al_* function the header declares, with its comment", function()
    local header = read(root .. "/include/attnlab.h")
    local ffi_block = header:match("AL_FFI_BEGIN %*/(.-)/%* AL_FFI_END")
    local declared = {}
    for name in ffi_block:gsub("/%*.-%*/", ""):gmatch("[%s%*](al_[%w_]+)%s*%(") do declared[name] = true end
    local listed = {}
    for _, e in ipairs(apidoc.c_functions(root .. "/include/attnlab.h")) do listed[e.name] = e end
    for name in pairs(declared) do assert.truthy(listed[name], name .. " missing from the reference") end
    assert.truthy(listed.al_tensor_select.comment:find("Views", 1, true))
    assert.equal("al_status al_tensor_select(al_tensor *out, const al_tensor *t, int32_t dim, int64_t index);",
      listed.al_tensor_select.decl)
  end)

  it("lists al.* functions and tensor methods with their doc comments", function()
    local by = {}
    for _, e in ipairs(apidoc.lua_functions(al)) do by[e.name] = e end
    assert.truthy(by["al.plot.heatmap"] and by["al.plot.heatmap"].comment:find("attention maps", 1, true))
    assert.equal("m, opts", by["al.plot.heatmap"].params)
    assert.truthy(by["al.allclose"].comment:find("atol", 1, true))
    assert.truthy(by["Tensor:select"] and by["Tensor:select"].params == "dim, index")
    assert.equal("lua/attnlab/plot.lua", by["al.plot.line"].file)
  end)

  it("the REPL's ?name help reads the same sources", function()
    local repl = require "attnlab.repl"
    rawset(_G, "al", al)       -- ?name evaluates the name as the REPL would, with the global al
    assert.truthy(repl.help("al.C.al_tensor_select", al):find("al_tensor_select(al_tensor *out", 1, true))
    assert.truthy(repl.help("al.plot.hist", al):find("histogram", 1, true))
  end)
end)
