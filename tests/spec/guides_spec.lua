-- guides_spec.lua — the REPL transcripts in docs/ cannot go stale: every ``` block of a guide whose
-- lines start with "al> " is replayed, the blocks of one document in one session (in order, so state
-- carries over as it did when the guide was written), through scripts/transcript.lua, and what the REPL
-- prints now must equal what the document shows, line for line.
-- A block whose output depends on the machine starts with "al> -- no-replay". With a GPU present the
-- replay is pending: the guides are CPU-machine sessions.
-- Wall times (`%time: wall 7.3 ms`) are compared as "%time: wall N". To refresh a guide after an
-- intended change, run its commands through scripts/transcript.lua.
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local abs_root = io.popen("cd " .. sh_quote(root) .. " && pwd"):read("*l") or root

local function read(path)
  local f = assert(io.open(path))
  local s = f:read("*a")
  f:close()
  return s
end

-- The transcript blocks of a markdown text: { {lines...}, ... } (each block's lines as written).
local function transcript_blocks(text)
  local blocks, cur = {}, nil
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    if line:match("^```") then
      if cur then
        if cur[1] and cur[1]:match("^al> ") and not cur[1]:match("^al> %-%- no%-replay") then blocks[#blocks + 1] = cur end
        cur = nil
      else
        cur = {}
      end
    elseif cur then
      cur[#cur + 1] = line
    end
  end
  return blocks
end

local MARK = "-- @@guide-block@@"

-- Replays the blocks in one session; returns the transcript lines of each block.
local function replay(blocks)
  local input = {}
  for _, b in ipairs(blocks) do
    input[#input + 1] = MARK
    for _, line in ipairs(b) do
      local code = line:match("^al> (.*)$") or line:match("^%.%.> (.*)$")
      if code then input[#input + 1] = code end
    end
  end
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "w"))
  f:write(table.concat(input, "\n"), "\n")
  f:close()
  local p = io.popen("cd " .. sh_quote(root) .. " && ATTNLAB_BACKEND= " .. sh_quote(root .. "/scripts/attnlab") .. " "
    .. sh_quote(root .. "/scripts/transcript.lua") .. " " .. sh_quote(tmp) .. " 2>&1")
  local out = p:read("*a")
  p:close()
  os.remove(tmp)
  local got, cur = {}, nil
  for line in out:gmatch("([^\n]*)\n") do
    if line == "al> " .. MARK then
      cur = {}
      got[#got + 1] = cur
    elseif cur then
      cur[#cur + 1] = line
    end
  end
  return got, out
end

local function guides()
  local list = {}
  local p = io.popen("ls " .. sh_quote(root .. "/docs") .. "/*.md 2>/dev/null")
  for path in p:lines() do
    local blocks = transcript_blocks(read(path))
    if #blocks > 0 then list[#list + 1] = { path = path, name = path:match("([^/]+)$"), blocks = blocks } end
  end
  p:close()
  return list
end

describe("docs: REPL transcripts replay exactly", function()
  local list = guides()

  it("finds the guides (layouts, attention, the API tour at least)", function()
    local names = {}
    for _, g in ipairs(list) do names[g.name] = true end
    assert.is_true(names["guide_layouts.md"] and names["guide_attention.md"] and names["API.md"] or false)
  end)

  it("splits blocks and skips no-replay ones (self-test of the extractor)", function()
    local b = transcript_blocks("x\n```\nal> 1+1\n2\n```\n```\nal> -- no-replay\nal> 3\n```\n```\nplain\n```\n")
    assert.equal(1, #b)
    assert.same({ "al> 1+1", "2" }, b[1])
  end)

  for _, g in ipairs(list) do
    it(g.name .. ": every block prints what the document shows", function()
      -- the guides are recorded on a CPU-only machine: explain and %time read differently with a GPU
      if HAS_GPU then pending("guides are CPU-machine transcripts (explain and %time differ with a GPU)") return end
      local got, raw = replay(g.blocks)
      assert.equal(#g.blocks, #got, "blocks replayed; output:\n" .. raw)
      for i, want in ipairs(g.blocks) do
        local have = got[i]
        -- trailing blank lines are not significant
        while #have > 0 and have[#have] == "" do have[#have] = nil end
        local w = {}
        for k, l in ipairs(want) do w[k] = l end
        while #w > 0 and w[#w] == "" do w[#w] = nil end
        -- machine-dependent details: wall times, the checkout's absolute path, source line numbers in help
        local function norm(l)
          l = tostring(l):gsub("^%%time: wall [%d.]+ [um]?s", "%%time: wall N")
          l = l:gsub(abs_root:gsub("%p", "%%%0") .. "/", "")
          return (l:gsub("(%.lua):%d+", "%1:N"))
        end
        for k = 1, math.max(#have, #w) do
          if have[k] then have[k] = norm(have[k]) end
          if w[k] then w[k] = norm(w[k]) end
        end
        if table.concat(have, "\n") ~= table.concat(w, "\n") then
          local k = 1
          while k <= math.max(#have, #w) and have[k] == w[k] do k = k + 1 end
          error(string.format("%s block %d differs at line %d:\n  doc: %s\n  now: %s\n(whole block now:\n%s\n)",
            g.name, i, k, tostring(w[k]), tostring(have[k]), table.concat(have, "\n")), 0)
        end
      end
    end)
  end
end)
