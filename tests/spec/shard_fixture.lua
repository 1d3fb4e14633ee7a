-- shard_fixture.lua — not a spec of its own (no _spec suffix): shard_spec.lua runs it under ATTNLAB_SPEC_SHARD.
-- Ten tests in nested and top-level blocks, each printing its name to stdout when it runs.
describe("outer", function()
  for k = 1, 6 do it("a" .. k, function() io.write("RAN a" .. k .. "\n") end) end
  describe("inner", function()
    for k = 1, 3 do it("b" .. k, function() io.write("RAN b" .. k .. "\n") end) end
  end)
end)
it("c1", function() io.write("RAN c1\n") end)
