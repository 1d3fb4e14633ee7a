-- repl_spec.lua — the `attnlab` launcher and REPL, driven through pipes: values printed without '=',
-- ';' silencing, errors that do not end the session, multi-line chunks, tensors printed with their
-- values, scripts run with arguments, -e, and exit statuses.
local root = (debug.getinfo(1, "S").source:match("^@(.*)/tests/spec/[^/]*$")) or "."
local launcher = root .. "/scripts/attnlab"

local function tmpfile(text)
    local name = os.tmpname()
    local f = assert(io.open(name, "w"))
    f:write(text)
    f:close()
    return name
end

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Runs `cmd` (a shell command line), returns its stdout+stderr lines and its exit status.
local function run(cmd)
    local p = assert(io.popen(cmd .. " 2>&1; echo \"__rc=$?\""))
    local out = p:read("*a")
    p:close()
    local lines = {}
    for line in out:gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
    local rc = tonumber(table.remove(lines):match("^__rc=(%d+)$"))
    return lines, rc
end

-- Feeds `input` to the REPL on stdin (not a terminal: no prompts, no banner).
local function repl(input)
    local f = tmpfile(input)
    local lines, rc = run(sh_quote(launcher) .. " < " .. sh_quote(f))
    os.remove(f)
    return lines, rc
end

describe("attnlab REPL (piped stdin)", function()
    it("a slow command adds no timing line when piped (output must not depend on machine load)", function()
        local out, rc = repl("(function() os.execute('sleep 0.15') return 7 end)()\n")
        assert.equal(0, rc)
        assert.same({ "7" }, out)
    end)

    it("at the interactive prompt a command slower than 0.1 s reports its wall time, a fast one does not", function()
        package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
        local R = require "attnlab.repl"
        local written = {}
        local real_write = io.write
        io.write = function(...) for _, s in ipairs({ ... }) do written[#written + 1] = tostring(s) end end -- luacheck: ignore 122
        local ok, err = pcall(function()
            R.run_chunk(function() os.execute("sleep 0.15") end, true, nil, nil, true)
            R.run_chunk(function() end, true, nil, nil, true)
            R.run_chunk(function() os.execute("sleep 0.15") end, true, nil, nil, false)
        end)
        io.write = real_write -- luacheck: ignore 122
        assert(ok, err)
        local text = table.concat(written)
        local n = select(2, text:gsub("%(%d+%.%d+ s%)", ""))
        assert.equal(1, n, text)
    end)

    it("prints expression values without '=' and nothing for statements", function()
        local out, rc = repl("1+1\nx = 3\nx*2\n'a'..'b'\nnil\n")
        assert.same({ "2", "6", "ab", "nil" }, out)
        assert.equal(0, rc)
    end)

    it("a trailing ';' suppresses printing, and _ holds the last value", function()
        local out = repl("y = 21\ny*2;\ny*3\n_ + 1\n")
        assert.same({ "63", "64" }, out)
    end)

    it("prints an error and keeps going, with exit status 1 at the end", function()
        local out, rc = repl("z = 5\nerror('boom')\nz + 1\nz +* 2\nz - 1\n")
        assert.equal("stdin:1: boom", out[1])
        assert.equal("6", out[2])
        assert.truthy(out[3]:find("unexpected symbol", 1, true), out[3])
        assert.equal("4", out[4])
        assert.equal(4, #out)
        assert.equal(1, rc)
    end)

    it("continues incomplete chunks over several lines", function()
        local out = repl("function f(a, b)\n  local s = a * b\n\n  return s + 1\nend\nf(6, 7)\n" ..
                         "t = {\n  p = 1,\n  q = 2,\n}\nt.p + t.q\n")
        assert.same({ "43", "3" }, out)
    end)

    it("prints several values and nested tables", function()
        local out = repl("1, 'two', nil, 4\n{1, 2, k = {a = true}}\n")
        assert.same({ "1\ttwo\tnil\t4", "{1, 2, k = {a = true}}" }, out)
    end)

    it("prints a tensor with its values and a summary line", function()
        local out = repl("t = al.tensor({{1.5, -2.25, 3}, {4, 5, 6}})\nt\n")
        assert.same({ "[[ 1.5000, -2.2500,  3.0000],",
                      " [ 4.0000,  5.0000,  6.0000]]",
                      "[attnlab.Tensor f32 of size 2x3 on cpu]" }, out)
    end)

    it("prints random tensors to 4 decimals, matching the values read back", function()
        local seed = math.random(1, 1000000)
        local out = repl(("al.manual_seed(%d)\nr = al.randn({2, 3})\nr\nr:totable()[2][3]\n"):format(seed))
        assert.equal(4, #out)
        assert.equal("[attnlab.Tensor f32 of size 2x3 on cpu]", out[3])
        local last = tonumber(out[4])
        local printed = {}
        for num in out[2]:gmatch("%-?%d+%.%d+") do printed[#printed + 1] = tonumber(num) end
        assert.equal(3, #printed)
        assert.is_true(math.abs(printed[3] - last) <= 0.5e-4 + 1e-7,
                       ("printed %s, value %s"):format(printed[3], last))
    end)

    it("keeps tensors inside tables to their one-line summary", function()
        local out = repl("{al.zeros({2, 3})}\n")
        assert.equal(1, #out)
        assert.truthy(out[1]:match("^{attnlab%.Tensor f32 %[2,3%] strides=%[3,1%] cpu}$"), out[1])
    end)

    it("?name prints help without failing", function()
        local out, rc = repl("?\n?al.zeros\n1\n")
        assert.equal(0, rc)
        assert.equal("1", out[#out])
        assert.truthy(#out > 2)
    end)
end)

describe("attnlab launcher", function()
    it("runs a script with `al` and `arg`, passing the arguments", function()
        local f = tmpfile("print(arg[0] ~= nil, arg[1], arg[2], select('#', ...), type(al.zeros))\n" ..
                          "print(#al.ones({3}):totable())\n")
        local out, rc = run(sh_quote(launcher) .. " " .. sh_quote(f) .. " a 'b c'")
        os.remove(f)
        assert.same({ "true\ta\tb c\t2\tfunction", "3" }, out)
        assert.equal(0, rc)
    end)

    it("reports a failing script with exit status 1", function()
        local f = tmpfile("local x = 1\nerror('script failed here')\n")
        local out, rc = run(sh_quote(launcher) .. " " .. sh_quote(f))
        os.remove(f)
        assert.equal(1, rc)
        assert.truthy(table.concat(out, "\n"):find("script failed here", 1, true))
    end)

    it("evaluates -e code, printing values", function()
        local out, rc = run(sh_quote(launcher) .. " -e 'v = 20' -e 'v + 2' -e 'v;'")
        assert.same({ "22" }, out)
        assert.equal(0, rc)
        local _, rc2 = run(sh_quote(launcher) .. " -e 'error(\"x\")'")
        assert.equal(1, rc2)
    end)
end)
