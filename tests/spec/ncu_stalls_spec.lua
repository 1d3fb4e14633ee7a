-- ncu_stalls_spec.lua — scripts/ncu_stalls.py on synthetic CSV files shaped like Nsight Compute's source page
-- (`ncu -i REPORT --page source --csv --print-source sass`): per kernel the sample total and instruction count,
-- the instructions with the most stall samples and their shares (computed here from random counts), the shares
-- per opcode (predicates and modifiers stripped), and clear errors for a missing file, a bad --top and a CSV
-- without a source page. Pending without python3.
package.path = "tests/spec/?.lua;" .. package.path
local shell = require "shell"
local q, sh = shell.q, shell.sh
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."
-- Python is not ours to check: under `make test-asan` it runs without the preloaded ASan runtime (LeakSanitizer
-- would report the interpreter's exit-time allocations and change its exit status), as in peer_interleaved_spec
local PY = "env -u LD_PRELOAD python3 scripts/ncu_stalls.py "

local function have_python()
  local r = os.execute("command -v python3 > /dev/null 2>&1")
  return r == 0 or r == true
end

local HEADER = '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",' ..
  '"# Samples","Instructions Executed"'
local SASS = { "WARPGROUP.DEPBAR.LE gsb0, 0x0", "@!P0  BRA 0x7f00e00", "HGMMA.64x64x16.F32.BF16 R152, gdesc[UR16], RZ, !UPT",
  "MUFU.EX2 R154, R154", "STG.E desc[UR30][R6.64], R83", "@P1 MUFU.EX2 R3, R3", "FFMA R159, R160, UR12, -R188" }

local function opcode(s) return ((s:gsub("^@%S+%s+", "")):match("^([^.%s]+)")) end

-- a CSV of kernels { {name = , counts = {...}, ni = {...}} }; numbers above 999 get ncu's thousands commas
local function csv_text(ks)
  local lines = {}
  local function num(v) return v >= 1000 and string.format("%d,%03d", math.floor(v / 1000), v % 1000) or tostring(v) end
  for _, k in ipairs(ks) do
    lines[#lines + 1] = string.format('"Kernel Name","%s",', k.name)
    lines[#lines + 1] = HEADER
    for i, c in ipairs(k.counts) do
      lines[#lines + 1] = string.format('"0x7f%06x","%s","%s","%s","%d","%d"', 16 * i, SASS[(i - 1) % #SASS + 1],
        num(c), num(k.ni[i]), c, 100 + i)
    end
  end
  return table.concat(lines, "\n") .. "\n"
end

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

describe("scripts/ncu_stalls.py", function()
  local dir
  before_each(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir)))
  end)
  after_each(function() os.execute("rm -rf " .. q(dir)) end)

  it("prints each kernel's top instructions and opcode shares from random sample counts", function()
    if not have_python() then pending("no python3") return end
    math.randomseed(os.time())
    local ks = {}
    for n, name in ipairs({ "al_flash_bwd_sm90_dkdv", "al_flash_bwd_sm90_dq" }) do
      local k = { name = name, counts = {}, ni = {} }
      for i = 1, 9 + n do
        k.counts[i] = math.random(1, 3000)
        k.ni[i] = math.random(0, k.counts[i])
      end
      ks[#ks + 1] = k
    end
    ks[1].counts[3] = 20000   -- a clear top instruction (HGMMA), with thousands commas in the file
    write(dir .. "/src.csv", csv_text(ks))
    local out, rc = sh("cd " .. q(root) .. " && " .. PY .. q(dir .. "/src.csv") .. " --top=3")
    assert.are.equal(0, rc, out)
    for _, k in ipairs(ks) do
      local total, total_ni, by_op = 0, 0, {}
      for i, c in ipairs(k.counts) do
        total, total_ni = total + c, total_ni + k.ni[i]
        local op = opcode(SASS[(i - 1) % #SASS + 1])
        by_op[op] = (by_op[op] or 0) + c
      end
      local block = out:match(k.name .. ": (.-)\n[^ ]") or out:match(k.name .. ": (.*)$")
      assert.is_truthy(block, out)
      assert.is_truthy(block:find(string.format("^%d stall samples over %d instructions", total, #k.counts)), block)
      -- the top instruction and its two shares
      local best = 1
      for i, c in ipairs(k.counts) do if c > k.counts[best] then best = i end end
      local line = string.format("%6.1f %6.1f  %-18s %s", 100 * k.counts[best] / total, 100 * k.ni[best] / total_ni,
        string.format("0x7f%06x", 16 * best), (SASS[(best - 1) % #SASS + 1]:gsub("%s+", " ")))
      assert.is_truthy(block:find(line, 1, true), "want\n" .. line .. "\nin\n" .. block)
      local rows = select(2, block:gsub("\n  +%d+%.%d +%d+%.%d  0x", ""))
      assert.are.equal(3, rows, block)
      -- the largest opcode share
      local top_op, top_v = nil, -1
      for op, v in pairs(by_op) do if v > top_v then top_op, top_v = op, v end end
      assert.is_truthy(block:find(string.format("by opcode: %s %.1f%%", top_op, 100 * top_v / total), 1, true), block)
    end
    assert.is_truthy(out:find("al_flash_bwd_sm90_dkdv:.*HGMMA", 1), out)
  end)

  it("says what is wrong with its arguments or its input (exit 2)", function()
    if not have_python() then pending("no python3") return end
    write(dir .. "/none.csv", '"Section","Other"\n"a","b"\n')
    write(dir .. "/ok.csv", csv_text({ { name = "k", counts = { 5, 7 }, ni = { 1, 2 } } }))
    local cases = {
      { "", "no CSV file given" },
      { q(dir .. "/missing.csv"), "cannot read" },
      { q(dir .. "/ok.csv") .. " --top=0", "--top expects a positive integer, got 0" },
      { q(dir .. "/ok.csv") .. " --top=x", "--top expects a positive integer, got x" },
      { q(dir .. "/ok.csv") .. " --bogus", "unknown option --bogus" },
      { q(dir .. "/none.csv"), "holds no kernel's source page" },
    }
    for _, c in ipairs(cases) do
      local out, rc = sh("cd " .. q(root) .. " && " .. PY .. c[1])
      assert.are.equal(2, rc, c[1] .. "\n" .. out)
      assert.is_truthy(out:find(c[2], 1, true), c[1] .. "\n" .. out)
      assert.is_truthy(out:find("usage:", 1, true), out)
    end
  end)
end)
